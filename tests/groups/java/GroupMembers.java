// What ClassicGroupMember.java and ConsumerGroupMember.java share: their JSON lines, the stdin "close"
// line, the consumer settings both protocols take, and a member's poll-commit-report loop. Compiled with
// each of them (the java_program fixture in tests/conftest.py); in a package so that they can import its
// methods statically.

package groups;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Properties;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.function.Supplier;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;

public final class GroupMembers {
    private GroupMembers() {}

    /** Prints one JSON line (rebalance listeners may print too). */
    public static synchronized void emit(String json) {
        System.out.println(json);
        System.out.flush();
    }

    public static String quoted(String text) {
        return text == null ? "null" : "\"" + text.replace("\\", "\\\\").replace("\"", "\\\"") + "\"";
    }

    /** The partition numbers of {@code assignment}, sorted, as a JSON array. */
    public static String partitions(Collection<TopicPartition> assignment) {
        Set<Integer> sorted = new TreeSet<>();
        for (TopicPartition tp : assignment) {
            sorted.add(tp.partition());
        }
        return sorted.toString().replace(" ", "");
    }

    /** Manual commits from the earliest offset; {@code protocol} is classic or consumer. */
    public static Properties consumerProps(String bootstrap, String group, String protocol, String clientId) {
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        props.put("group.id", group);
        props.put("group.protocol", protocol);
        props.put("client.id", clientId);
        props.put("enable.auto.commit", "false");
        props.put("auto.offset.reset", "earliest");
        return props;
    }

    /** Set once stdin says "close" (or ends): a daemon thread watches it. */
    public static AtomicBoolean closeRequested() {
        AtomicBoolean closing = new AtomicBoolean(false);
        Thread stdin = new Thread(() -> {
            try (BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
                String line;
                while ((line = in.readLine()) != null) {
                    if (line.trim().equals("close")) {
                        closing.set(true);
                    }
                }
            } catch (java.io.IOException e) {
                closing.set(true);
            }
        });
        stdin.setDaemon(true);
        stdin.start();
        return closing;
    }

    /**
     * Polls until {@code closing}: each batch is committed with commitSync and then printed as
     * {"event":"records",...}; each change of assignment is printed as {"event":"assigned","partitions":[...]
     * followed by {@code assignedFields} (JSON fields, each with a leading comma) and "}".
     */
    public static void consume(KafkaConsumer<byte[], byte[]> consumer, AtomicBoolean closing,
                        Supplier<String> assignedFields) {
        String assigned = null;
        while (!closing.get()) {
            ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(100));
            if (!records.isEmpty()) {
                List<String> seen = new ArrayList<>();
                for (ConsumerRecord<byte[], byte[]> record : records) {
                    seen.add("[" + record.partition() + "," + record.offset() + "]");
                }
                try {
                    consumer.commitSync();
                    emit("{\"event\":\"records\",\"records\":[" + String.join(",", seen) + "]}");
                } catch (KafkaException e) {
                    // Not committed, so not counted: the partition's next owner reads them again.
                    emit("{\"event\":\"commit-failed\",\"error\":" + quoted(e.getClass().getSimpleName()) + "}");
                }
            }
            String now = partitions(consumer.assignment());
            if (!now.equals(assigned)) {
                assigned = now;
                emit("{\"event\":\"assigned\",\"partitions\":" + now + assignedFields.get() + "}");
            }
        }
    }
}
