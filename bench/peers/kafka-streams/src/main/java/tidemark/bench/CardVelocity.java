package tidemark.bench;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.List;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.processor.PunctuationType;
import org.apache.kafka.streams.processor.TimestampExtractor;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;

/**
 * The rules of tidemark's {@code examples/card_velocity.rs} in Kafka Streams'
 * Processor API, for the side-by-side benchmark: per card (the record key),
 * a period's count and total and its kept declines in a key-value store; the
 * idle times in a second store ordered by time, swept by a stream-time
 * punctuator once stream time less one minute (the watermark's delay)
 * reaches them.
 */
public final class CardVelocity {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final long MINUTE = 60_000L;
  private static final long IDLE_AFTER = 30 * MINUTE;
  private static final long DECLINE_WINDOW = 10 * MINUTE;
  private static final long WATERMARK_DELAY = MINUTE;

  private CardVelocity() {}

  /** The event time: the value's {@code ts}. */
  public static final class EventTime implements TimestampExtractor {
    @Override
    public long extract(ConsumerRecord<Object, Object> record, long partitionTime) {
      try {
        JsonNode value = JSON.readTree((byte[]) record.value());
        return Instant.parse(value.get("ts").asText()).toEpochMilli();
      } catch (Exception e) {
        return partitionTime;
      }
    }
  }

  /** Adds the stores and the processor from {@code input} to {@code output}. */
  public static void build(StreamsBuilder builder, KStream<String, byte[]> input, String output) {
    builder.addStateStore(Stores.keyValueStoreBuilder(
        Stores.persistentKeyValueStore("cards"), Serdes.String(), Serdes.String()));
    builder.addStateStore(Stores.keyValueStoreBuilder(
        Stores.persistentKeyValueStore("idle-at"), Serdes.String(), Serdes.String()));
    input
        .process(Rules::new, "cards", "idle-at")
        .to(output, Produced.with(Serdes.String(), Serdes.ByteArray()));
  }

  /** A card's period: latest event time, count, total, kept declines. */
  private static final class Period {
    long latest;
    long transactions;
    double total;
    final List<Long> declines = new ArrayList<>();

    static Period parse(String text) {
      String[] parts = text.split(",", -1);
      Period p = new Period();
      p.latest = Long.parseLong(parts[0]);
      p.transactions = Long.parseLong(parts[1]);
      p.total = Double.parseDouble(parts[2]);
      if (!parts[3].isEmpty()) {
        for (String d : parts[3].split(";")) {
          p.declines.add(Long.parseLong(d));
        }
      }
      return p;
    }

    String text() {
      StringBuilder s = new StringBuilder();
      s.append(latest).append(',').append(transactions).append(',').append(total).append(',');
      for (int i = 0; i < declines.size(); i++) {
        s.append(i == 0 ? "" : ";").append(declines.get(i));
      }
      return s.toString();
    }
  }

  private static String indexKey(long idleAt, String card) {
    return String.format("%019d|%s", idleAt, card);
  }

  /** The per-card rules. */
  private static final class Rules implements Processor<String, byte[], String, byte[]> {
    private ProcessorContext<String, byte[]> context;
    private KeyValueStore<String, String> cards;
    private KeyValueStore<String, String> idleAt;

    @Override
    public void init(ProcessorContext<String, byte[]> context) {
      this.context = context;
      this.cards = context.getStateStore("cards");
      this.idleAt = context.getStateStore("idle-at");
      // Once a minute of stream time: the watermark moves by no less.
      context.schedule(Duration.ofMinutes(1), PunctuationType.STREAM_TIME, this::sweep);
    }

    /** Emits the idle rows the watermark (stream time less a minute) reached. */
    private void sweep(long streamTime) {
      String upTo = indexKey(streamTime - WATERMARK_DELAY, "\uffff");
      List<KeyValue<String, String>> due = new ArrayList<>();
      try (KeyValueIterator<String, String> it = idleAt.range("", upTo)) {
        while (it.hasNext()) {
          due.add(it.next());
        }
      }
      for (KeyValue<String, String> entry : due) {
        idleAt.delete(entry.key);
        String state = cards.get(entry.value);
        if (state == null) {
          continue;
        }
        Period p = Period.parse(state);
        if (indexKey(p.latest + IDLE_AFTER, entry.value).equals(entry.key)) {
          goIdle(entry.value, p, streamTime);
        }
      }
    }

    private void goIdle(String card, Period p, long timestamp) {
      String row = "{\"card\":\"" + card + "\",\"ts\":\""
          + Instant.ofEpochMilli(p.latest + IDLE_AFTER) + "\",\"rule\":\"idle\",\"transactions\":"
          + p.transactions + ",\"total\":" + p.total + "}";
      context.forward(new Record<>(card, row.getBytes(StandardCharsets.UTF_8), timestamp));
      cards.delete(card);
      idleAt.delete(indexKey(p.latest + IDLE_AFTER, card));
    }

    @Override
    public void process(Record<String, byte[]> record) {
      JsonNode value;
      try {
        value = JSON.readTree(record.value());
      } catch (Exception e) {
        return;
      }
      String card = record.key();
      long ts = Instant.parse(value.get("ts").asText()).toEpochMilli();
      double amount = value.get("amount").asDouble();
      boolean declined = "declined".equals(value.get("status").asText());
      String state = cards.get(card);
      Period p = state == null ? null : Period.parse(state);
      if (p != null && ts >= p.latest + IDLE_AFTER) {
        goIdle(card, p, record.timestamp());
        p = null;
      }
      if (p == null) {
        p = new Period();
        p.latest = ts;
        idleAt.put(indexKey(ts + IDLE_AFTER, card), card);
      } else if (ts > p.latest) {
        idleAt.delete(indexKey(p.latest + IDLE_AFTER, card));
        p.latest = ts;
        idleAt.put(indexKey(ts + IDLE_AFTER, card), card);
      }
      p.transactions += 1;
      p.total += amount;
      if (declined) {
        p.declines.add(ts);
      } else if (amount >= 500) {
        long recent = p.declines.stream().filter(d -> d > ts - DECLINE_WINDOW && d <= ts).count();
        if (recent >= 3) {
          String row = "{\"card\":\"" + card + "\",\"ts\":\"" + Instant.ofEpochMilli(ts)
              + "\",\"rule\":\"declines_then_large\",\"declines\":" + recent + ",\"amount\":"
              + amount + "}";
          context.forward(new Record<>(card, row.getBytes(StandardCharsets.UTF_8),
              record.timestamp()));
          p.declines.clear();
        }
      }
      // Declines the watermark passed by 10 minutes can count no more.
      long watermark = context.currentStreamTimeMs() - WATERMARK_DELAY;
      p.declines.removeIf(d -> d + DECLINE_WINDOW <= watermark);
      cards.put(card, p.text());
    }
  }
}
