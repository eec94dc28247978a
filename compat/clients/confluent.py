"""confluent-kafka (librdkafka). Its settings are librdkafka's, with their defaults unless a scenario sets one:
note that librdkafka's default partitioner (consistent_random) is not Java's murmur2."""

from __future__ import annotations

import time
import uuid
from typing import Any

import confluent_kafka
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourceType,
)

from compat.clients.api import (
    AUTHENTICATION_FAILED,
    FENCED,
    LIBRDKAFKA_SECURITY_OPTIONS,
    Adapter,
    ClientError,
    Json,
    error_name,
    text,
)

OFFSET_END = -1  # what offsets_for_times answers for "no such offset"


def security_config(security: dict[str, str]) -> dict[str, Any]:
    config: dict[str, Any] = {LIBRDKAFKA_SECURITY_OPTIONS[key]: value for key, value in security.items()}
    if security:
        # librdkafka retries a refused authentication until a message times out (300 s by default).
        config["message.timeout.ms"] = 10000
    return config


def client_error(error: KafkaError) -> ClientError:
    """Kafka error codes are positive; librdkafka's own (timeouts, local size checks) are negative, and its
    _AUTHENTICATION is Kafka's SASL_AUTHENTICATION_FAILED."""
    code = error.code()
    if code == KafkaError._AUTHENTICATION:
        return ClientError(AUTHENTICATION_FAILED, error.str())
    return ClientError(error_name(code) if code > 0 else error.name(), error.str())


# How librdkafka words a SaslHandshake request that failed on its side ("SASL PLAIN mechanism handshake failed:
# Local: Broker transport failure"): its own errors read "Local: ...", the broker's "Broker: ...".
_HANDSHAKE_GIVEN_UP = "mechanism handshake failed: Local: "


def is_refusal(error: KafkaError) -> bool:
    """Whether error_cb's ``error`` is an authentication the broker refused. librdkafka also reports _AUTHENTICATION
    when it drops a connection of its own in the middle of the SASL handshake (a group coordinator forgotten when
    the consumer closes, or a FindCoordinator answers COORDINATOR_NOT_AVAILABLE): nothing was refused then."""
    return error.code() == KafkaError._AUTHENTICATION and _HANDSHAKE_GIVEN_UP not in error.str()


def txn_error(exc: KafkaException) -> ClientError:
    """librdkafka reports a fenced transactional producer as its own fatal _FENCED error."""
    error = client_error(exc.args[0])
    return ClientError(FENCED, error.message) if error.error == "_FENCED" else error


def wait(futures: dict[Any, Any]) -> dict[Any, Any]:
    try:
        return {key: future.result(60) for key, future in futures.items()}
    except KafkaException as exc:
        raise client_error(exc.args[0]) from None


def consumed(message: Any) -> dict[str, Json]:
    return {
        "topic": message.topic(),
        "partition": message.partition(),
        "offset": message.offset(),
        "timestamp": message.timestamp()[1],
        "key": text(message.key()),
        "value": text(message.value()),
        "headers": [[k, text(v)] for k, v in message.headers() or []],
    }


class ConfluentAdapter(Adapter):
    def __init__(self, bootstrap: str) -> None:
        super().__init__(bootstrap)
        self.connection = {"bootstrap.servers": bootstrap, **security_config(self.security)}
        self.errors: list[KafkaError] = []  # what librdkafka reported to error_cb (a refused authentication)
        self.connection["error_cb"] = self.errors.append
        self.admin = AdminClient(self.connection)

    def authentication_refused(self) -> bool:
        return any(is_refusal(error) for error in self.errors)

    def refused(self) -> None:
        """librdkafka retries a refused authentication and tells only error_cb: raise it as the client's error."""
        for error in self.errors:
            if is_refusal(error):
                raise client_error(error)

    def version(self) -> str:
        return f"{confluent_kafka.__version__} (librdkafka {confluent_kafka.libversion()[0]})"

    # --- admin ---------------------------------------------------------------------------------------------
    def create_topic(self, topic: str, partitions: int, configs: dict[str, str]) -> None:
        wait(self.admin.create_topics([NewTopic(topic, partitions, config=configs)]))

    def delete_topic(self, topic: str) -> None:
        wait(self.admin.delete_topics([topic]))

    def list_topics(self) -> list[str]:
        return sorted(t for t in self.admin.list_topics(timeout=30).topics if not t.startswith("__"))

    def describe_topic(self, topic: str) -> list[int]:
        found = self.admin.list_topics(topic, timeout=30).topics[topic]
        if found.error is not None:
            raise client_error(found.error)
        return sorted(found.partitions)

    def create_partitions(self, topic: str, total: int) -> None:
        wait(self.admin.create_partitions([NewPartitions(topic, total)]))

    def describe_configs(self, topic: str, names: list[str]) -> dict[str, str | None]:
        entries = next(iter(wait(self.admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)])).values()))
        return {name: entries[name].value for name in names if name in entries}

    def alter_configs(self, topic: str, configs: dict[str, str]) -> None:
        changes = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()]
        wait(
            self.admin.incremental_alter_configs(
                [ConfigResource(ResourceType.TOPIC, topic, incremental_configs=changes)]
            )
        )

    # --- producing -----------------------------------------------------------------------------------------
    def producer_open(self, settings: dict[str, Json]) -> int:
        config: dict[str, Any] = {
            **self.connection,
            "compression.type": settings.get("codec") or "none",
        }
        if settings.get("idempotent") is not None:
            config["enable.idempotence"] = settings["idempotent"]
        if settings.get("max_request_bytes"):
            config["message.max.bytes"] = settings["max_request_bytes"]
        return self._keep("producer", Producer(config))

    def producer_send(self, handle: int, topic: str, records: list[dict[str, Json]]) -> list[list[int]]:
        producer: Producer = self._get(handle)
        reports: list[Any] = [None] * len(records)

        def delivered(index: int) -> Any:
            def report(error: KafkaError | None, message: Any) -> None:
                reports[index] = error if error is not None else [message.partition(), message.offset()]

            return report

        for index, r in enumerate(records):
            options: dict[str, Any] = {"headers": [(k, v) for k, v in r.get("headers") or []]}
            if r.get("partition") is not None:
                options["partition"] = r["partition"]
            if r.get("timestamp") is not None:
                options["timestamp"] = r["timestamp"]
            try:
                producer.produce(topic, value=r.get("value"), key=r.get("key"), on_delivery=delivered(index), **options)
            except KafkaException as exc:
                raise client_error(exc.args[0]) from None
            except BufferError:
                producer.poll(0.1)
        deadline = time.monotonic() + 60
        while producer.flush(0.2) > 0 and time.monotonic() < deadline:
            if self.authentication_refused():  # it would retry until message.timeout.ms: report it now
                producer.purge()
                self.refused()
        if any(isinstance(report, KafkaError) for report in reports):
            self.refused()  # the deliveries timed out because the broker refused the credentials
        for report in reports:
            if isinstance(report, KafkaError):
                raise client_error(report)
            if report is None:
                raise ClientError("NOT_DELIVERED", "no delivery report within 60 s")
        return reports

    def producer_close(self, handle: int) -> None:
        self._drop(handle).flush(30)

    # --- transactions --------------------------------------------------------------------------------------
    def txn_producer_open(self, transactional_id: str, settings: dict[str, Json]) -> int:
        config: dict[str, Any] = {**self.connection, "transactional.id": transactional_id}
        if settings.get("transaction_timeout_ms"):
            config["transaction.timeout.ms"] = settings["transaction_timeout_ms"]
        producer = Producer(config)
        try:
            producer.init_transactions(60)
        except KafkaException as exc:
            raise txn_error(exc) from None
        return self._keep("producer", producer)

    def txn_begin(self, handle: int) -> None:
        try:
            self._get(handle).begin_transaction()
        except KafkaException as exc:
            raise txn_error(exc) from None

    def txn_send(self, handle: int, topic: str, records: list[dict[str, Json]]) -> list[list[int]]:
        try:
            return self.producer_send(handle, topic, records)
        except KafkaException as exc:  # flush raises a fatal error (fenced) itself
            raise txn_error(exc) from None
        except ClientError as error:
            raise ClientError(FENCED, error.message) if error.error == "_FENCED" else error from None

    def txn_send_offsets(self, handle: int, group: str, topic: str, offsets: dict[str, int]) -> None:
        # The group's metadata comes from a consumer of that group; one that never joined sends generation -1.
        member = self._consumer(**{"group.id": group})
        try:
            positions = [TopicPartition(topic, int(p), offset) for p, offset in offsets.items()]
            self._get(handle).send_offsets_to_transaction(positions, member.consumer_group_metadata(), 60)
        except KafkaException as exc:
            raise txn_error(exc) from None
        finally:
            member.close()

    def txn_commit(self, handle: int) -> None:
        try:
            self._get(handle).commit_transaction(60)
        except KafkaException as exc:
            raise txn_error(exc) from None

    def txn_abort(self, handle: int) -> None:
        try:
            self._get(handle).abort_transaction(60)
        except KafkaException as exc:
            raise txn_error(exc) from None

    # --- reading by position -------------------------------------------------------------------------------
    def _consumer(self, **config: Any) -> Consumer:
        # librdkafka wants a group id even for assign(); nothing is committed with auto commit off.
        base = {**self.connection, "group.id": f"compat-{uuid.uuid4()}", "enable.auto.commit": False}
        return Consumer({**base, **config})

    def read(
        self, topic: str, partition: int, offset: int, count: int, settings: dict[str, Json]
    ) -> list[dict[str, Json]]:
        config = {}
        if settings.get("max_partition_fetch_bytes"):
            config["max.partition.fetch.bytes"] = settings["max_partition_fetch_bytes"]
        if settings.get("isolation_level"):
            config["isolation.level"] = settings["isolation_level"]
        consumer = self._consumer(**config)
        try:
            consumer.assign([TopicPartition(topic, partition, offset)])
            out: list[dict[str, Json]] = []
            deadline = time.monotonic() + settings.get("timeout_ms", 15000) / 1000
            while len(out) < count and time.monotonic() < deadline:
                self.refused()
                for message in consumer.consume(count - len(out), 0.2):
                    if message.error() is None:
                        out.append(consumed(message))
                    elif message.error().code() != KafkaError._PARTITION_EOF:
                        raise client_error(message.error())
            return out
        finally:
            consumer.close()

    def offsets_for_times(self, topic: str, timestamps: dict[str, int]) -> dict[str, int | None]:
        consumer = self._consumer()
        try:
            found = consumer.offsets_for_times([TopicPartition(topic, int(p), ts) for p, ts in timestamps.items()], 30)
        except KafkaException as exc:
            raise client_error(exc.args[0]) from None
        finally:
            consumer.close()
        return {str(tp.partition): (None if tp.offset == OFFSET_END else tp.offset) for tp in found}

    def list_offsets(self, topic: str, partitions: list[int], spec: str) -> dict[str, int]:
        consumer = self._consumer()
        try:
            marks = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), 30) for p in partitions}
        finally:
            consumer.close()
        return {str(p): low if spec == "earliest" else high for p, (low, high) in marks.items()}

    # --- consumer groups -----------------------------------------------------------------------------------
    def consumer_open(self, group: str, topics: list[str], settings: dict[str, Json]) -> int:
        consumer = Consumer(
            {
                **self.connection,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "session.timeout.ms": settings["session_timeout_ms"],
                "heartbeat.interval.ms": settings["heartbeat_interval_ms"],
            }
        )
        consumer.subscribe(topics)
        return self._keep("consumer", consumer)

    def consumer_poll(self, handle: int, timeout_ms: int) -> dict[str, Json]:
        consumer: Consumer = self._get(handle)
        records = []
        self.refused()
        for message in consumer.consume(500, timeout_ms / 1000):
            if message.error() is None:
                records.append(consumed(message))
            elif message.error().code() != KafkaError._PARTITION_EOF:
                raise client_error(message.error())
        assignment = sorted([tp.topic, tp.partition] for tp in consumer.assignment())
        return {"records": records, "assignment": assignment}

    def consumer_commit(self, handle: int) -> None:
        try:
            self._get(handle).commit(asynchronous=False)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError._NO_OFFSET:  # nothing consumed since the last commit
                raise client_error(exc.args[0]) from None

    def consumer_close(self, handle: int) -> None:
        self._drop(handle).close()
