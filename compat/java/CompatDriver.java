// The compat suite's Java client: kafka-clients driven over JSON lines, the protocol of
// compat/clients/runner.py (operations as in compat/clients/api.py). Compiled against each kafka-clients
// version by compat/java/__init__.py.
//
// Usage: java -cp <kafka-clients jars>:<classes> CompatDriver BOOTSTRAP
//   stdin:  {"id": 1, "op": "producer_open", "args": {...}} per line
//   stdout: {"ready": {"version": "3.9.0"}}, then {"id": 1, "result": ...} or {"id": 1, "error": {...}}
//
// Clients run with their defaults (idempotent producer, acks=all) plus the byte-array (de)serializers;
// a setting is changed only where the request asks. Errors are named by Kafka's error code
// (org.apache.kafka.common.protocol.Errors) when the exception maps to one.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.TreeSet;
import java.util.UUID;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.NewPartitions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.ProducerState;
import org.apache.kafka.clients.admin.TransactionListing;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndTimestamp;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.protocol.Errors;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class CompatDriver {
    static final int TIMEOUT_S = 60;

    /** An error the client reported, by Kafka's name. */
    static final class ClientError extends Exception {
        private static final long serialVersionUID = 1L;
        final String error;

        ClientError(String error, String message) {
            super(message);
            this.error = error;
        }
    }

    final String bootstrap;
    final Map<Integer, Object> handles = new HashMap<>();
    int lastHandle = 0;
    Admin admin;

    /** The suite's security settings (compat/clients/api.py), from KBROKER_COMPAT_SECURITY; empty for plaintext. */
    final Map<String, Object> security;

    CompatDriver(String bootstrap) {
        this.bootstrap = bootstrap;
        String json = System.getenv("KBROKER_COMPAT_SECURITY");
        this.security = json == null || json.isBlank() ? Map.of() : Json.object(Json.parse(json));
    }

    /** The client properties every producer, consumer and admin client starts from: bootstrap and security. */
    Properties connection() {
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        if (security.get("security_protocol") != null) props.put("security.protocol", security.get("security_protocol"));
        if (security.get("sasl_mechanism") != null) {
            String mechanism = (String) security.get("sasl_mechanism");
            String module = mechanism.equals("PLAIN") ? "org.apache.kafka.common.security.plain.PlainLoginModule"
                    : "org.apache.kafka.common.security.scram.ScramLoginModule";
            props.put("sasl.mechanism", mechanism);
            props.put("sasl.jaas.config", module + " required username=\"" + security.get("sasl_username")
                    + "\" password=\"" + security.get("sasl_password") + "\";");
        }
        if (security.get("ssl_cafile") != null) {
            props.put("ssl.truststore.type", "PEM");
            props.put("ssl.truststore.location", security.get("ssl_cafile"));
        }
        if (security.get("ssl_certfile") != null) {
            try {
                props.put("ssl.keystore.type", "PEM");
                props.put("ssl.keystore.certificate.chain", java.nio.file.Files.readString(java.nio.file.Path.of((String) security.get("ssl_certfile"))));
                props.put("ssl.keystore.key", java.nio.file.Files.readString(java.nio.file.Path.of((String) security.get("ssl_keyfile"))));
            } catch (java.io.IOException e) {
                throw new java.io.UncheckedIOException(e);
            }
        }
        return props;
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
        // stdout carries only the protocol; anything else printed goes to stderr.
        PrintStream protocol = new PrintStream(System.out, true, StandardCharsets.UTF_8);
        System.setOut(System.err);
        CompatDriver driver = new CompatDriver(args[0]);
        protocol.println(Json.write(Map.of("ready", Map.of("version", clientVersion()))));
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isBlank()) continue;
            Map<String, Object> request = Json.object(Json.parse(line));
            Map<String, Object> reply = new LinkedHashMap<>();
            reply.put("id", request.get("id"));
            try {
                Map<String, Object> arguments = Json.object(request.getOrDefault("args", Map.of()));
                reply.put("result", driver.call((String) request.get("op"), arguments));
            } catch (UnsupportedOperationException e) {
                reply.put("error", error("unsupported", "", e.getMessage()));
            } catch (ClientError e) {
                reply.put("error", error("client", e.error, e.getMessage()));
            } catch (Exception e) {
                java.io.StringWriter trace = new java.io.StringWriter();
                e.printStackTrace(new java.io.PrintWriter(trace));
                reply.put("error", error("exception", e.getClass().getSimpleName(), trace.toString()));
            }
            protocol.println(Json.write(reply));
        }
        driver.shutdown();
        System.exit(0);
    }

    static Map<String, Object> error(String kind, String error, String message) {
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("kind", kind);
        out.put("error", error);
        out.put("message", message == null ? "" : message);
        return out;
    }

    /** Kafka's name for what went wrong: the error code an exception stands for, else its class name. */
    static ClientError clientError(Throwable e) {
        Throwable cause = (e instanceof ExecutionException && e.getCause() != null) ? e.getCause() : e;
        Errors code = Errors.forException(cause);
        String name = code == Errors.UNKNOWN_SERVER_ERROR ? cause.getClass().getSimpleName() : code.name();
        return new ClientError(name, String.valueOf(cause.getMessage()));
    }

    Object call(String op, Map<String, Object> a) throws Exception {
        try {
            switch (op) {
                case "create_topic": return createTopic(str(a, "topic"), num(a, "partitions").intValue(), strings(a.get("configs")));
                case "delete_topic": return deleteTopic(str(a, "topic"));
                case "list_topics": return listTopics();
                case "describe_topic": return describeTopic(str(a, "topic"));
                case "create_partitions": return createPartitions(str(a, "topic"), num(a, "total").intValue());
                case "describe_configs": return describeConfigs(str(a, "topic"), Json.list(a.get("names")));
                case "alter_configs": return alterConfigs(str(a, "topic"), strings(a.get("configs")));
                case "producer_open": return producerOpen(Json.object(a.get("settings")));
                case "producer_send": return producerSend(num(a, "handle").intValue(), str(a, "topic"), Json.list(a.get("records")));
                case "producer_close": return producerClose(num(a, "handle").intValue());
                case "txn_producer_open": return txnProducerOpen(str(a, "transactional_id"), Json.object(a.get("settings")));
                case "txn_begin": return txn(a, p -> p.beginTransaction());
                case "txn_send": return txnSend(num(a, "handle").intValue(), str(a, "topic"), Json.list(a.get("records")));
                case "txn_send_offsets": return txnSendOffsets(num(a, "handle").intValue(), str(a, "group"), str(a, "topic"),
                        Json.object(a.get("offsets")));
                case "txn_commit": return txn(a, p -> p.commitTransaction());
                case "txn_abort": return txn(a, p -> p.abortTransaction());
                case "describe_producers": return describeProducers(str(a, "topic"), num(a, "partition").intValue());
                case "list_transactions": return listTransactions();
                case "read": return read(str(a, "topic"), num(a, "partition").intValue(), num(a, "offset").longValue(),
                        num(a, "count").intValue(), Json.object(a.get("settings")));
                case "offsets_for_times": return offsetsForTimes(str(a, "topic"), Json.object(a.get("timestamps")));
                case "list_offsets": return listOffsets(str(a, "topic"), Json.list(a.get("partitions")), str(a, "spec"));
                case "consumer_open": return consumerOpen(str(a, "group"), Json.list(a.get("topics")), Json.object(a.get("settings")));
                case "consumer_poll": return consumerPoll(num(a, "handle").intValue(), num(a, "timeout_ms").longValue());
                case "consumer_commit": return consumerCommit(num(a, "handle").intValue());
                case "consumer_close": return consumerClose(num(a, "handle").intValue());
                default: throw new UnsupportedOperationException("unknown operation " + op);
            }
        } catch (ExecutionException | org.apache.kafka.common.KafkaException e) {
            throw clientError(e);
        }
    }

    // ------------------------------------------------------------------------------------------ admin

    Admin admin() {
        if (admin == null) {
            Properties props = connection();
            admin = Admin.create(props);
        }
        return admin;
    }

    Object createTopic(String topic, int partitions, Map<String, String> configs) throws Exception {
        NewTopic created = new NewTopic(topic, Optional.of(partitions), Optional.empty()).configs(configs);
        admin().createTopics(List.of(created)).all().get(TIMEOUT_S, TimeUnit.SECONDS);
        return null;
    }

    Object deleteTopic(String topic) throws Exception {
        admin().deleteTopics(List.of(topic)).all().get(TIMEOUT_S, TimeUnit.SECONDS);
        return null;
    }

    Object listTopics() throws Exception {
        return new ArrayList<>(new TreeSet<>(admin().listTopics().names().get(TIMEOUT_S, TimeUnit.SECONDS)));
    }

    Object describeTopic(String topic) throws Exception {
        TopicDescription description = admin().describeTopics(List.of(topic)).allTopicNames()
                .get(TIMEOUT_S, TimeUnit.SECONDS).get(topic);
        List<Object> partitions = new ArrayList<>();
        for (TopicPartitionInfo info : description.partitions()) partitions.add(info.partition());
        return partitions;
    }

    Object createPartitions(String topic, int total) throws Exception {
        admin().createPartitions(Map.of(topic, NewPartitions.increaseTo(total))).all().get(TIMEOUT_S, TimeUnit.SECONDS);
        return null;
    }

    Object describeConfigs(String topic, List<Object> names) throws Exception {
        ConfigResource resource = new ConfigResource(ConfigResource.Type.TOPIC, topic);
        Config config = admin().describeConfigs(List.of(resource)).all().get(TIMEOUT_S, TimeUnit.SECONDS).get(resource);
        Map<String, Object> out = new LinkedHashMap<>();
        for (Object name : names) {
            ConfigEntry entry = config.get((String) name);
            if (entry != null) out.put((String) name, entry.value());
        }
        return out;
    }

    Object alterConfigs(String topic, Map<String, String> configs) throws Exception {
        ConfigResource resource = new ConfigResource(ConfigResource.Type.TOPIC, topic);
        List<AlterConfigOp> ops = new ArrayList<>();
        for (Map.Entry<String, String> e : configs.entrySet()) {
            ops.add(new AlterConfigOp(new ConfigEntry(e.getKey(), e.getValue()), AlterConfigOp.OpType.SET));
        }
        admin().incrementalAlterConfigs(Map.of(resource, ops)).all().get(TIMEOUT_S, TimeUnit.SECONDS);
        return null;
    }

    // -------------------------------------------------------------------------------------- producing

    Object producerOpen(Map<String, Object> settings) {
        Properties props = connection();
        props.put("key.serializer", ByteArraySerializer.class.getName());
        props.put("value.serializer", ByteArraySerializer.class.getName());
        props.put("compression.type", settings.get("codec") == null ? "none" : settings.get("codec"));
        if (settings.get("idempotent") != null) props.put("enable.idempotence", settings.get("idempotent").toString());
        if (settings.get("max_request_bytes") != null) props.put("max.request.size", settings.get("max_request_bytes").toString());
        return keep(new KafkaProducer<byte[], byte[]>(props));
    }

    @SuppressWarnings("unchecked")
    Object producerSend(int handle, String topic, List<Object> records) throws Exception {
        KafkaProducer<byte[], byte[]> producer = (KafkaProducer<byte[], byte[]>) handles.get(handle);
        List<Future<RecordMetadata>> sent = new ArrayList<>();
        for (Object item : records) {
            Map<String, Object> r = Json.object(item);
            List<Header> headers = new ArrayList<>();
            for (Object pair : r.get("headers") == null ? List.of() : Json.list(r.get("headers"))) {
                List<Object> header = Json.list(pair);
                headers.add(new RecordHeader((String) header.get(0), bytes(header.get(1))));
            }
            Integer partition = r.get("partition") == null ? null : ((Number) r.get("partition")).intValue();
            Long timestamp = r.get("timestamp") == null ? null : ((Number) r.get("timestamp")).longValue();
            sent.add(producer.send(new ProducerRecord<>(topic, partition, timestamp, bytes(r.get("key")), bytes(r.get("value")), headers)));
        }
        producer.flush();
        List<Object> out = new ArrayList<>();
        for (Future<RecordMetadata> future : sent) {
            RecordMetadata meta = future.get(TIMEOUT_S, TimeUnit.SECONDS);
            out.add(List.of(meta.partition(), meta.offset()));
        }
        return out;
    }

    Object producerClose(int handle) {
        ((KafkaProducer<?, ?>) handles.remove(handle)).close(Duration.ofSeconds(10));
        return null;
    }

    // ------------------------------------------------------------------------------------ transactions

    Object txnProducerOpen(String transactionalId, Map<String, Object> settings) throws ClientError {
        Properties props = connection();
        props.put("key.serializer", ByteArraySerializer.class.getName());
        props.put("value.serializer", ByteArraySerializer.class.getName());
        props.put("transactional.id", transactionalId);
        if (settings.get("transaction_timeout_ms") != null) {
            props.put("transaction.timeout.ms", settings.get("transaction_timeout_ms").toString());
        }
        KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props);
        try {
            producer.initTransactions();
        } catch (org.apache.kafka.common.KafkaException e) {
            producer.close(Duration.ZERO);
            throw txnError(e);
        }
        return keep(producer);
    }

    interface ProducerCall {
        void run(KafkaProducer<byte[], byte[]> producer);
    }

    /** The error a transactional call failed with: the fencing or epoch error under a KafkaException wrapper. */
    static ClientError txnError(Throwable e) {
        Throwable cause = e;
        while ((cause instanceof ExecutionException || Errors.forException(cause) == Errors.UNKNOWN_SERVER_ERROR)
                && cause.getCause() != null && cause.getCause() != cause) {
            cause = cause.getCause();
        }
        return clientError(cause);
    }

    @SuppressWarnings("unchecked")
    KafkaProducer<byte[], byte[]> txnProducer(int handle) {
        return (KafkaProducer<byte[], byte[]>) handles.get(handle);
    }

    Object txn(Map<String, Object> a, ProducerCall call) throws ClientError {
        try {
            call.run(txnProducer(num(a, "handle").intValue()));
        } catch (org.apache.kafka.common.KafkaException e) {
            throw txnError(e);
        }
        return null;
    }

    Object txnSend(int handle, String topic, List<Object> records) throws ClientError {
        try {
            return producerSend(handle, topic, records);
        } catch (Exception e) {
            throw txnError(e);
        }
    }

    Object txnSendOffsets(int handle, String group, String topic, Map<String, Object> offsets) throws ClientError {
        Map<TopicPartition, OffsetAndMetadata> positions = new HashMap<>();
        for (Map.Entry<String, Object> e : offsets.entrySet()) {
            positions.put(new TopicPartition(topic, Integer.parseInt(e.getKey())),
                    new OffsetAndMetadata(((Number) e.getValue()).longValue()));
        }
        // The group's metadata as an application has it: from a consumer of the group (one that never joined
        // sends generation -1 and no member id).
        try (KafkaConsumer<byte[], byte[]> member = consumer(Map.of("group.id", group))) {
            txnProducer(handle).sendOffsetsToTransaction(positions, member.groupMetadata());
        } catch (org.apache.kafka.common.KafkaException e) {
            throw txnError(e);
        }
        return null;
    }

    /** Admin describeProducers: the partition's producers as [producer id, epoch, last sequence, txn start]. */
    Object describeProducers(String topic, int partition) throws Exception {
        TopicPartition tp = new TopicPartition(topic, partition);
        List<Object> out = new ArrayList<>();
        for (ProducerState state : admin().describeProducers(List.of(tp)).partitionResult(tp)
                .get(TIMEOUT_S, TimeUnit.SECONDS).activeProducers()) {
            out.add(List.of(state.producerId(), state.producerEpoch(), state.lastSequence(),
                    state.currentTransactionStartOffset().isPresent() ? state.currentTransactionStartOffset().getAsLong() : -1));
        }
        out.sort((x, y) -> Long.compare((Long) ((List<?>) x).get(0), (Long) ((List<?>) y).get(0)));
        return out;
    }

    /** Admin listTransactions: [transactional id, state] of every transaction the cluster knows, sorted. */
    Object listTransactions() throws Exception {
        List<Object> out = new ArrayList<>();
        for (TransactionListing listing : admin().listTransactions().all().get(TIMEOUT_S, TimeUnit.SECONDS)) {
            out.add(List.of(listing.transactionalId(), listing.state().toString()));
        }
        out.sort((x, y) -> ((String) ((List<?>) x).get(0)).compareTo((String) ((List<?>) y).get(0)));
        return out;
    }

    // ------------------------------------------------------------------------------ reading by position

    KafkaConsumer<byte[], byte[]> consumer(Map<String, Object> extra) {
        Properties props = connection();
        props.put("key.deserializer", ByteArrayDeserializer.class.getName());
        props.put("value.deserializer", ByteArrayDeserializer.class.getName());
        props.put("enable.auto.commit", "false");
        for (Map.Entry<String, Object> e : extra.entrySet()) props.put(e.getKey(), e.getValue().toString());
        return new KafkaConsumer<>(props);
    }

    Object read(String topic, int partition, long offset, int count, Map<String, Object> settings) {
        Map<String, Object> extra = new HashMap<>();
        // close() waits for the fetch in flight, which the broker holds for fetch.max.wait.ms (500 ms) when
        // there is nothing new: a shorter wait only makes each read return sooner.
        extra.put("fetch.max.wait.ms", 50);
        if (settings.get("max_partition_fetch_bytes") != null) {
            extra.put("max.partition.fetch.bytes", settings.get("max_partition_fetch_bytes"));
        }
        if (settings.get("isolation_level") != null) extra.put("isolation.level", settings.get("isolation_level"));
        long timeoutMs = settings.get("timeout_ms") == null ? 15000 : ((Number) settings.get("timeout_ms")).longValue();
        try (KafkaConsumer<byte[], byte[]> consumer = consumer(extra)) {
            TopicPartition tp = new TopicPartition(topic, partition);
            consumer.assign(List.of(tp));
            consumer.seek(tp, offset);
            List<Object> out = new ArrayList<>();
            long deadline = System.currentTimeMillis() + timeoutMs;
            while (out.size() < count && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(200))) {
                    if (out.size() < count) out.add(consumed(r));
                }
            }
            return out;
        }
    }

    Object offsetsForTimes(String topic, Map<String, Object> timestamps) {
        Map<TopicPartition, Long> query = new HashMap<>();
        for (Map.Entry<String, Object> e : timestamps.entrySet()) {
            query.put(new TopicPartition(topic, Integer.parseInt(e.getKey())), ((Number) e.getValue()).longValue());
        }
        try (KafkaConsumer<byte[], byte[]> consumer = consumer(Map.of())) {
            Map<String, Object> out = new LinkedHashMap<>();
            for (Map.Entry<TopicPartition, OffsetAndTimestamp> e : consumer.offsetsForTimes(query).entrySet()) {
                out.put(String.valueOf(e.getKey().partition()), e.getValue() == null ? null : e.getValue().offset());
            }
            return out;
        }
    }

    Object listOffsets(String topic, List<Object> partitions, String spec) {
        List<TopicPartition> tps = new ArrayList<>();
        for (Object p : partitions) tps.add(new TopicPartition(topic, ((Number) p).intValue()));
        try (KafkaConsumer<byte[], byte[]> consumer = consumer(Map.of())) {
            Map<TopicPartition, Long> found = "earliest".equals(spec) ? consumer.beginningOffsets(tps) : consumer.endOffsets(tps);
            Map<String, Object> out = new LinkedHashMap<>();
            for (Map.Entry<TopicPartition, Long> e : found.entrySet()) out.put(String.valueOf(e.getKey().partition()), e.getValue());
            return out;
        }
    }

    // ---------------------------------------------------------------------------------- consumer groups

    Object consumerOpen(String group, List<Object> topics, Map<String, Object> settings) {
        Map<String, Object> extra = new HashMap<>();
        extra.put("group.id", group);
        extra.put("auto.offset.reset", "earliest");
        extra.put("client.id", "compat-" + UUID.randomUUID());
        extra.put("session.timeout.ms", settings.get("session_timeout_ms"));
        extra.put("heartbeat.interval.ms", settings.get("heartbeat_interval_ms"));
        KafkaConsumer<byte[], byte[]> consumer = consumer(extra);
        List<String> names = new ArrayList<>();
        for (Object t : topics) names.add((String) t);
        consumer.subscribe(names);
        return keep(consumer);
    }

    @SuppressWarnings("unchecked")
    KafkaConsumer<byte[], byte[]> groupConsumer(int handle) {
        return (KafkaConsumer<byte[], byte[]>) handles.get(handle);
    }

    Object consumerPoll(int handle, long timeoutMs) {
        KafkaConsumer<byte[], byte[]> consumer = groupConsumer(handle);
        List<Object> records = new ArrayList<>();
        for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(timeoutMs))) records.add(consumed(r));
        List<List<Object>> assignment = new ArrayList<>();
        for (TopicPartition tp : consumer.assignment()) assignment.add(List.of(tp.topic(), tp.partition()));
        assignment.sort((x, y) -> x.get(0).equals(y.get(0))
                ? Integer.compare((Integer) x.get(1), (Integer) y.get(1)) : ((String) x.get(0)).compareTo((String) y.get(0)));
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("records", records);
        out.put("assignment", assignment);
        return out;
    }

    Object consumerCommit(int handle) {
        groupConsumer(handle).commitSync();
        return null;
    }

    Object consumerClose(int handle) {
        ((KafkaConsumer<?, ?>) handles.remove(handle)).close();
        return null;
    }

    // ------------------------------------------------------------------------------------------ helpers

    int keep(Object thing) {
        handles.put(++lastHandle, thing);
        return lastHandle;
    }

    void shutdown() {
        for (Object thing : handles.values()) {
            if (thing instanceof KafkaProducer) ((KafkaProducer<?, ?>) thing).close(Duration.ofSeconds(5));
            if (thing instanceof KafkaConsumer) ((KafkaConsumer<?, ?>) thing).close();
        }
        if (admin != null) admin.close();
    }

    static Map<String, Object> consumed(ConsumerRecord<byte[], byte[]> r) {
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("topic", r.topic());
        out.put("partition", r.partition());
        out.put("offset", r.offset());
        out.put("timestamp", r.timestamp());
        out.put("key", text(r.key()));
        out.put("value", text(r.value()));
        List<Object> headers = new ArrayList<>();
        for (Header h : r.headers()) headers.add(java.util.Arrays.asList(h.key(), text(h.value())));
        out.put("headers", headers);
        return out;
    }

    static byte[] bytes(Object text) {
        return text == null ? null : ((String) text).getBytes(StandardCharsets.UTF_8);
    }

    static String text(byte[] data) {
        return data == null ? null : new String(data, StandardCharsets.UTF_8);
    }

    static String str(Map<String, Object> a, String name) {
        return (String) a.get(name);
    }

    static Number num(Map<String, Object> a, String name) {
        return (Number) a.get(name);
    }

    static Map<String, String> strings(Object value) {
        Map<String, String> out = new LinkedHashMap<>();
        if (value != null) for (Map.Entry<String, Object> e : Json.object(value).entrySet()) out.put(e.getKey(), (String) e.getValue());
        return out;
    }
}
