// Produces records described on stdin with the Java client, for tools/capture_batches.py.
//
// Usage: java -cp <kafka-clients and codec jars>:<dir> CaptureProducer BOOTSTRAP TOPIC CODEC IDEMPOTENT < records
// One record per line: KEY VALUE HEADERS, space separated, "-" for null; bytes are hex; HEADERS is
// "name=hex,name=-" or "-" for none.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.Future;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class CaptureProducer {
    static byte[] hex(String text) {
        if (text.equals("-")) return null;
        byte[] out = new byte[text.length() / 2];
        for (int i = 0; i < out.length; i++) {
            out[i] = (byte) Integer.parseInt(text.substring(2 * i, 2 * i + 2), 16);
        }
        return out;
    }

    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        props.put("compression.type", args[2]);
        props.put("enable.idempotence", args[3]);
        if (args[3].equals("false")) props.put("acks", "1");
        props.put("linger.ms", "200");
        props.put("batch.size", "1048576");
        props.put("key.serializer", ByteArraySerializer.class.getName());
        props.put("value.serializer", ByteArraySerializer.class.getName());
        List<Future<RecordMetadata>> sent = new ArrayList<>();
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
            String line;
            while ((line = in.readLine()) != null) {
                if (line.isBlank()) continue;
                String[] parts = line.trim().split(" ");
                ProducerRecord<byte[], byte[]> record = new ProducerRecord<>(args[1], 0, hex(parts[0]), hex(parts[1]));
                if (!parts[2].equals("-")) {
                    for (String header : parts[2].split(",")) {
                        String[] kv = header.split("=", 2);
                        record.headers().add(new RecordHeader(kv[0], hex(kv[1])));
                    }
                }
                sent.add(producer.send(record));
            }
            for (Future<RecordMetadata> f : sent) f.get();
        }
    }
}
