// A Java kafka-clients 4.x consumer using the KIP-848 consumer group protocol (group.protocol=consumer), or
// its Admin, for tests/groups/test_consumer_protocol.py. Prints JSON lines.
//
// Usage: java -cp <kafka-clients 4.x jars>:<classes> ConsumerGroupMember BOOTSTRAP member GROUP TOPIC CLIENT_ID
//          a member: prints {"event":"assigned","partitions":[...]} on each change of assignment and
//          {"event":"records","records":[[partition,offset],...]} for each batch once commitSync has stored
//          it; on the stdin line "close" it closes (leaving the group) and prints {"event":"closed"}.
//        java ... ConsumerGroupMember BOOTSTRAP admin GROUP
//          describeConsumerGroups (ConsumerGroupDescribe) and listGroups for consumer groups, one line each.

import static groups.GroupMembers.emit;
import static groups.GroupMembers.partitions;
import static groups.GroupMembers.quoted;

import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicBoolean;

import groups.GroupMembers;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.GroupListing;
import org.apache.kafka.clients.admin.ListGroupsOptions;
import org.apache.kafka.clients.admin.MemberAssignment;
import org.apache.kafka.clients.admin.MemberDescription;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public final class ConsumerGroupMember {
    private ConsumerGroupMember() {}

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        if (args[1].equals("member")) {
            member(bootstrap, args[2], args[3], args[4]);
        } else {
            admin(bootstrap, args[2]);
        }
    }

    private static void member(String bootstrap, String group, String topic, String clientId) throws Exception {
        Properties props = GroupMembers.consumerProps(bootstrap, group, "consumer", clientId);
        AtomicBoolean closing = GroupMembers.closeRequested();
        try (KafkaConsumer<byte[], byte[]> consumer =
                new KafkaConsumer<>(props, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
            consumer.subscribe(List.of(topic));
            GroupMembers.consume(consumer, closing, () -> "");
        }
        emit("{\"event\":\"closed\"}");
    }

    private static void admin(String bootstrap, String group) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        try (Admin admin = Admin.create(props)) {
            ConsumerGroupDescription description =
                admin.describeConsumerGroups(List.of(group)).all().get().get(group);
            List<String> members = new ArrayList<>();
            for (MemberDescription member : description.members()) {
                MemberAssignment target = member.targetAssignment().orElse(null);
                members.add("{\"clientId\":" + quoted(member.clientId())
                    + ",\"memberEpoch\":" + member.memberEpoch().orElse(-100)
                    + ",\"partitions\":" + partitions(member.assignment().topicPartitions())
                    + ",\"target\":" + (target == null ? "null" : partitions(target.topicPartitions()))
                    + "}");
            }
            emit("{\"event\":\"described\",\"type\":" + quoted(description.type().toString())
                + ",\"state\":" + quoted(description.groupState().toString())
                + ",\"assignor\":" + quoted(description.partitionAssignor())
                + ",\"groupEpoch\":" + description.groupEpoch().orElse(-100)
                + ",\"targetAssignmentEpoch\":" + description.targetAssignmentEpoch().orElse(-100)
                + ",\"members\":[" + String.join(",", members) + "]}");
            List<String> listed = new ArrayList<>();
            for (GroupListing listing : admin.listGroups(ListGroupsOptions.forConsumerGroups()).all().get()) {
                listed.add("{\"groupId\":" + quoted(listing.groupId())
                    + ",\"type\":" + quoted(listing.type().map(Object::toString).orElse(null))
                    + ",\"protocol\":" + quoted(listing.protocol())
                    + ",\"state\":" + quoted(listing.groupState().map(Object::toString).orElse(null)) + "}");
            }
            emit("{\"event\":\"listed\",\"groups\":[" + String.join(",", listed) + "]}");
        }
    }
}
