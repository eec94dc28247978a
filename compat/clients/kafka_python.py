"""kafka-python (3.x, and 2.x when its directory is first on PYTHONPATH): one adapter for both lines.

Where the two differ it says so: 2.x admin calls return raw responses instead of raising, and 2.x has no
IncrementalAlterConfigs, so ``alter_configs`` merges with the topic's current dynamic configs as the
non-incremental AlterConfigs request requires (kafka-python 3 does the same on old brokers).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import kafka
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, NewPartitions, NewTopic
from kafka.errors import KafkaError, ProducerFencedError
from kafka.structs import OffsetAndMetadata

from compat.clients.api import (
    AUTHENTICATION_FAILED,
    FENCED,
    Adapter,
    AuthenticationFailures,
    ClientError,
    Json,
    Unsupported,
    consumed_record,
    errno_error,
    raise_error_codes,
    send_arguments,
    set_on_topic,
)

V2 = kafka.__version__.startswith("2.")
T = TypeVar("T")
CODECS = {"none": None, "gzip": "gzip", "snappy": "snappy", "lz4": "lz4", "zstd": "zstd"}


# kafka-python's names for the suite's security settings (compat/clients/api.py).
SECURITY_OPTIONS = {
    "security_protocol": "security_protocol",
    "sasl_mechanism": "sasl_mechanism",
    "sasl_username": "sasl_plain_username",
    "sasl_password": "sasl_plain_password",
    "ssl_cafile": "ssl_cafile",
    "ssl_certfile": "ssl_certfile",
    "ssl_keyfile": "ssl_keyfile",
}


def connection_options(security: dict[str, str]) -> dict[str, Any]:
    options = {SECURITY_OPTIONS[key]: value for key, value in security.items()}
    if security and not V2:
        # A refused authentication ends only at this timeout (30 s by default; 2.x: the producer's max_block_ms);
        # a good bootstrap takes milliseconds, so the refusal scenarios need not wait longer.
        options["bootstrap_timeout_ms"] = 5000
    return options


class UnansweredAuthentications(AuthenticationFailures):
    """kafka-python 3 also loses the refusal itself: its transport aborts on the end of the stream before handing
    over the bytes read with it, and both brokers close the connection right after answering a refused
    SaslAuthenticate, so the answer often goes unread ("socket disconnected"). A SaslAuthenticate the broker
    answered by closing the connection is that refusal (its requests and answers are logged at DEBUG)."""

    def __init__(self) -> None:
        super().__init__("kafka")
        logging.getLogger("kafka.net.connection").setLevel(logging.DEBUG)
        self.authenticating = False

    def emit(self, record: logging.LogRecord) -> None:
        super().emit(record)
        message = record.getMessage()
        if "SaslAuthenticateRequest(" in message:
            self.authenticating = True
        elif "SaslAuthenticateResponse(" in message:
            self.authenticating = False
        elif self.authenticating and "Connection lost" in message:
            self.authenticating = False
            self.seen = self.seen or f"the broker closed the connection in answer to SaslAuthenticate: {message}"


class KafkaPythonAdapter(Adapter):
    def __init__(self, bootstrap: str) -> None:
        super().__init__(bootstrap)
        self._admin: KafkaAdminClient | None = None
        self.options = connection_options(self.security)
        sasl = "sasl_mechanism" in self.security
        self.auth_failures = UnansweredAuthentications() if sasl and not V2 else AuthenticationFailures("kafka")

    def _error(self, exc: KafkaError) -> ClientError:
        """The error by Kafka's name; a timeout after a refused authentication is that refusal."""
        if self.auth_failures.seen is not None and not getattr(exc, "errno", None):
            return ClientError(AUTHENTICATION_FAILED, self.auth_failures.seen)
        return errno_error(exc)

    def _connected(self, make: Callable[[], T]) -> T:
        try:
            return make()
        except KafkaError as exc:
            raise self._error(exc) from None

    def version(self) -> str:
        return kafka.__version__

    @property
    def admin(self) -> KafkaAdminClient:
        if self._admin is None:
            self._admin = self._connected(lambda: KafkaAdminClient(bootstrap_servers=self.bootstrap, **self.options))
        return self._admin

    # --- admin ---------------------------------------------------------------------------------------------
    def create_topic(self, topic: str, partitions: int, configs: dict[str, str]) -> None:
        new = NewTopic(topic, partitions, 1, topic_configs=configs)
        try:
            answer = self.admin.create_topics([new])
        except KafkaError as exc:
            raise self._error(exc) from None
        if V2:
            raise_error_codes([(t[0], t[1]) for t in answer.topic_errors])

    def delete_topic(self, topic: str) -> None:
        try:
            answer = self.admin.delete_topics([topic])
        except KafkaError as exc:
            raise self._error(exc) from None
        if V2:
            raise_error_codes(list(answer.topic_error_codes))

    def list_topics(self) -> list[str]:
        return sorted(t for t in self.admin.list_topics() if not t.startswith("__"))

    def describe_topic(self, topic: str) -> list[int]:
        try:
            described = self.admin.describe_topics([topic])[0]
        except KafkaError as exc:
            raise self._error(exc) from None
        raise_error_codes([(topic, described["error_code"])])
        return sorted(p["partition"] if V2 else p["partition_index"] for p in described["partitions"])

    def create_partitions(self, topic: str, total: int) -> None:
        try:
            answer = self.admin.create_partitions({topic: NewPartitions(total_count=total)})
        except KafkaError as exc:
            raise self._error(exc) from None
        if V2:
            raise_error_codes([(t[0], t[1]) for t in answer.topic_errors])

    def _all_configs(self, topic: str) -> dict[str, tuple[str | None, bool]]:
        """name -> (value, set on the topic itself)."""
        resource = ConfigResource(ConfigResourceType.TOPIC, topic)
        if V2:
            # (error_code, error_message, resource_type, resource_name, entries); entries: (name, value,
            # read_only, config_source or is_default, is_sensitive, ...).
            answer = self.admin.describe_configs([resource])[0].resources[0]
            raise_error_codes([(topic, answer[0])])
            return {e[0]: (e[1], set_on_topic(e[3])) for e in answer[4]}
        described = self.admin.describe_configs([resource], config_filter="all")["topic"][topic]
        return {name: (e["value"], e["config_source"] == "DYNAMIC_TOPIC_CONFIG") for name, e in described.items()}

    def describe_configs(self, topic: str, names: list[str]) -> dict[str, str | None]:
        try:
            everything = self._all_configs(topic)
        except KafkaError as exc:
            raise self._error(exc) from None
        return {name: everything[name][0] for name in names if name in everything}

    def alter_configs(self, topic: str, configs: dict[str, str]) -> None:
        try:
            if V2:
                current = {k: v for k, (v, on_topic) in self._all_configs(topic).items() if on_topic}
                answer = self.admin.alter_configs(
                    [ConfigResource(ConfigResourceType.TOPIC, topic, {**current, **configs})]
                )
                raise_error_codes([(topic, r[0]) for r in answer.resources])
            else:
                self.admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, dict(configs))])
        except KafkaError as exc:
            raise self._error(exc) from None

    # --- producing -----------------------------------------------------------------------------------------
    def producer_open(self, settings: dict[str, Json]) -> int:
        options: dict[str, Any] = {"compression_type": CODECS[settings.get("codec") or "none"]}
        if self.security and V2:
            options["max_block_ms"] = 5000  # 2.x waits this long (60 s by default) after a refused authentication
        if settings.get("idempotent") is not None:
            options["enable_idempotence"] = settings["idempotent"]
        if settings.get("max_request_bytes"):
            options["max_request_size"] = settings["max_request_bytes"]
        producer = self._connected(lambda: KafkaProducer(bootstrap_servers=self.bootstrap, **self.options, **options))
        return self._keep("producer", producer)

    def producer_send(self, handle: int, topic: str, records: list[dict[str, Json]]) -> list[list[int]]:
        producer: KafkaProducer = self._get(handle)
        if any(v is None for r in records for _, v in r.get("headers") or []):
            raise Unsupported("kafka-python cannot send a header without a value")
        try:
            futures = [producer.send(topic, **send_arguments(r)) for r in records]
            producer.flush(60)
            return [[m.partition, m.offset] for m in (f.get(60) for f in futures)]
        except KafkaError as exc:
            raise self._error(exc) from None

    def producer_close(self, handle: int) -> None:
        self._drop(handle).close(10)

    # --- transactions (kafka-python 2.1 and later have a transactional producer) ---------------------------
    def _txn(self, call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except ProducerFencedError as exc:
            raise ClientError(FENCED, str(exc)) from None
        except KafkaError as exc:
            raise self._error(exc) from None

    def txn_producer_open(self, transactional_id: str, settings: dict[str, Json]) -> int:
        options: dict[str, Any] = {"transactional_id": transactional_id}
        if settings.get("transaction_timeout_ms"):
            options["transaction_timeout_ms"] = settings["transaction_timeout_ms"]
        producer = self._txn(lambda: KafkaProducer(bootstrap_servers=self.bootstrap, **self.options, **options))
        self._txn(producer.init_transactions)
        return self._keep("producer", producer)

    def txn_begin(self, handle: int) -> None:
        self._txn(self._get(handle).begin_transaction)

    def txn_send(self, handle: int, topic: str, records: list[dict[str, Json]]) -> list[list[int]]:
        producer: KafkaProducer = self._get(handle)

        def send() -> list[list[int]]:
            futures = [producer.send(topic, **send_arguments(r)) for r in records]
            producer.flush(60)
            return [[m.partition, m.offset] for m in (f.get(60) for f in futures)]

        return self._txn(send)

    def txn_send_offsets(self, handle: int, group: str, topic: str, offsets: dict[str, int]) -> None:
        positions = {TopicPartition(topic, int(p)): OffsetAndMetadata(o, "", -1) for p, o in offsets.items()}
        self._txn(self._get(handle).send_offsets_to_transaction, positions, group)

    def txn_commit(self, handle: int) -> None:
        self._txn(self._get(handle).commit_transaction)

    def txn_abort(self, handle: int) -> None:
        self._txn(self._get(handle).abort_transaction)

    # --- reading by position -------------------------------------------------------------------------------
    def _consumer(self, **options: Any) -> KafkaConsumer:
        return self._connected(
            lambda: KafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False, **self.options, **options)
        )

    def read(
        self, topic: str, partition: int, offset: int, count: int, settings: dict[str, Json]
    ) -> list[dict[str, Json]]:
        options = {}
        if settings.get("max_partition_fetch_bytes"):
            options["max_partition_fetch_bytes"] = settings["max_partition_fetch_bytes"]
        if settings.get("isolation_level"):
            options["isolation_level"] = settings["isolation_level"]
        consumer = self._consumer(**options)
        try:
            tp = TopicPartition(topic, partition)
            consumer.assign([tp])
            consumer.seek(tp, offset)
            out: list[dict[str, Json]] = []
            deadline = time.monotonic() + settings.get("timeout_ms", 15000) / 1000
            while len(out) < count and time.monotonic() < deadline:
                for batch in consumer.poll(200).values():
                    out.extend(consumed_record(r) for r in batch)
            return out[:count]
        finally:
            consumer.close()

    def offsets_for_times(self, topic: str, timestamps: dict[str, int]) -> dict[str, int | None]:
        consumer = self._consumer()
        try:
            found = consumer.offsets_for_times({TopicPartition(topic, int(p)): ts for p, ts in timestamps.items()})
            return {str(tp.partition): (None if at is None else at.offset) for tp, at in found.items()}
        except KafkaError as exc:
            raise self._error(exc) from None
        finally:
            consumer.close()

    def list_offsets(self, topic: str, partitions: list[int], spec: str) -> dict[str, int]:
        consumer = self._consumer()
        try:
            tps = [TopicPartition(topic, p) for p in partitions]
            found = consumer.beginning_offsets(tps) if spec == "earliest" else consumer.end_offsets(tps)
            return {str(tp.partition): offset for tp, offset in found.items()}
        finally:
            consumer.close()

    # --- consumer groups -----------------------------------------------------------------------------------
    def consumer_open(self, group: str, topics: list[str], settings: dict[str, Json]) -> int:
        consumer = self._consumer(
            group_id=group,
            auto_offset_reset="earliest",
            session_timeout_ms=settings["session_timeout_ms"],
            heartbeat_interval_ms=settings["heartbeat_interval_ms"],
        )
        consumer.subscribe(topics)
        # kafka-python 3.0.12 can lose a leader's rejoin when its first assignment ran before it knew the
        # topic, leaving the member expired for good (tests/groups/classic_member.py says how); loading the
        # topic's metadata before the first join avoids that rejoin.
        consumer.topics()
        return self._keep("consumer", consumer)

    def consumer_poll(self, handle: int, timeout_ms: int) -> dict[str, Json]:
        consumer: KafkaConsumer = self._get(handle)
        try:  # a refusal of the group (GROUP_AUTHORIZATION_FAILED at FindCoordinator) is raised by poll
            batches = consumer.poll(timeout_ms)
        except KafkaError as exc:
            raise self._error(exc) from None
        records = [consumed_record(r) for batch in batches.values() for r in batch]
        assignment = sorted([tp.topic, tp.partition] for tp in consumer.assignment())
        return {"records": records, "assignment": assignment}

    def consumer_commit(self, handle: int) -> None:
        try:
            self._get(handle).commit()
        except KafkaError as exc:
            raise self._error(exc) from None

    def consumer_close(self, handle: int) -> None:
        self._drop(handle).close()

    def shutdown(self) -> None:
        super().shutdown()
        if self._admin is not None:
            self._admin.close()
