import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * A transactional producer against a broker: commit 10 records with an offset sent to the transaction, abort 10,
 * commit 5; then what a read_committed and a read_uncommitted consumer see, the group's committed offset, and
 * what a zombie producer gets once a new instance with the same transactional id started. Prints key=value lines.
 * Arguments: bootstrap, topic, group, transactional id.
 */
public class TransactionalScenario {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1], group = args[2], transactionalId = args[3];
        Properties adminProps = new Properties();
        adminProps.put("bootstrap.servers", bootstrap);
        try (Admin admin = Admin.create(adminProps)) {
            try {
                admin.createTopics(List.of(new NewTopic(topic, 1, (short) 1))).all().get();
            } catch (java.util.concurrent.ExecutionException e) {
                // A test may place the topic itself (on a chosen broker of a cluster).
                if (!(e.getCause() instanceof org.apache.kafka.common.errors.TopicExistsException)) throw e;
            }
            KafkaProducer<String, String> producer = producer(bootstrap, transactionalId);
            producer.initTransactions();
            TopicPartition partition = new TopicPartition(topic, 0);
            producer.beginTransaction();
            send(producer, topic, "commit-a", 10);
            producer.sendOffsetsToTransaction(Map.of(partition, new OffsetAndMetadata(7)), groupMetadata(bootstrap, group));
            producer.commitTransaction();
            producer.beginTransaction();
            send(producer, topic, "abort", 10);
            producer.flush();
            producer.abortTransaction();
            producer.beginTransaction();
            send(producer, topic, "commit-b", 5);
            producer.commitTransaction();
            System.out.println("read_committed=" + String.join(",", read(bootstrap, partition, "read_committed", 15)));
            System.out.println("read_uncommitted=" + read(bootstrap, partition, "read_uncommitted", 25).size());
            Map<TopicPartition, OffsetAndMetadata> offsets =
                admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get();
            System.out.println("group_offset=" + offsets.get(partition).offset());

            // A new instance fences the old one.
            KafkaProducer<String, String> successor = producer(bootstrap, transactionalId);
            successor.initTransactions();
            String zombie;
            try {
                producer.beginTransaction();
                producer.send(new ProducerRecord<>(topic, "zombie")).get();
                producer.commitTransaction();
                zombie = "committed";
            } catch (Exception e) {
                Throwable cause = e.getCause() != null ? e.getCause() : e;
                zombie = cause.getClass().getSimpleName();
            }
            System.out.println("zombie=" + zombie);
            successor.beginTransaction();
            send(successor, topic, "successor", 1);
            successor.commitTransaction();
            successor.close();
            producer.close(Duration.ofSeconds(1));
            List<String> all = read(bootstrap, partition, "read_committed", 16);
            System.out.println("last=" + all.get(all.size() - 1) + " count=" + all.size());
        }
    }

    static KafkaProducer<String, String> producer(String bootstrap, String transactionalId) {
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, transactionalId);
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        props.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "20000");
        return new KafkaProducer<>(props);
    }

    /** The group's metadata as a consumer that has not joined has it (no member id, generation -1). */
    static ConsumerGroupMetadata groupMetadata(String bootstrap, String group) {
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(props)) {
            return consumer.groupMetadata();
        }
    }

    static void send(KafkaProducer<String, String> producer, String topic, String prefix, int count) {
        for (int i = 0; i < count; i++) {
            producer.send(new ProducerRecord<>(topic, prefix + "-" + i));
        }
    }

    static List<String> read(String bootstrap, TopicPartition partition, String isolation, int wanted) {
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation);
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        List<String> values = new ArrayList<>();
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(props)) {
            consumer.assign(List.of(partition));
            consumer.seekToBeginning(List.of(partition));
            long deadline = System.currentTimeMillis() + 20_000;
            while (values.size() < wanted && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<String, String> record : consumer.poll(Duration.ofMillis(200))) {
                    values.add(record.value());
                }
            }
            // Anything beyond what was wanted would show here too.
            for (ConsumerRecord<String, String> record : consumer.poll(Duration.ofMillis(500))) {
                values.add(record.value());
            }
        }
        return values;
    }
}
