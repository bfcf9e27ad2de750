package cdc.stack.mongo;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.apache.kafka.connect.header.Header;
import org.apache.kafka.connect.json.JsonConverter;
import org.apache.kafka.connect.source.SourceRecord;
import org.bson.BsonDocument;
import org.bson.BsonTimestamp;
import org.bson.codecs.Codec;
import org.bson.codecs.DecoderContext;
import org.bson.json.JsonReader;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.mongodb.MongoClientSettings;
import com.mongodb.client.model.changestream.ChangeStreamDocument;

import io.debezium.config.Configuration;
import io.debezium.connector.SnapshotRecord;
import io.debezium.connector.mongodb.CollectionId;
import io.debezium.connector.base.ChangeEventQueue;
import io.debezium.connector.common.DebeziumHeaderProducer;
import io.debezium.connector.mongodb.MongoDbConnectorConfig;
import io.debezium.connector.mongodb.MongoDbEventMetadataProvider;
import io.debezium.connector.mongodb.MongoDbOffsetContext;
import io.debezium.connector.mongodb.MongoDbPartition;
import io.debezium.connector.mongodb.MongoDbSchema;
import io.debezium.connector.mongodb.MongoDbTaskContext;
import io.debezium.connector.mongodb.recordemitter.MongoDbChangeRecordEmitter;
import io.debezium.connector.mongodb.recordemitter.MongoDbSnapshotRecordEmitter;
import io.debezium.connector.mongodb.transforms.ExtractNewDocumentState;
import io.debezium.pipeline.DataChangeEvent;
import io.debezium.pipeline.EventDispatcher;
import io.debezium.pipeline.spi.ChangeRecordEmitter;
import io.debezium.util.Clock;

/**
 * The records Debezium's MongoDB connector writes for change-stream documents, without a MongoDB
 * server: each line of stdin is one change-stream document as a 6.0+ replica set sends it (canonical
 * Extended JSON), decoded by the MongoDB driver's own ChangeStreamDocument codec; the connector's
 * own classes (its configuration, collection schema, offset context and record emitter) build the
 * record as its streaming source does and its event dispatcher sends it (with its context headers,
 * and a delete's tombstone, tombstones.on.delete), and Kafka Connect's JsonConverter serialises key
 * and value with and without schemas. A line
 * {"snapshot": {"ns": {"db", "coll"}, "document": {...}, "readAt": millis}} is a document the
 * connector's initial snapshot reads (its snapshot record emitter, the offset in snapshot mode, the
 * clock at readAt): a record of op r.
 *
 * Usage: MongoChangeEvents key=value... (connector settings: topic.prefix, capture.mode, ...; a
 * setting unwrap.NAME=VALUE configures Debezium's ExtractNewDocumentState with NAME=VALUE).
 * Each output line is a JSON object: topic, key, value (schemas.enable=true), key_bare, value_bare
 * (schemas.enable=false); value null for a tombstone; headers, [name, value] pairs (as Kafka Connect's
 * SimpleHeaderConverter writes a string). With unwrap settings, also the record
 * ExtractNewDocumentState makes of it: unwrapped (false when it drops the record) and
 * unwrapped_key, unwrapped_value, unwrapped_key_bare, unwrapped_value_bare.
 */
public final class MongoChangeEvents {

    public static void main(String[] args) throws Exception {
        Configuration.Builder builder = Configuration.create()
                .with("mongodb.connection.string", "mongodb://localhost:27017/?replicaSet=rs0")
                .with("connector.class", "io.debezium.connector.mongodb.MongoDbConnector");
        Map<String, String> unwrapSettings = new HashMap<>();
        for (String arg : args) {
            int equals = arg.indexOf('=');
            if (arg.startsWith("unwrap.")) {
                unwrapSettings.put(arg.substring("unwrap.".length(), equals), arg.substring(equals + 1));
            }
            else {
                builder = builder.with(arg.substring(0, equals), arg.substring(equals + 1));
            }
        }
        ExtractNewDocumentState<SourceRecord> unwrap = unwrapSettings.isEmpty() ? null : new ExtractNewDocumentState<>();
        if (unwrap != null) {
            unwrap.configure(unwrapSettings);
        }
        Configuration config = builder.build();
        MongoDbConnectorConfig connectorConfig = new MongoDbConnectorConfig(config);
        MongoDbTaskContext taskContext = new MongoDbTaskContext(config);
        MongoDbSchema schema = new MongoDbSchema(connectorConfig, taskContext,
                connectorConfig.getTopicNamingStrategy(MongoDbConnectorConfig.TOPIC_NAMING_STRATEGY),
                connectorConfig.getSourceInfoStructMaker().schema(), connectorConfig.schemaNameAdjuster());
        // As MongoDbConnectorTask builds them: the queue its poll drains, and the dispatcher the sources send to.
        ChangeEventQueue<DataChangeEvent> queue = new ChangeEventQueue.Builder<DataChangeEvent>()
                .pollInterval(Duration.ofMillis(1))
                .maxBatchSize(connectorConfig.getMaxBatchSize())
                .maxQueueSize(connectorConfig.getMaxQueueSize())
                .loggingContextSupplier(() -> taskContext.configureLoggingContext("harness"))
                .build();
        EventDispatcher<MongoDbPartition, CollectionId> dispatcher = new EventDispatcher<>(connectorConfig,
                connectorConfig.getTopicNamingStrategy(MongoDbConnectorConfig.TOPIC_NAMING_STRATEGY), schema, queue,
                collection -> true, DataChangeEvent::new, new MongoDbEventMetadataProvider(),
                connectorConfig.schemaNameAdjuster(), new DebeziumHeaderProducer(taskContext));
        EventDispatcher.SnapshotReceiver<MongoDbPartition> snapshotReceiver = dispatcher.getSnapshotChangeEventReceiver();
        MongoDbPartition partition = new MongoDbPartition(connectorConfig.getLogicalName());
        MongoDbOffsetContext offset = new MongoDbOffsetContext.Loader(connectorConfig).load(new HashMap<>());
        Codec<ChangeStreamDocument<BsonDocument>> codec = ChangeStreamDocument.createCodec(
                BsonDocument.class, MongoClientSettings.getDefaultCodecRegistry());
        Map<String, JsonConverter> converters = new HashMap<>();
        for (String kind : new String[]{ "key", "value" }) {
            for (boolean schemas : new boolean[]{ true, false }) {
                JsonConverter converter = new JsonConverter();
                converter.configure(Map.of("schemas.enable", String.valueOf(schemas)), kind.equals("key"));
                converters.put(kind + (schemas ? "" : "_bare"), converter);
            }
        }
        ObjectMapper json = new ObjectMapper();
        PrintStream out = new PrintStream(System.out, true, StandardCharsets.UTF_8);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isBlank()) {
                continue;
            }
            BsonDocument input = BsonDocument.parse(line);
            if (input.containsKey("snapshot")) {
                // As MongoDbSnapshotChangeEventSource does: the offset reads the collection at the clock's time, then the emitter.
                BsonDocument read = input.getDocument("snapshot");
                CollectionId collectionId = new CollectionId(read.getDocument("ns").getString("db").getValue(),
                        read.getDocument("ns").getString("coll").getValue());
                long readAt = read.getInt64("readAt").getValue();
                Clock clock = () -> readAt;
                if (!offset.isInitialSnapshotRunning()) {
                    // The snapshot starts at the cluster time the change stream will resume from.
                    offset.initFromOpTimeIfNeeded(new BsonTimestamp((int) (readAt / 1000), 0));
                    offset.preSnapshotStart(false);
                    call(offset, "startInitialSnapshot");
                }
                offset.readEvent(collectionId, clock.currentTime());
                offset.markSnapshotRecord(SnapshotRecord.TRUE);
                ChangeRecordEmitter<MongoDbPartition> emitter = new MongoDbSnapshotRecordEmitter(partition, offset, clock,
                        read.getDocument("document"), connectorConfig);
                dispatcher.dispatchSnapshotEvent(partition, collectionId, emitter, snapshotReceiver);
            }
            else {
                if (offset.isInitialSnapshotRunning()) {
                    endSnapshot(offset, snapshotReceiver);
                }
                ChangeStreamDocument<BsonDocument> event = codec.decode(new JsonReader(line), DecoderContext.builder().build());
                CollectionId collectionId = new CollectionId(event.getNamespace().getDatabaseName(),
                        event.getNamespace().getCollectionName());
                // As MongoDbStreamingChangeEventSource does: the emitter, then the offset moves to the event, then the dispatch.
                ChangeRecordEmitter<MongoDbPartition> emitter = new MongoDbChangeRecordEmitter(partition, offset, Clock.system(),
                        event, connectorConfig);
                offset.changeStreamEvent(event);
                dispatcher.dispatchDataChangeEvent(partition, collectionId, emitter);
            }
            print(out, json, converters, unwrap, queue);
        }
        if (offset.isInitialSnapshotRunning()) {
            endSnapshot(offset, snapshotReceiver);
            print(out, json, converters, unwrap, queue);
        }
    }

    /** As the snapshot source ends: the receiver sends the record it holds back (marked the last), the offset leaves snapshot mode. */
    private static void endSnapshot(MongoDbOffsetContext offset, EventDispatcher.SnapshotReceiver<MongoDbPartition> receiver)
            throws Exception {
        receiver.completeSnapshot();
        call(offset, "stopInitialSnapshot");
        offset.preSnapshotCompletion();
        offset.postSnapshotCompletion();
    }

    /** The records the dispatcher has queued (as the task's poll drains them), one JSON line each. */
    private static void print(PrintStream out, ObjectMapper json, Map<String, JsonConverter> converters,
                              ExtractNewDocumentState<SourceRecord> unwrap, ChangeEventQueue<DataChangeEvent> queue)
            throws Exception {
        while (queue.totalCapacity() > queue.remainingCapacity()) {
            for (DataChangeEvent event : queue.poll()) {
                out.println(json.writeValueAsString(record(converters, unwrap, event.getRecord())));
            }
        }
    }

    private static Map<String, Object> record(Map<String, JsonConverter> converters, ExtractNewDocumentState<SourceRecord> unwrap,
                                              SourceRecord source) {
        Map<String, Object> record = new HashMap<>();
        String topic = source.topic();
        record.put("topic", topic);
        for (String suffix : new String[]{ "", "_bare" }) {
            record.put("key" + suffix, text(converters.get("key" + suffix).fromConnectData(topic, source.keySchema(), source.key())));
            record.put("value" + suffix, source.value() == null ? null
                    : text(converters.get("value" + suffix).fromConnectData(topic, source.valueSchema(), source.value())));
        }
        List<List<String>> headers = new ArrayList<>();
        for (Header header : source.headers()) {
            headers.add(java.util.Arrays.asList(header.key(), header.value() == null ? null : header.value().toString()));
        }
        record.put("headers", headers);
        if (unwrap != null) {
            // As Kafka Connect runs a connector's transforms: on the source record, before the converters.
            SourceRecord unwrapped = unwrap.apply(source);
            record.put("unwrapped", unwrapped != null);
            if (unwrapped != null) {
                for (String suffix : new String[]{ "", "_bare" }) {
                    record.put("unwrapped_key" + suffix,
                            text(converters.get("key" + suffix).fromConnectData(topic, unwrapped.keySchema(), unwrapped.key())));
                    record.put("unwrapped_value" + suffix, unwrapped.value() == null ? null
                            : text(converters.get("value" + suffix).fromConnectData(topic, unwrapped.valueSchema(), unwrapped.value())));
                }
            }
        }
        return record;
    }

    /** A method of the offset context that only the connector's own package may call (as its snapshot source does). */
    private static void call(MongoDbOffsetContext offset, String method) throws Exception {
        java.lang.reflect.Method m = MongoDbOffsetContext.class.getDeclaredMethod(method);
        m.setAccessible(true);
        m.invoke(offset);
    }

    private static String text(byte[] bytes) {
        return bytes == null ? null : new String(bytes, StandardCharsets.UTF_8);
    }
}
