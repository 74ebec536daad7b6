package bench;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.processor.api.FixedKeyProcessor;
import org.apache.kafka.streams.processor.api.FixedKeyProcessorContext;
import org.apache.kafka.streams.processor.api.FixedKeyRecord;

/**
 * The threshold detector as a Kafka Streams application: a record whose amount is above the
 * threshold gives a detection with its source (topic, partition, offset, timestamp), as the
 * detector service writes it. Malformed records are skipped (the service sends them to its
 * dead-letter topic).
 *
 * <p>Usage: Detector BOOTSTRAP INPUT OUTPUT APPLICATION_ID THRESHOLD THREADS [GUARANTEE]
 * (GUARANTEE: at_least_once, the default, or exactly_once_v2)
 */
public final class Detector {
  private static final ObjectMapper JSON = new ObjectMapper();

  public static void main(String[] args) throws InterruptedException {
    String bootstrap = args[0], input = args[1], output = args[2], applicationId = args[3];
    double threshold = Double.parseDouble(args[4]);
    Properties props = new Properties();
    props.put(StreamsConfig.APPLICATION_ID_CONFIG, applicationId);
    props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, Integer.parseInt(args[5]));
    // Its defaults with exactly_once_v2: a commit (a transaction) every 100 ms, as the project's docs say.
    props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, args.length > 6 ? args[6] : StreamsConfig.AT_LEAST_ONCE);
    props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");

    StreamsBuilder builder = new StreamsBuilder();
    builder.stream(input, Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
        .processValues(() -> new Detect(threshold))
        .to(output, Produced.with(Serdes.ByteArray(), Serdes.ByteArray()));

    KafkaStreams streams = new KafkaStreams(builder.build(), props);
    CountDownLatch stopped = new CountDownLatch(1);
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      streams.close(); // commits what was processed, like the service's graceful stop
      stopped.countDown();
    }));
    streams.start();
    stopped.await();
  }

  static final class Detect implements FixedKeyProcessor<byte[], byte[], byte[]> {
    private final double threshold;
    private FixedKeyProcessorContext<byte[], byte[]> context;

    Detect(double threshold) {
      this.threshold = threshold;
    }

    @Override
    public void init(FixedKeyProcessorContext<byte[], byte[]> context) {
      this.context = context;
    }

    @Override
    public void process(FixedKeyRecord<byte[], byte[]> record) {
      JsonNode value;
      try {
        value = JSON.readTree(record.value());
      } catch (Exception malformed) {
        return;
      }
      JsonNode amount = value == null ? null : value.get("amount");
      if (amount == null || !amount.isNumber() || amount.asDouble() <= threshold) {
        return;
      }
      ObjectNode out = JSON.createObjectNode();
      out.put("service", "kafka-streams");
      out.putObject("detection").put("amount", amount.asDouble()).put("threshold", threshold);
      ObjectNode source = out.putObject("source");
      context.recordMetadata().ifPresent(m -> source.put("topic", m.topic()).put("partition", m.partition()).put("offset", m.offset()));
      source.put("timestamp_ms", record.timestamp());
      try {
        context.forward(record.withValue(JSON.writeValueAsBytes(out)));
      } catch (Exception impossible) {
        throw new IllegalStateException(impossible);
      }
    }
  }
}
