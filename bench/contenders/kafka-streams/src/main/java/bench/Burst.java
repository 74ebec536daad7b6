package bench;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.CloseOptions;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.processor.StateRestoreListener;
import org.apache.kafka.streams.processor.api.FixedKeyProcessor;
import org.apache.kafka.streams.processor.api.FixedKeyProcessorContext;
import org.apache.kafka.streams.processor.api.FixedKeyRecord;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;

/**
 * The stateful burst detector as a Kafka Streams application: a customer (the record's key) is
 * flagged on the record that completes MIN_RECORDS records within WINDOW_SECONDS of event time
 * (the record's Kafka timestamp), at most once per window, the rule of the template's `burst`
 * detector. Each customer's state (when last flagged, the times of its last MIN_RECORDS - 1
 * records) lives in a persistent (RocksDB) key-value store with its changelog topic, as a Kafka
 * Streams user would write it: a processor with a KeyValueStore, store caching on (the DSL's
 * default), at-least-once. Malformed records are skipped (the service sends them to its
 * dead-letter topic). The store keeps a customer until it is overwritten: Kafka Streams' key-value
 * stores have no TTL (a windowed store or a punctuator would add one).
 *
 * <p>Each changelog partition's restore is printed on stdout ({@code restore-start}, {@code
 * restore-end}, with the wall clock in ms), and so is the moment the application is RUNNING: the
 * benchmark times a restore of the store from them.
 *
 * <p>Usage: Burst BOOTSTRAP INPUT OUTPUT APPLICATION_ID MIN_RECORDS WINDOW_SECONDS THREADS STATE_DIR
 */
public final class Burst {
  private static final ObjectMapper JSON = new ObjectMapper();
  static final String STORE = "burst";
  private static final long NEVER = Long.MIN_VALUE;

  public static void main(String[] args) throws InterruptedException {
    String bootstrap = args[0], input = args[1], output = args[2], applicationId = args[3];
    int minRecords = Integer.parseInt(args[4]);
    double windowSeconds = Double.parseDouble(args[5]);
    Properties props = new Properties();
    props.put(StreamsConfig.APPLICATION_ID_CONFIG, applicationId);
    props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, Integer.parseInt(args[6]));
    props.put(StreamsConfig.STATE_DIR_CONFIG, args[7]);
    props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.AT_LEAST_ONCE);
    props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");

    StreamsBuilder builder = new StreamsBuilder();
    // Logging (the changelog topic) is on by default; caching as the DSL's stores have it.
    builder.addStateStore(
        Stores.keyValueStoreBuilder(Stores.persistentKeyValueStore(STORE), Serdes.Bytes(), Serdes.ByteArray()).withCachingEnabled());
    builder.stream(input, Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
        .processValues(() -> new Count(minRecords, (long) (windowSeconds * 1000), windowSeconds), STORE)
        .to(output, Produced.with(Serdes.ByteArray(), Serdes.ByteArray()));

    KafkaStreams streams = new KafkaStreams(builder.build(), props);
    long started = System.currentTimeMillis();
    streams.setGlobalStateRestoreListener(new Report());
    streams.setStateListener((now, before) -> {
      if (now == KafkaStreams.State.RUNNING) {
        System.out.printf("running %d %d%n", System.currentTimeMillis(), System.currentTimeMillis() - started);
      }
    });
    CountDownLatch stopped = new CountDownLatch(1);
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      // Commits what was processed, like the service's graceful stop, and leaves the group (Kafka
      // Streams stays in it by default): the benchmark's restart of it then waits for no session timeout.
      streams.close(CloseOptions.groupMembershipOperation(CloseOptions.GroupMembershipOperation.LEAVE_GROUP));
      stopped.countDown();
    }));
    streams.start();
    stopped.await();
  }

  /** Restores as lines on stdout, each with the wall clock in ms. */
  static final class Report implements StateRestoreListener {
    @Override
    public void onRestoreStart(TopicPartition partition, String store, long start, long end) {
      System.out.printf("restore-start %s %d %d %d%n", partition, start, end, System.currentTimeMillis());
    }

    @Override
    public void onBatchRestored(TopicPartition partition, String store, long batchEnd, long count) {}

    @Override
    public void onRestoreEnd(TopicPartition partition, String store, long total) {
      System.out.printf("restore-end %s %d %d%n", partition, total, System.currentTimeMillis());
    }
  }

  static final class Count implements FixedKeyProcessor<byte[], byte[], byte[]> {
    private final int minRecords;
    private final long windowMs;
    private final double windowSeconds;
    private FixedKeyProcessorContext<byte[], byte[]> context;
    private KeyValueStore<Bytes, byte[]> store;

    Count(int minRecords, long windowMs, double windowSeconds) {
      this.minRecords = minRecords;
      this.windowMs = windowMs;
      this.windowSeconds = windowSeconds;
    }

    @Override
    public void init(FixedKeyProcessorContext<byte[], byte[]> context) {
      this.context = context;
      this.store = context.getStateStore(STORE);
    }

    @Override
    public void process(FixedKeyRecord<byte[], byte[]> record) {
      if (record.key() == null) {
        return; // no customer: no state to keep (the service sends it to its dead-letter topic)
      }
      try {
        JsonNode value = JSON.readTree(record.value());
        if (value == null || !value.isObject()) {
          return;
        }
      } catch (Exception malformed) {
        return;
      }
      Bytes key = Bytes.wrap(record.key());
      long t = record.timestamp();
      // The state: when last flagged (NEVER: not yet), then the times of the last records, oldest first.
      byte[] held = store.get(key);
      long flagged = NEVER;
      long[] recent = new long[minRecords];
      int n = 0;
      if (held != null) {
        ByteBuffer in = ByteBuffer.wrap(held);
        flagged = in.getLong();
        while (in.hasRemaining()) {
          long s = in.getLong();
          if (t - s <= windowMs) {
            recent[n++] = s;
          }
        }
      }
      recent[n++] = t;
      if (n >= minRecords && (flagged == NEVER || t - flagged > windowMs)) {
        flagged = t;
        forward(record, new String(record.key(), StandardCharsets.UTF_8));
      }
      // The last MIN_RECORDS - 1: all a later burst can use.
      int from = Math.max(0, n - (minRecords - 1));
      ByteBuffer out = ByteBuffer.allocate(8 * (1 + n - from));
      out.putLong(flagged);
      for (int i = from; i < n; i++) {
        out.putLong(recent[i]);
      }
      store.put(key, out.array());
    }

    private void forward(FixedKeyRecord<byte[], byte[]> record, String customer) {
      ObjectNode out = JSON.createObjectNode();
      out.put("service", "kafka-streams");
      out.putObject("detection").put("rule", "burst").put("customer", customer).put("records", minRecords).put("window_seconds", windowSeconds);
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
