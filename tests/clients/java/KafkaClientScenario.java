// What a Java application does with kafka-clients, against a broker, printed as JSON lines for
// tests/clients/test_java_client.py to check exactly. Compiled there against each kafka-clients version.
//
// Usage: java -cp <kafka-clients jars>:<classes> KafkaClientScenario BOOTSTRAP SCENARIO BASE_TIMESTAMP
//   SCENARIO: admin | records | spark | restart (prints "waiting", then reads a line: restart the broker meanwhile)
//   BASE_TIMESTAMP: epoch ms; records are sent with timestamps derived from it so the test knows them.
//
// Every client runs with its default settings (so the producer is idempotent, acks=all) plus the byte-array
// (de)serializers; where a scenario changes a setting it says why. Each line is one JSON object with an
// "event" field; a step that throws prints {"event": "error", ...} and the next step still runs (exit code 1).

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.Collections;
import java.util.Comparator;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;
import java.util.TreeSet;
import java.util.UUID;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.CreateTopicsResult;
import org.apache.kafka.clients.admin.DescribeClusterResult;
import org.apache.kafka.clients.admin.ListOffsetsOptions;
import org.apache.kafka.clients.admin.ListOffsetsResult;
import org.apache.kafka.clients.admin.NewPartitions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.RecordsToDelete;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndTimestamp;
import org.apache.kafka.clients.consumer.OffsetOutOfRangeException;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.IsolationLevel;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class KafkaClientScenario {
    static final List<String> CODECS = List.of("none", "gzip", "snappy", "lz4", "zstd");
    static final List<String> CONFIG_NAMES =
            List.of("cleanup.policy", "retention.ms", "max.message.bytes", "compression.type", "segment.bytes");
    static final int TIMEOUT_S = 20;

    final String bootstrap;
    final long base;
    boolean failed = false;

    KafkaClientScenario(String bootstrap, long base) {
        this.bootstrap = bootstrap;
        this.base = base;
    }

    /** The kafka-clients version, from its jar's kafka-version.properties (AppInfoParser moved in 4.4). */
    static String clientVersion() throws java.io.IOException {
        Properties info = new Properties();
        try (java.io.InputStream in = KafkaProducer.class.getResourceAsStream("/kafka/kafka-version.properties")) {
            info.load(in);
        }
        return info.getProperty("version");
    }

    public static void main(String[] args) throws Exception {
        KafkaClientScenario scenario = new KafkaClientScenario(args[0], Long.parseLong(args[2]));
        emit("event", "client", "version", clientVersion());
        switch (args[1]) {
            case "admin":
                scenario.admin();
                break;
            case "records":
                scenario.records();
                break;
            case "spark":
                scenario.spark();
                break;
            case "restart":
                scenario.restart();
                break;
            default:
                throw new IllegalArgumentException("unknown scenario " + args[1]);
        }
        emit("event", "done");
        System.out.flush();
        System.exit(scenario.failed ? 1 : 0);
    }

    // ---------------------------------------------------------------------------------------- admin

    void admin() {
        try (Admin admin = Admin.create(adminProps())) {
            step("create-topics", () -> {
                NewTopic plain = new NewTopic("admin-a", 3, (short) 1);
                NewTopic configured = new NewTopic("admin-b", Optional.empty(), Optional.empty())
                        .configs(Map.of("retention.ms", "3600000", "cleanup.policy", "compact"));
                CreateTopicsResult created = admin.createTopics(List.of(plain, configured));
                created.all().get(TIMEOUT_S, TimeUnit.SECONDS);
                for (String topic : List.of("admin-a", "admin-b")) {
                    Config config = created.config(topic).get();
                    emit("event", "created", "topic", topic,
                            "partitions", created.numPartitions(topic).get(),
                            "replication", created.replicationFactor(topic).get(),
                            "hasTopicId", !Uuid.ZERO_UUID.equals(created.topicId(topic).get()),
                            "cleanup.policy", config.get("cleanup.policy").value(),
                            "retention.ms", config.get("retention.ms").value());
                }
            });
            step("create-existing-topic", () -> {
                try {
                    admin.createTopics(List.of(new NewTopic("admin-a", 1, (short) 1))).all().get(TIMEOUT_S, TimeUnit.SECONDS);
                    emit("event", "create-existing", "error", null);
                } catch (ExecutionException e) {
                    emit("event", "create-existing", "error", e.getCause().getClass().getSimpleName());
                }
            });
            step("create-invalid-replication", () -> {
                try {
                    admin.createTopics(List.of(new NewTopic("admin-r3", 1, (short) 3))).all().get(TIMEOUT_S, TimeUnit.SECONDS);
                    emit("event", "create-rf3", "error", null);
                } catch (ExecutionException e) {
                    emit("event", "create-rf3", "error", e.getCause().getClass().getSimpleName());
                }
            });
            step("list-topics", () -> emit("event", "topics",
                    "names", new TreeSet<>(admin.listTopics().names().get(TIMEOUT_S, TimeUnit.SECONDS))));
            step("describe-cluster", () -> {
                DescribeClusterResult cluster = admin.describeCluster();
                List<Object> nodes = new ArrayList<>();
                for (Node node : cluster.nodes().get(TIMEOUT_S, TimeUnit.SECONDS)) {
                    nodes.add(List.of(node.id(), node.host() + ":" + node.port()));
                }
                emit("event", "cluster", "nodes", nodes, "controller", cluster.controller().get().id(),
                        "hasClusterId", cluster.clusterId().get() != null);
            });
            step("describe-topics", () -> describeTopics(admin, List.of("admin-a", "admin-b")));
            step("describe-configs", () -> describeConfigs(admin, "before"));
            step("alter-configs", () -> {
                ConfigResource resource = new ConfigResource(ConfigResource.Type.TOPIC, "admin-a");
                AlterConfigOp set = new AlterConfigOp(new ConfigEntry("retention.ms", "86400000"), AlterConfigOp.OpType.SET);
                admin.incrementalAlterConfigs(Map.of(resource, List.of(set))).all().get(TIMEOUT_S, TimeUnit.SECONDS);
                describeConfigs(admin, "after");
            });
            step("create-partitions", () -> {
                admin.createPartitions(Map.of("admin-a", NewPartitions.increaseTo(4))).all().get(TIMEOUT_S, TimeUnit.SECONDS);
                describeTopics(admin, List.of("admin-a"));
            });
            step("produce", () -> {
                // Partition 0: timestamps base, base+10, ..., base+40; partition 1: base, base+10; 2 and 3 empty.
                try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(producerProps())) {
                    List<Future<RecordMetadata>> sent = new ArrayList<>();
                    for (int i = 0; i < 5; i++) sent.add(producer.send(record("admin-a", 0, base + 10L * i, "p0-" + i)));
                    for (int i = 0; i < 2; i++) sent.add(producer.send(record("admin-a", 1, base + 10L * i, "p1-" + i)));
                    for (Future<RecordMetadata> f : sent) emitSent(f.get(TIMEOUT_S, TimeUnit.SECONDS), null);
                }
            });
            step("list-offsets", () -> {
                listOffsets(admin, "earliest", OffsetSpec.earliest());
                listOffsets(admin, "latest", OffsetSpec.latest());
                listOffsets(admin, "max-timestamp", OffsetSpec.maxTimestamp());
                listOffsets(admin, "timestamp=base+15", OffsetSpec.forTimestamp(base + 15));
                listOffsets(admin, "timestamp=base+10", OffsetSpec.forTimestamp(base + 10));
                listOffsets(admin, "timestamp=base+1000", OffsetSpec.forTimestamp(base + 1000));
            });
            step("delete-records", () -> {
                TopicPartition tp = new TopicPartition("admin-a", 0);
                long low = admin.deleteRecords(Map.of(tp, RecordsToDelete.beforeOffset(2))).lowWatermarks().get(tp)
                        .get(TIMEOUT_S, TimeUnit.SECONDS).lowWatermark();
                emit("event", "deleted-records", "lowWatermark", low);
                listOffsets(admin, "earliest-after-delete", OffsetSpec.earliest());
            });
            step("delete-topics", () -> {
                admin.deleteTopics(List.of("admin-a", "admin-b")).all().get(TIMEOUT_S, TimeUnit.SECONDS);
                emit("event", "topics-after-delete",
                        "names", new TreeSet<>(admin.listTopics().names().get(TIMEOUT_S, TimeUnit.SECONDS)));
                try {
                    admin.describeTopics(List.of("admin-a")).allTopicNames().get(TIMEOUT_S, TimeUnit.SECONDS);
                    emit("event", "describe-deleted", "error", null);
                } catch (ExecutionException e) {
                    emit("event", "describe-deleted", "error", e.getCause().getClass().getSimpleName());
                }
            });
        }
    }

    void describeTopics(Admin admin, List<String> topics) throws Exception {
        Map<String, TopicDescription> described = admin.describeTopics(topics).allTopicNames().get(TIMEOUT_S, TimeUnit.SECONDS);
        for (String topic : topics) {
            TopicDescription d = described.get(topic);
            List<Object> partitions = new ArrayList<>();
            for (TopicPartitionInfo p : d.partitions()) {
                partitions.add(List.of(p.partition(), p.leader().id(), ids(p.replicas()), ids(p.isr())));
            }
            emit("event", "topic", "name", d.name(), "internal", d.isInternal(),
                    "hasTopicId", !Uuid.ZERO_UUID.equals(d.topicId()), "partitions", partitions);
        }
    }

    void describeConfigs(Admin admin, String when) throws Exception {
        ConfigResource a = new ConfigResource(ConfigResource.Type.TOPIC, "admin-a");
        ConfigResource b = new ConfigResource(ConfigResource.Type.TOPIC, "admin-b");
        ConfigResource broker = new ConfigResource(ConfigResource.Type.BROKER, "0");
        Map<ConfigResource, Config> configs = admin.describeConfigs(List.of(a, b, broker)).all().get(TIMEOUT_S, TimeUnit.SECONDS);
        for (ConfigResource resource : List.of(a, b)) {
            Map<String, Object> entries = new LinkedHashMap<>();
            for (String name : CONFIG_NAMES) {
                ConfigEntry entry = configs.get(resource).get(name);
                entries.put(name, entry == null ? null : Arrays.asList(entry.value(), entry.source().name()));
            }
            emit("event", "configs", "when", when, "topic", resource.name(), "entries", entries);
        }
        ConfigEntry maxBytes = configs.get(broker).get("message.max.bytes");
        emit("event", "broker-config", "when", when, "message.max.bytes", maxBytes == null ? null : maxBytes.value());
    }

    void listOffsets(Admin admin, String label, OffsetSpec spec) throws Exception {
        Map<TopicPartition, OffsetSpec> request = new LinkedHashMap<>();
        for (int p = 0; p < 4; p++) request.put(new TopicPartition("admin-a", p), spec);
        Map<TopicPartition, ListOffsetsResult.ListOffsetsResultInfo> result =
                admin.listOffsets(request).all().get(TIMEOUT_S, TimeUnit.SECONDS);
        List<Object> rows = new ArrayList<>();
        for (int p = 0; p < 4; p++) {
            ListOffsetsResult.ListOffsetsResultInfo info = result.get(new TopicPartition("admin-a", p));
            rows.add(List.of(p, info.offset(), info.timestamp() < 0 ? -1 : info.timestamp() - base));
        }
        emit("event", "list-offsets", "spec", label, "partitions", rows);
    }

    // -------------------------------------------------------------------------------------- records

    void records() {
        try (Admin admin = Admin.create(adminProps())) {
            step("create-topics", () -> {
                List<NewTopic> topics = new ArrayList<>();
                for (String codec : CODECS) topics.add(new NewTopic("codec-" + codec, 3, (short) 1));
                for (String name : List.of("large", "tail", "timed")) topics.add(new NewTopic(name, 1, (short) 1));
                admin.createTopics(topics).all().get(TIMEOUT_S, TimeUnit.SECONDS);
            });
        }
        step("produce-every-codec", () -> {
            for (String codec : CODECS) {
                Properties props = producerProps();
                props.put("compression.type", codec);
                try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
                    List<Future<RecordMetadata>> sent = new ArrayList<>();
                    List<String> keys = new ArrayList<>();
                    for (int i = 0; i < 30; i++) {
                        String key = "key-" + (i % 7);
                        ProducerRecord<byte[], byte[]> r = new ProducerRecord<>("codec-" + codec, null, base + i,
                                bytes(key), bytes(codec + " value " + i + " " + ".".repeat(100)));
                        r.headers().add(new RecordHeader("codec", bytes(codec)));
                        r.headers().add(new RecordHeader("index", bytes(Integer.toString(i))));
                        r.headers().add(new RecordHeader("nothing", null));
                        sent.add(producer.send(r));
                        keys.add(key);
                    }
                    producer.flush();
                    for (int i = 0; i < sent.size(); i++) emitSent(sent.get(i).get(TIMEOUT_S, TimeUnit.SECONDS), keys.get(i));
                }
            }
        });
        step("consume-every-codec", () -> {
            try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(consumerProps())) {
                List<TopicPartition> assignment = new ArrayList<>();
                for (String codec : CODECS) for (int p = 0; p < 3; p++) assignment.add(new TopicPartition("codec-" + codec, p));
                consumer.assign(assignment);
                consumer.seekToBeginning(assignment);
                for (ConsumerRecord<byte[], byte[]> r : pollUntil(consumer, 150)) emitRecord(r, false);
            }
        });
        step("large-record", () -> {
            // 900 KB fits the defaults: max.request.size and max.partition.fetch.bytes are 1 MiB, as is the
            // broker's message.max.bytes (1048588), so a Java user changes nothing for it.
            byte[] large = pattern(900 * 1024);
            try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(producerProps())) {
                Future<RecordMetadata> big = producer.send(new ProducerRecord<>("large", 0, base, bytes("big"), large));
                Future<RecordMetadata> small = producer.send(new ProducerRecord<>("large", 0, base + 1, bytes("small"), bytes("after")));
                emitSent(big.get(TIMEOUT_S, TimeUnit.SECONDS), "big");
                emitSent(small.get(TIMEOUT_S, TimeUnit.SECONDS), "small");
            }
            // Above message.max.bytes: the user raises max.request.size so the client sends it, the broker refuses.
            Properties props = producerProps();
            props.put("max.request.size", "2097152");
            try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
                try {
                    byte[] huge = pattern(1100 * 1024);
                    RecordMetadata m = producer.send(new ProducerRecord<>("large", 0, base + 2, bytes("huge"), huge))
                            .get(TIMEOUT_S, TimeUnit.SECONDS);
                    emit("event", "too-large", "error", null, "offset", m.offset());
                } catch (ExecutionException e) {
                    emit("event", "too-large", "error", e.getCause().getClass().getSimpleName());
                }
            }
            for (String fetchBytes : List.of("default", "65536")) {
                Properties cprops = consumerProps();
                if (!fetchBytes.equals("default")) {
                    // Smaller than the record: the broker must still return the first batch (KIP-74).
                    cprops.put("max.partition.fetch.bytes", fetchBytes);
                    cprops.put("fetch.max.bytes", fetchBytes);
                }
                try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(cprops)) {
                    TopicPartition tp = new TopicPartition("large", 0);
                    consumer.assign(List.of(tp));
                    consumer.seekToBeginning(List.of(tp));
                    for (ConsumerRecord<byte[], byte[]> r : pollUntil(consumer, 2)) {
                        emit("event", "large-record", "fetchBytes", fetchBytes, "offset", r.offset(), "key", str(r.key()),
                                "length", r.value().length, "intact", Arrays.equals(r.value(), pattern(r.value().length)),
                                "sha256", sha256(r.value()));
                    }
                    emit("event", "large-position", "fetchBytes", fetchBytes, "position", consumer.position(tp));
                }
            }
        });
        step("consume-from-end", () -> {
            TopicPartition tp = new TopicPartition("tail", 0);
            try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(producerProps());
                 KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(consumerProps())) {
                for (int i = 0; i < 3; i++) producer.send(record("tail", 0, base + i, "old-" + i));
                producer.flush();
                consumer.assign(List.of(tp));
                consumer.seekToEnd(List.of(tp));
                emit("event", "tail-position", "when", "after-seek-to-end", "position", consumer.position(tp));
                ConsumerRecords<byte[], byte[]> none = consumer.poll(Duration.ofMillis(300));
                emit("event", "tail-empty-poll", "count", none.count());
                for (int i = 0; i < 2; i++) producer.send(record("tail", 0, base + 3 + i, "new-" + i));
                producer.flush();
                for (ConsumerRecord<byte[], byte[]> r : pollUntil(consumer, 2)) emitRecord(r, true);
                emit("event", "tail-position", "when", "after-poll", "position", consumer.position(tp));
            }
        });
        step("consume-from-timestamp", () -> {
            TopicPartition tp = new TopicPartition("timed", 0);
            try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(producerProps())) {
                for (int i = 0; i < 6; i++) producer.send(record("timed", 0, base + 1000L * i, "timed-" + i));
                producer.flush();
            }
            try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(consumerProps())) {
                consumer.assign(List.of(tp));
                for (long delta : List.of(0L, 1000L, 2500L, 5000L, 5001L)) {
                    OffsetAndTimestamp found = consumer.offsetsForTimes(Map.of(tp, base + delta)).get(tp);
                    emit("event", "offset-for-time", "delta", delta,
                            "offset", found == null ? null : found.offset(),
                            "timestamp", found == null ? null : found.timestamp() - base);
                }
                emit("event", "timed-range", "beginning", consumer.beginningOffsets(List.of(tp)).get(tp),
                        "end", consumer.endOffsets(List.of(tp)).get(tp));
                consumer.seek(tp, consumer.offsetsForTimes(Map.of(tp, base + 2500)).get(tp).offset());
                for (ConsumerRecord<byte[], byte[]> r : pollUntil(consumer, 3)) emitRecord(r, true);
            }
        });
    }

    // -------------------------------------------------------------------------------------- restart

    // An idempotent producer and a consumer that stay open while the broker restarts (the test restarts it
    // between "waiting" and the line it then writes to stdin): both reconnect and carry on where they were.
    void restart() throws Exception {
        TopicPartition tp = new TopicPartition("durable", 0);
        try (Admin admin = Admin.create(adminProps())) {
            step("create-topic", () -> admin.createTopics(List.of(new NewTopic("durable", 1, (short) 1))).all()
                    .get(TIMEOUT_S, TimeUnit.SECONDS));
        }
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(producerProps());
             KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(consumerProps())) {
            step("before-restart", () -> {
                List<Future<RecordMetadata>> sent = new ArrayList<>();
                for (int i = 0; i < 5; i++) sent.add(producer.send(record("durable", 0, base + i, "before-" + i)));
                for (Future<RecordMetadata> f : sent) emitSent(f.get(TIMEOUT_S, TimeUnit.SECONDS), null);
                consumer.assign(List.of(tp));
                consumer.seekToBeginning(List.of(tp));
                for (ConsumerRecord<byte[], byte[]> r : pollUntil(consumer, 5)) emitRecord(r, true);
            });
            emit("event", "waiting");
            new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8)).readLine();
            step("after-restart", () -> {
                List<Future<RecordMetadata>> sent = new ArrayList<>();
                for (int i = 0; i < 5; i++) sent.add(producer.send(record("durable", 0, base + 5 + i, "after-" + i)));
                for (Future<RecordMetadata> f : sent) emitSent(f.get(TIMEOUT_S, TimeUnit.SECONDS), null);
                // A new producer gets a new producer id: its sequence numbers start again at 0.
                try (KafkaProducer<byte[], byte[]> fresh = new KafkaProducer<>(producerProps())) {
                    sent.clear();
                    for (int i = 0; i < 3; i++) sent.add(fresh.send(record("durable", 0, base + 10 + i, "fresh-" + i)));
                    for (Future<RecordMetadata> f : sent) emitSent(f.get(TIMEOUT_S, TimeUnit.SECONDS), null);
                }
                for (ConsumerRecord<byte[], byte[]> r : pollUntil(consumer, 8)) emitRecord(r, true);
                emit("event", "position", "position", consumer.position(tp));
            });
        }
        step("read-all-again", () -> {
            try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(consumerProps())) {
                consumer.assign(List.of(tp));
                consumer.seekToBeginning(List.of(tp));
                List<Object> values = new ArrayList<>();
                for (ConsumerRecord<byte[], byte[]> r : pollUntil(consumer, 13)) values.add(List.of(r.offset(), str(r.value())));
                emit("event", "all", "records", values, "end", consumer.endOffsets(List.of(tp)).get(tp));
            }
        });
    }

    // ---------------------------------------------------------------------------------------- spark

    // The calls Spark's Kafka source (driver: ConsumerStrategy and KafkaOffsetReaderAdmin; executors:
    // InternalKafkaConsumer) and sink (KafkaWriteTask) make, with the settings Spark adds to the user's
    // (KafkaSourceProvider.kafkaParamsForDriver/ForExecutors/ForProducer). Two micro-batches: the sink writes
    // 20 keyed records, the driver lists partitions and offsets, the executors read each partition's range.
    void spark() {
        String topic = "spark";
        String sinkTopic = "spark-sink";
        try (Admin admin = Admin.create(adminProps())) {
            step("create-topic", () -> admin.createTopics(List.of(new NewTopic(topic, 2, (short) 1),
                    new NewTopic(sinkTopic, 2, (short) 1))).all().get(TIMEOUT_S, TimeUnit.SECONDS));
        }
        Properties driver = consumerProps();  // kafkaParamsForDriver, given to Admin.create as they are
        driver.put("auto.offset.reset", "earliest");
        driver.put("max.poll.records", "1");
        driver.put("receive.buffer.bytes", "65536");
        Properties executor = consumerProps();  // kafkaParamsForExecutors
        executor.put("auto.offset.reset", "none");
        executor.put("receive.buffer.bytes", "65536");
        // Spark sets a group.id on executors; with assign() and explicit seeks the consumer never uses it.
        executor.put("group.id", "spark-kafka-source-" + UUID.randomUUID() + "-executor");
        Properties small = (Properties) executor.clone();
        small.put("max.poll.records", "4");  // a user's kafka.max.poll.records: several polls per range
        Properties sink = new Properties();  // kafkaParamsForProducer: the serializers, else the defaults
        sink.put("bootstrap.servers", bootstrap);
        sink.put("key.serializer", ByteArraySerializer.class.getName());
        sink.put("value.serializer", ByteArraySerializer.class.getName());
        // The driver lists offsets with the user's kafka.isolation.level (read_uncommitted by default).
        ListOffsetsOptions readUncommitted = new ListOffsetsOptions(IsolationLevel.READ_UNCOMMITTED);
        ListOffsetsOptions readCommitted = new ListOffsetsOptions(IsolationLevel.READ_COMMITTED);

        // The executors' consumer pool: one consumer per (group id, partition), assigned that partition alone.
        Map<String, KafkaConsumer<byte[], byte[]>> pool = new LinkedHashMap<>();
        try (Admin admin = Admin.create(driver);
             KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(sink)) {
            Map<TopicPartition, Long> previousLatest = new HashMap<>();
            long[] boundary = {-1};
            for (int batch = 0; batch < 2; batch++) {
                final int b = batch;
                step("sink-batch-" + b, () -> {
                    if (b == 1) {  // a time strictly between the two batches' records
                        Thread.sleep(5);
                        boundary[0] = System.currentTimeMillis();
                        Thread.sleep(5);
                    }
                    // KafkaWriteTask: send(record, callback) with no partition and no timestamp, then flush().
                    List<ProducerRecord<byte[], byte[]>> records = new ArrayList<>();
                    for (int i = 0; i < 20; i++) {
                        int n = 20 * b + i;
                        List<Header> headers = List.of(new RecordHeader("n", bytes(Integer.toString(n))));
                        records.add(new ProducerRecord<>(topic, null, null, bytes("k" + n), bytes("v" + n), headers));
                    }
                    sinkWrite(producer, records);
                });
                step("driver-batch-" + b, () -> {
                    // ConsumerStrategy.assignedTopicPartitions (subscribe: describeTopics, internal topics left
                    // out), then fetchEarliestOffsets / fetchLatestOffsets.
                    Set<TopicPartition> partitions = describedPartitions(admin, List.of(topic));
                    emit("event", "spark-partitions", "batch", b, "partitions", partitionIds(partitions));
                    Map<TopicPartition, Long> earliest = offsets(admin, partitions, OffsetSpec.earliest(), readUncommitted);
                    Map<TopicPartition, Long> latest = offsets(admin, partitions, OffsetSpec.latest(), readUncommitted);
                    emit("event", "spark-offsets", "batch", b, "spec", "earliest", "offsets", byPartition(earliest));
                    emit("event", "spark-offsets", "batch", b, "spec", "latest", "offsets", byPartition(latest));
                    if (b == 0) {
                        // subscribePattern: listTopics (internal topics not listed), the matches described.
                        List<String> matching = new ArrayList<>();
                        for (String name : new TreeSet<>(admin.listTopics().names().get(TIMEOUT_S, TimeUnit.SECONDS))) {
                            if (name.matches("spark.*")) matching.add(name);
                        }
                        Set<TopicPartition> matched = describedPartitions(admin, matching);
                        List<Object> names = new ArrayList<>();
                        for (TopicPartition tp : matched) names.add(tp.topic() + "-" + tp.partition());
                        emit("event", "spark-pattern", "topics", matching, "partitions", names);
                    }
                    if (b == 1) {
                        // startingOffsetsByTimestamp / startingTimestamp.
                        Map<TopicPartition, Long> byTime =
                                offsets(admin, partitions, OffsetSpec.forTimestamp(boundary[0]), readUncommitted);
                        emit("event", "spark-offsets", "batch", b, "spec", "timestamp", "offsets", byPartition(byTime));
                        // kafka.isolation.level=read_committed.
                        Map<TopicPartition, Long> committed = offsets(admin, partitions, OffsetSpec.latest(), readCommitted);
                        emit("event", "spark-offsets", "batch", b, "spec", "latest-read-committed",
                                "offsets", byPartition(committed));
                        // Per-partition JSON with -2/-1 (fetchSpecificOffsets0): one request, mixed specs.
                        Map<TopicPartition, OffsetSpec> mixed = new HashMap<>();
                        mixed.put(new TopicPartition(topic, 0), OffsetSpec.earliest());
                        mixed.put(new TopicPartition(topic, 1), OffsetSpec.latest());
                        emit("event", "spark-offsets", "batch", b, "spec", "earliest-0-latest-1",
                                "offsets", byPartition(offsets(admin, mixed, readUncommitted)));
                    }
                    // Executor tasks: each reads [from, until) of one partition; the first batch skips offset 0.
                    for (TopicPartition tp : partitions) {
                        long from = b == 0 ? earliest.get(tp) + 1 : previousLatest.get(tp);
                        readRange(pool, b == 0 ? executor : small, tp, from, latest.get(tp), b, Integer.MAX_VALUE);
                    }
                    previousLatest.putAll(latest);
                });
            }
            step("executor-beyond-end", () -> {
                // A range past the end (data not there yet): the poll comes back empty, and the available
                // range tells Spark the offset is out of range.
                TopicPartition tp = new TopicPartition(topic, 0);
                long end = previousLatest.get(tp);
                readRange(pool, executor, tp, end, end + 1, 2, 1);
            });
            step("executor-data-loss", () -> {
                // Records gone before a task reads them (retention, DeleteRecords): with auto.offset.reset=none
                // the poll throws OffsetOutOfRangeException; with failOnDataLoss=false Spark goes on from the
                // earliest available offset (getEarliestAvailableOffsetBetween), on a fresh consumer.
                TopicPartition tp = new TopicPartition(topic, 0);
                try (Admin plain = Admin.create(adminProps())) {
                    plain.deleteRecords(Map.of(tp, RecordsToDelete.beforeOffset(2))).all().get(TIMEOUT_S, TimeUnit.SECONDS);
                }
                try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(executor)) {
                    consumer.assign(List.of(tp));
                    consumer.seek(tp, 0);
                    Object error = null;
                    Object outOfRange = null;
                    long deadline = System.currentTimeMillis() + TIMEOUT_S * 1000L;
                    while (error == null && System.currentTimeMillis() < deadline) {
                        try {
                            if (!consumer.poll(Duration.ofMillis(200)).isEmpty()) error = "records";
                        } catch (OffsetOutOfRangeException e) {
                            error = e.getClass().getSimpleName();
                            outOfRange = byPartition(e.offsetOutOfRangePartitions());
                        }
                    }
                    consumer.seekToBeginning(List.of(tp));
                    long earliest = consumer.position(tp);
                    consumer.seekToEnd(List.of(tp));
                    long latest = consumer.position(tp);
                    consumer.seek(tp, earliest);
                    List<ConsumerRecord<byte[], byte[]>> fetched = List.of();
                    while (fetched.isEmpty() && System.currentTimeMillis() < deadline) {
                        fetched = consumer.poll(Duration.ofMillis(200)).records(tp);
                    }
                    emit("event", "spark-data-loss", "error", error, "offsets", outOfRange, "range",
                            List.of(earliest, latest), "resumedAt", fetched.isEmpty() ? null : fetched.get(0).offset());
                }
            });
            step("sink-columns", () -> {
                // The sink's optional columns: partition and timestamp set, a null key, no headers.
                sinkWrite(producer, List.of(
                        new ProducerRecord<>(sinkTopic, 1, base + 100, null, bytes("e0")),
                        new ProducerRecord<>(sinkTopic, 0, base + 200, bytes("e1"), bytes("e1"),
                                List.of(new RecordHeader("h", bytes("1")))),
                        new ProducerRecord<>(sinkTopic, 1, base + 300, bytes("e2"), bytes("e2"))));
                for (int p = 0; p < 2; p++) {
                    TopicPartition tp = new TopicPartition(sinkTopic, p);
                    readRange(pool, executor, tp, 0, p == 0 ? 1 : 2, 3, Integer.MAX_VALUE);
                }
            });
        } finally {
            for (KafkaConsumer<byte[], byte[]> consumer : pool.values()) consumer.close();
        }
    }

    // KafkaWriteTask.execute and close: send each record with a callback, then flush() and check for errors.
    void sinkWrite(KafkaProducer<byte[], byte[]> producer, List<ProducerRecord<byte[], byte[]>> records) throws Exception {
        List<Object[]> acked = Collections.synchronizedList(new ArrayList<>());
        List<Exception> failures = Collections.synchronizedList(new ArrayList<>());
        for (ProducerRecord<byte[], byte[]> r : records) {
            producer.send(r, (m, e) -> {
                if (e != null) failures.add(e);
                else acked.add(new Object[] {m, str(r.key())});
            });
        }
        producer.flush();
        if (!failures.isEmpty()) throw failures.get(0);
        for (Object[] a : acked) emitSent((RecordMetadata) a[0], (String) a[1]);
    }

    Set<TopicPartition> describedPartitions(Admin admin, Collection<String> topics) throws Exception {
        Set<TopicPartition> partitions = partitionSet();
        for (TopicDescription d : admin.describeTopics(topics).allTopicNames().get(TIMEOUT_S, TimeUnit.SECONDS).values()) {
            if (d.isInternal()) continue;
            for (TopicPartitionInfo p : d.partitions()) partitions.add(new TopicPartition(d.name(), p.partition()));
        }
        return partitions;
    }

    // InternalKafkaConsumer.fetch (Spark 3.2 on, SPARK-34187): seek to the wanted offset, poll, position(),
    // then the available offset range (seekToBeginning, position, seekToEnd, position) after every poll: it
    // tells an offset that is gone or not there yet (data loss, OffsetOutOfRange) from a poll that timed out.
    void readRange(Map<String, KafkaConsumer<byte[], byte[]>> pool, Properties props, TopicPartition tp, long from,
            long until, int batch, int maxPolls) {
        KafkaConsumer<byte[], byte[]> consumer = pool.computeIfAbsent(
                props.getProperty("max.poll.records", "default") + "/" + tp, key -> {
                    KafkaConsumer<byte[], byte[]> created = new KafkaConsumer<>(props);
                    created.assign(List.of(tp));
                    return created;
                });
        List<Object> offsets = new ArrayList<>();
        List<Object> polls = new ArrayList<>();
        Set<List<Long>> ranges = new TreeSet<>(Comparator.comparing((List<Long> r) -> r.get(0)).thenComparing(r -> r.get(1)));
        long next = from;
        long deadline = System.currentTimeMillis() + TIMEOUT_S * 1000L;
        while (next < until && polls.size() < maxPolls && System.currentTimeMillis() < deadline) {
            consumer.seek(tp, next);
            List<ConsumerRecord<byte[], byte[]>> fetched = consumer.poll(Duration.ofMillis(512)).records(tp);
            long afterPoll = consumer.position(tp);
            consumer.seekToBeginning(List.of(tp));
            long earliest = consumer.position(tp);
            consumer.seekToEnd(List.of(tp));
            long latest = consumer.position(tp);
            polls.add(List.of(next, fetched.size(), afterPoll));
            ranges.add(List.of(earliest, latest));
            for (ConsumerRecord<byte[], byte[]> r : fetched) {
                if (r.offset() >= until) break;
                if (r.offset() != next) throw new IllegalStateException("wanted offset " + next + ", got " + r.offset());
                emitRecord(r, batch != 3);
                offsets.add(r.offset());
                next = r.offset() + 1;
            }
        }
        emit("event", "spark-task", "batch", batch, "topic", tp.topic(), "partition", tp.partition(), "from", from,
                "until", until, "offsets", offsets, "polls", polls, "ranges", new ArrayList<>(ranges));
    }

    Map<TopicPartition, Long> offsets(Admin admin, Collection<TopicPartition> tps, OffsetSpec spec, ListOffsetsOptions options)
            throws Exception {
        Map<TopicPartition, OffsetSpec> request = new HashMap<>();
        for (TopicPartition tp : tps) request.put(tp, spec);
        return offsets(admin, request, options);
    }

    Map<TopicPartition, Long> offsets(Admin admin, Map<TopicPartition, OffsetSpec> request, ListOffsetsOptions options)
            throws Exception {
        Map<TopicPartition, Long> out = new HashMap<>();
        for (Map.Entry<TopicPartition, ListOffsetsResult.ListOffsetsResultInfo> e :
                admin.listOffsets(request, options).all().get(TIMEOUT_S, TimeUnit.SECONDS).entrySet()) {
            out.put(e.getKey(), e.getValue().offset());
        }
        return out;
    }

    static Map<String, Object> byPartition(Map<TopicPartition, Long> offsets) {
        Map<String, Object> out = new java.util.TreeMap<>();
        for (Map.Entry<TopicPartition, Long> e : offsets.entrySet()) {
            out.put(Integer.toString(e.getKey().partition()), e.getValue());
        }
        return out;
    }

    static List<Object> partitionIds(Collection<TopicPartition> tps) {
        List<Object> out = new ArrayList<>();
        for (TopicPartition tp : tps) out.add(tp.partition());
        return out;
    }

    static Set<TopicPartition> partitionSet() {
        return new TreeSet<>(Comparator.comparing(TopicPartition::topic).thenComparingInt(TopicPartition::partition));
    }

    // -------------------------------------------------------------------------------------- helpers

    interface Step {
        void run() throws Exception;
    }

    void step(String name, Step body) {
        try {
            body.run();
        } catch (Throwable t) {
            failed = true;
            Throwable cause = t instanceof ExecutionException && t.getCause() != null ? t.getCause() : t;
            emit("event", "error", "step", name, "error", cause.getClass().getName(),
                    "message", String.valueOf(cause.getMessage()));
            t.printStackTrace();
        }
    }

    Properties adminProps() {
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        return props;
    }

    Properties producerProps() {
        Properties props = adminProps();
        props.put("key.serializer", ByteArraySerializer.class.getName());
        props.put("value.serializer", ByteArraySerializer.class.getName());
        return props;
    }

    Properties consumerProps() {
        Properties props = adminProps();
        props.put("key.deserializer", ByteArrayDeserializer.class.getName());
        props.put("value.deserializer", ByteArrayDeserializer.class.getName());
        props.put("enable.auto.commit", "false");  // no group.id: assign() and seek(), no committed offsets
        return props;
    }

    ProducerRecord<byte[], byte[]> record(String topic, int partition, long timestamp, String value) {
        return new ProducerRecord<>(topic, partition, timestamp, null, bytes(value));
    }

    List<ConsumerRecord<byte[], byte[]>> pollUntil(KafkaConsumer<byte[], byte[]> consumer, int count) {
        List<ConsumerRecord<byte[], byte[]>> out = new ArrayList<>();
        long deadline = System.currentTimeMillis() + TIMEOUT_S * 1000L;
        while (out.size() < count && System.currentTimeMillis() < deadline) {
            for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(200))) out.add(r);
        }
        if (out.size() != count) emit("event", "poll-count", "wanted", count, "got", out.size());
        return out;
    }

    void emitSent(RecordMetadata m, String key) {
        emit("event", "sent", "topic", m.topic(), "partition", m.partition(), "offset", m.offset(),
                "timestamp", m.timestamp() - base, "key", key);
    }

    void emitRecord(ConsumerRecord<byte[], byte[]> r, boolean brief) {
        List<Object> headers = new ArrayList<>();
        for (Header h : r.headers()) headers.add(Arrays.asList(h.key(), str(h.value())));
        if (brief) {
            emit("event", "record", "topic", r.topic(), "partition", r.partition(), "offset", r.offset(),
                    "key", str(r.key()), "value", str(r.value()), "headers", headers);
        } else {
            emit("event", "record", "topic", r.topic(), "partition", r.partition(), "offset", r.offset(),
                    "timestamp", r.timestamp() - base, "timestampType", r.timestampType().name(),
                    "key", str(r.key()), "value", str(r.value()), "headers", headers,
                    "leaderEpoch", r.leaderEpoch().orElse(-1));
        }
    }

    static List<Object> ids(List<Node> nodes) {
        List<Object> out = new ArrayList<>();
        for (Node n : nodes) out.add(n.id());
        return out;
    }

    static byte[] bytes(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    static String str(byte[] b) {
        return b == null ? null : new String(b, StandardCharsets.UTF_8);
    }

    static byte[] pattern(int length) {
        byte[] out = new byte[length];
        for (int i = 0; i < length; i++) out[i] = (byte) (i % 251);
        return out;
    }

    static String sha256(byte[] data) throws Exception {
        StringBuilder out = new StringBuilder();
        for (byte b : MessageDigest.getInstance("SHA-256").digest(data)) out.append(String.format("%02x", b));
        return out.toString();
    }

    // ----------------------------------------------------------------------------------------- JSON

    static synchronized void emit(Object... pairs) {
        Map<String, Object> line = new LinkedHashMap<>();
        for (int i = 0; i < pairs.length; i += 2) line.put((String) pairs[i], pairs[i + 1]);
        System.out.println(Json.write(line));
        System.out.flush();
    }
}
