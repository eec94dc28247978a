// A Java kafka-clients (3.9 or 4.x) consumer using the classic group protocol, or its Admin, for
// tests/groups/test_groups_java.py. Prints JSON lines.
//
// Usage: java ... ClassicGroupMember BOOTSTRAP member GROUP TOPIC CLIENT_ID ASSIGNOR INSTANCE_ID SESSION_MS
//          ASSIGNOR: range | cooperative-sticky; INSTANCE_ID: "-" for a dynamic member.
//          Prints {"event":"assigned","partitions":[...],"generation":n,"t":nanos} on each change of
//          assignment, {"event":"added"|"revoked"|"lost",...} from the rebalance listener, and
//          {"event":"records","records":[[partition,offset],...]} for each batch once commitSync stored it.
//          On the stdin line "close" it closes (leaving the group unless static) and prints {"event":"closed"}.
//        java ... ClassicGroupMember BOOTSTRAP resume GROUP TOPIC COUNT
//          reads COUNT records (from the committed offsets), commits synchronously, closes; prints
//          {"event":"values","values":[...]}.
//        java ... ClassicGroupMember BOOTSTRAP admin GROUP TOPIC ACTION...
//          ACTION: describe | list | offsets | alter:PARTITION:OFFSET | delete-offsets:PARTITION | delete-group
//
// System.nanoTime() reads CLOCK_MONOTONIC on Linux, the clock Python's time.monotonic_ns() reads, so
// events from different processes can be put on one timeline.

import static groups.GroupMembers.emit;
import static groups.GroupMembers.partitions;
import static groups.GroupMembers.quoted;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;

import groups.GroupMembers;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.ConsumerGroupListing;
import org.apache.kafka.clients.admin.MemberDescription;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public final class ClassicGroupMember {
    private static final int TIMEOUT_S = 30;

    private ClassicGroupMember() {}

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        switch (args[1]) {
            case "member":
                member(bootstrap, args[2], args[3], args[4], args[5], args[6], args[7]);
                break;
            case "resume":
                resume(bootstrap, args[2], args[3], Integer.parseInt(args[4]));
                break;
            case "admin":
                admin(bootstrap, args[2], args[3], List.of(args).subList(4, args.length));
                break;
            default:
                throw new IllegalArgumentException("unknown mode " + args[1]);
        }
    }

    private static Properties consumerProps(String bootstrap, String group, String clientId) {
        Properties props = GroupMembers.consumerProps(bootstrap, group, "classic", clientId);
        props.put("heartbeat.interval.ms", "500");
        return props;
    }

    private static void member(String bootstrap, String group, String topic, String clientId, String assignor,
                               String instanceId, String sessionMs) {
        Properties props = consumerProps(bootstrap, group, clientId);
        props.put("session.timeout.ms", sessionMs);
        props.put("partition.assignment.strategy", assignor.equals("cooperative-sticky")
            ? "org.apache.kafka.clients.consumer.CooperativeStickyAssignor"
            : "org.apache.kafka.clients.consumer.RangeAssignor");
        if (!instanceId.equals("-")) {
            props.put("group.instance.id", instanceId);
        }
        AtomicBoolean closing = GroupMembers.closeRequested();
        try (KafkaConsumer<byte[], byte[]> consumer =
                new KafkaConsumer<>(props, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
            consumer.subscribe(List.of(topic), new ConsumerRebalanceListener() {
                private void report(String event, Collection<TopicPartition> changed) {
                    emit("{\"event\":\"" + event + "\",\"partitions\":" + partitions(changed)
                        + ",\"generation\":" + consumer.groupMetadata().generationId()
                        + ",\"t\":" + System.nanoTime() + "}");
                }

                @Override
                public void onPartitionsRevoked(Collection<TopicPartition> revoked) {
                    report("revoked", revoked);
                }

                @Override
                public void onPartitionsAssigned(Collection<TopicPartition> added) {
                    report("added", added);
                }

                @Override
                public void onPartitionsLost(Collection<TopicPartition> lost) {
                    report("lost", lost);
                }
            });
            GroupMembers.consume(consumer, closing, () -> ",\"generation\":" + consumer.groupMetadata().generationId()
                + ",\"memberId\":" + quoted(consumer.groupMetadata().memberId())
                + ",\"t\":" + System.nanoTime());
            emit("{\"event\":\"closing\",\"t\":" + System.nanoTime() + "}");
        }
        emit("{\"event\":\"closed\"}");
    }

    private static void resume(String bootstrap, String group, String topic, int count) {
        Properties props = consumerProps(bootstrap, group, "resumer");
        props.put("session.timeout.ms", "6000");
        List<String> values = new ArrayList<>();
        try (KafkaConsumer<byte[], byte[]> consumer =
                new KafkaConsumer<>(props, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
            consumer.subscribe(List.of(topic));
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
            while (values.size() < count && System.nanoTime() < deadline) {
                for (ConsumerRecord<byte[], byte[]> record : consumer.poll(Duration.ofMillis(100))) {
                    if (values.size() < count) {
                        values.add(new String(record.value(), StandardCharsets.UTF_8));
                        // Commit exactly what was read: the next reader starts right after it.
                        consumer.commitSync(Map.of(new TopicPartition(topic, record.partition()),
                            new OffsetAndMetadata(record.offset() + 1)));
                    }
                }
            }
        }
        emit("{\"event\":\"values\",\"values\":[" + String.join(",", values) + "]}");
    }

    @SuppressWarnings({"deprecation", "removal"}) // state() is deprecated in 4.x (KIP-1043), the only one in 3.9
    private static void admin(String bootstrap, String group, String topic, List<String> actions) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        try (Admin admin = Admin.create(props)) {
            for (String action : actions) {
                String[] parts = action.split(":");
                try {
                    switch (parts[0]) {
                        case "describe": {
                            ConsumerGroupDescription description = admin.describeConsumerGroups(List.of(group))
                                .all().get(TIMEOUT_S, TimeUnit.SECONDS).get(group);
                            List<String> members = new ArrayList<>();
                            for (MemberDescription member : description.members()) {
                                members.add("{\"clientId\":" + quoted(member.clientId())
                                    + ",\"memberId\":" + quoted(member.consumerId())
                                    + ",\"instanceId\":" + quoted(member.groupInstanceId().orElse(null))
                                    + ",\"host\":" + quoted(member.host())
                                    + ",\"partitions\":" + partitions(member.assignment().topicPartitions()) + "}");
                            }
                            emit("{\"event\":\"describe\",\"state\":" + quoted(description.state().toString())
                                + ",\"assignor\":" + quoted(description.partitionAssignor())
                                + ",\"simple\":" + description.isSimpleConsumerGroup()
                                + ",\"members\":[" + String.join(",", members) + "]}");
                            break;
                        }
                        case "list": {
                            List<String> listed = new ArrayList<>();
                            for (ConsumerGroupListing listing : admin.listConsumerGroups().all()
                                    .get(TIMEOUT_S, TimeUnit.SECONDS)) {
                                listed.add("{\"groupId\":" + quoted(listing.groupId())
                                    + ",\"state\":" + quoted(listing.state().map(Object::toString).orElse(null))
                                    + "}");
                            }
                            emit("{\"event\":\"list\",\"groups\":[" + String.join(",", listed) + "]}");
                            break;
                        }
                        case "offsets": {
                            Map<TopicPartition, OffsetAndMetadata> offsets = admin.listConsumerGroupOffsets(group)
                                .partitionsToOffsetAndMetadata().get(TIMEOUT_S, TimeUnit.SECONDS);
                            Map<Integer, String> sorted = new TreeMap<>();
                            for (Map.Entry<TopicPartition, OffsetAndMetadata> entry : offsets.entrySet()) {
                                sorted.put(entry.getKey().partition(), "[" + entry.getKey().partition() + ","
                                    + entry.getValue().offset() + "," + quoted(entry.getValue().metadata()) + "]");
                            }
                            emit("{\"event\":\"offsets\",\"offsets\":[" + String.join(",", sorted.values()) + "]}");
                            break;
                        }
                        case "alter": {
                            TopicPartition tp = new TopicPartition(topic, Integer.parseInt(parts[1]));
                            admin.alterConsumerGroupOffsets(group,
                                Map.of(tp, new OffsetAndMetadata(Long.parseLong(parts[2]), "reset by admin")))
                                .all().get(TIMEOUT_S, TimeUnit.SECONDS);
                            emit("{\"event\":\"alter\"}");
                            break;
                        }
                        case "delete-offsets": {
                            TopicPartition tp = new TopicPartition(topic, Integer.parseInt(parts[1]));
                            admin.deleteConsumerGroupOffsets(group, Set.of(tp)).all().get(TIMEOUT_S, TimeUnit.SECONDS);
                            emit("{\"event\":\"delete-offsets\"}");
                            break;
                        }
                        case "delete-group": {
                            admin.deleteConsumerGroups(List.of(group)).all().get(TIMEOUT_S, TimeUnit.SECONDS);
                            emit("{\"event\":\"delete-group\"}");
                            break;
                        }
                        default:
                            throw new IllegalArgumentException("unknown action " + action);
                    }
                } catch (ExecutionException e) {
                    emit("{\"event\":\"error\",\"action\":" + quoted(parts[0])
                        + ",\"error\":" + quoted(e.getCause().getClass().getSimpleName()) + "}");
                }
            }
        }
    }
}
