package bench;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.CloseOptions;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.KGroupedStream;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.SessionWindows;
import org.apache.kafka.streams.kstream.Suppressed;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.Windowed;

/**
 * Windows that emit once they close, as a Kafka Streams user writes them in the DSL: a count per
 * customer (the record's key) over event time (the record's Kafka timestamp), in tumbling windows
 * ({@code TimeWindows.ofSizeAndGrace}) or sessions ({@code SessionWindows.ofInactivityGapAndGrace}),
 * held back by {@code suppress(untilWindowCloses)} until the partition's stream time passes the
 * window's end (a session's: its last record and the gap) and the grace; one record per closed
 * window on the output topic. The peer of a service baked with a closing window rule (`silence`:
 * sessions, `totals`: tumbling windows). Windowed stores, their changelogs and the suppression
 * buffer's changelog are on (the DSL's defaults), at-least-once. Malformed records are skipped.
 *
 * <p>Usage: Closing BOOTSTRAP INPUT OUTPUT APPLICATION_ID KIND(session|tumbling) SIZE_MS GRACE_MS THREADS STATE_DIR
 */
public final class Closing {
  private static final ObjectMapper JSON = new ObjectMapper();

  public static void main(String[] args) throws InterruptedException {
    String bootstrap = args[0], input = args[1], output = args[2], applicationId = args[3], kind = args[4];
    Duration size = Duration.ofMillis(Long.parseLong(args[5])), grace = Duration.ofMillis(Long.parseLong(args[6]));
    Properties props = new Properties();
    props.put(StreamsConfig.APPLICATION_ID_CONFIG, applicationId);
    props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, Integer.parseInt(args[7]));
    props.put(StreamsConfig.STATE_DIR_CONFIG, args[8]);
    props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.AT_LEAST_ONCE);
    props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");

    StreamsBuilder builder = new StreamsBuilder();
    KGroupedStream<String, String> grouped =
        builder.stream(input, Consumed.with(Serdes.String(), Serdes.String())).filter((key, value) -> key != null && isObject(value)).groupByKey();
    KTable<Windowed<String>, Long> counts =
        kind.equals("session")
            ? grouped.windowedBy(SessionWindows.ofInactivityGapAndGrace(size, grace)).count()
            : grouped.windowedBy(TimeWindows.ofSizeAndGrace(size, grace)).count();
    counts
        .suppress(Suppressed.untilWindowCloses(Suppressed.BufferConfig.unbounded()))
        .toStream()
        .filter((window, count) -> count != null)
        .map((window, count) -> KeyValue.pair(window.key().getBytes(StandardCharsets.UTF_8), detection(window, count)))
        .to(output, Produced.with(Serdes.ByteArray(), Serdes.ByteArray()));

    KafkaStreams streams = new KafkaStreams(builder.build(), props);
    CountDownLatch stopped = new CountDownLatch(1);
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      streams.close(CloseOptions.groupMembershipOperation(CloseOptions.GroupMembershipOperation.LEAVE_GROUP));
      stopped.countDown();
    }));
    streams.start();
    stopped.await();
  }

  private static boolean isObject(String value) {
    try {
      JsonNode parsed = JSON.readTree(value);
      return parsed != null && parsed.isObject();
    } catch (Exception malformed) {
      return false;
    }
  }

  private static byte[] detection(Windowed<String> window, long count) {
    ObjectNode out = JSON.createObjectNode();
    out.put("service", "kafka-streams");
    out.putObject("detection").put("key", window.key()).put("window_start_ms", window.window().start()).put("window_end_ms", window.window().end())
        .put("count", count);
    out.putObject("source").put("key", window.key()).put("timestamp_ms", window.window().end());
    try {
      return JSON.writeValueAsBytes(out);
    } catch (Exception impossible) {
      throw new IllegalStateException(impossible);
    }
  }
}
