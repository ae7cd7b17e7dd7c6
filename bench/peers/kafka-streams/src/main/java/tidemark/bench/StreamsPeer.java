package tidemark.bench;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.time.Duration;
import java.time.Instant;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.stream.Collectors;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ListOffsetsResult;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.processor.TimestampExtractor;

/**
 * Kafka Streams running the pipelines of tidemark's end-to-end benchmark on
 * the same topic, so that both are measured side by side.
 *
 * <pre>
 * java -jar streams-peer.jar MODE BOOTSTRAP INPUT OUTPUT APPLICATION_ID GUARANTEE
 *   MODE       filter: JSON values with amount >= 0, written unchanged;
 *              window: 5-minute tumbling count and sum of amount per record
 *              key on the value's event_time (10-minute grace), every update
 *              written (update mode, the default 10 MiB record cache);
 *              card_velocity: the rules of tidemark's examples/card_velocity.rs
 *              in the Processor API (see CardVelocity)
 *   GUARANTEE  at_least_once | exactly_once_v2
 * </pre>
 *
 * It prints one JSON line: the input's record count and the seconds from
 * start() until the group's committed offsets reach the input's end
 * offsets (polled every 100 ms, commits every second), the way the
 * tidemark side is timed to the end of its last commit.
 */
public final class StreamsPeer {
  private static final ObjectMapper JSON = new ObjectMapper();

  /** The event time in the JSON value, as tidemark's pipeline reads it. */
  public static final class EventTime implements TimestampExtractor {
    @Override
    public long extract(ConsumerRecord<Object, Object> record, long partitionTime) {
      try {
        JsonNode value = JSON.readTree((byte[]) record.value());
        return Instant.parse(value.get("event_time").asText()).toEpochMilli();
      } catch (Exception e) {
        return partitionTime;
      }
    }
  }

  public static void main(String[] args) throws Exception {
    if (args.length != 6) {
      System.err.println(
          "usage: MODE(filter|window|card_velocity) BOOTSTRAP INPUT OUTPUT APPLICATION_ID GUARANTEE");
      System.exit(2);
    }
    String mode = args[0], bootstrap = args[1], input = args[2], output = args[3];
    String applicationId = args[4], guarantee = args[5];

    Properties props = new Properties();
    props.put(StreamsConfig.APPLICATION_ID_CONFIG, applicationId);
    props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, guarantee);
    props.put(StreamsConfig.STATE_DIR_CONFIG,
        Files.createTempDirectory("streams-peer").toString());
    props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
    props.put(StreamsConfig.DEFAULT_TIMESTAMP_EXTRACTOR_CLASS_CONFIG, EventTime.class);
    // At-least-once commits every 30 s by default: the run would be timed
    // to the next commit, not to the end of the work. 1 s, as tidemark
    // commits each batch.
    props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 1000);

    StreamsBuilder builder = new StreamsBuilder();
    KStream<String, byte[]> stream =
        builder.stream(input, Consumed.with(Serdes.String(), Serdes.ByteArray()));
    switch (mode) {
      case "filter" -> stream
          .filter((key, value) -> amount(value) >= 0)
          .to(output, Produced.with(Serdes.String(), Serdes.ByteArray()));
      case "window" -> stream
          .groupByKey(Grouped.with(Serdes.String(), Serdes.ByteArray()))
          .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofMinutes(5), Duration.ofMinutes(10)))
          .aggregate(
              () -> "0,0.0",
              (key, value, total) -> {
                String[] parts = total.split(",");
                return (Long.parseLong(parts[0]) + 1) + ","
                    + (Double.parseDouble(parts[1]) + amount(value));
              },
              Materialized.with(Serdes.String(), Serdes.String()))
          .toStream()
          .map((window, total) -> {
            String[] parts = total.split(",");
            String row = "{\"id\":\"" + window.key() + "\",\"window_start\":"
                + window.window().start() + ",\"count\":" + parts[0]
                + ",\"sum\":" + parts[1] + "}";
            return KeyValue.pair(window.key(), row.getBytes(StandardCharsets.UTF_8));
          })
          .to(output, Produced.with(Serdes.String(), Serdes.ByteArray()));
      case "card_velocity" -> {
        props.put(StreamsConfig.DEFAULT_TIMESTAMP_EXTRACTOR_CLASS_CONFIG,
            CardVelocity.EventTime.class);
        CardVelocity.build(builder, stream, output);
      }
      default -> throw new IllegalArgumentException("unknown mode " + mode);
    }

    Properties adminProps = new Properties();
    adminProps.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    try (Admin admin = Admin.create(adminProps)) {
      Map<TopicPartition, Long> end = endOffsets(admin, input);
      long records = end.values().stream().mapToLong(Long::longValue).sum();
      KafkaStreams streams = new KafkaStreams(builder.build(), props);
      long start = System.nanoTime();
      streams.start();
      long deadline = start + Duration.ofMinutes(15).toNanos();
      while (!caughtUp(admin, applicationId, end)) {
        if (System.nanoTime() > deadline) {
          throw new IllegalStateException("not caught up after 15 minutes");
        }
        Thread.sleep(100);
      }
      double seconds = (System.nanoTime() - start) / 1e9;
      streams.close(Duration.ofSeconds(30));
      System.out.printf("{\"records\": %d, \"seconds\": %.3f}%n", records, seconds);
    }
  }

  private static double amount(byte[] value) {
    try {
      return JSON.readTree(value).get("amount").asDouble();
    } catch (Exception e) {
      return -1;
    }
  }

  private static Map<TopicPartition, Long> endOffsets(Admin admin, String topic) throws Exception {
    List<TopicPartition> partitions = admin.describeTopics(List.of(topic)).allTopicNames().get()
        .get(topic).partitions().stream()
        .map(p -> new TopicPartition(topic, p.partition()))
        .collect(Collectors.toList());
    Map<TopicPartition, OffsetSpec> latest = new HashMap<>();
    partitions.forEach(p -> latest.put(p, OffsetSpec.latest()));
    Map<TopicPartition, Long> end = new HashMap<>();
    for (Map.Entry<TopicPartition, ListOffsetsResult.ListOffsetsResultInfo> e :
        admin.listOffsets(latest).all().get().entrySet()) {
      end.put(e.getKey(), e.getValue().offset());
    }
    return end;
  }

  private static boolean caughtUp(Admin admin, String group, Map<TopicPartition, Long> end)
      throws Exception {
    Map<TopicPartition, OffsetAndMetadata> committed =
        admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get();
    for (Map.Entry<TopicPartition, Long> e : end.entrySet()) {
      OffsetAndMetadata c = committed.get(e.getKey());
      if (c == null || c.offset() < e.getValue()) {
        return false;
      }
    }
    return true;
  }
}
