"""What a compat client adapter is: the operations scenarios call, as plain JSON-able values.

An adapter runs in a child process of the suite (compat/clients/runner.py for Python adapters, or any
program speaking the same JSON lines, like compat/java/CompatDriver.java), so a group member can be killed
like a crashed application and different versions of one library can be loaded side by side.

Values: a record to send is {"key", "value", "headers": [[name, value or null], ...], "partition",
"timestamp"} (key, value, partition and timestamp may be null: the client decides); a consumed record is
{"topic", "partition", "offset", "timestamp", "key", "value", "headers"}. Keys, values and header values are
UTF-8 text. Offsets maps are keyed by the partition number as a string (JSON object keys).

An operation the client cannot do raises Unsupported (the matrix shows "n/a"); an error the broker or
client reports raises ClientError named after Kafka's error code where there is one (MESSAGE_TOO_LARGE,
TOPIC_ALREADY_EXISTS, ...), so scenarios compare the same names for every client.

Security: a client process started with ``security`` (compat/clients/__init__.py, ClientSpec.start) finds it
as JSON in the KBROKER_COMPAT_SECURITY environment variable, ``Adapter.security``, and gives it to every
producer, consumer and admin client it makes: {"security_protocol": "PLAINTEXT"|"SSL"|"SASL_PLAINTEXT"|
"SASL_SSL", "sasl_mechanism", "sasl_username", "sasl_password", "ssl_cafile" (PEM CA certificates),
"ssl_certfile" and "ssl_keyfile" (PEM client certificate chain and unencrypted key, for mutual TLS)}; absent
keys are not set. A failed authentication is ClientError("SASL_AUTHENTICATION_FAILED") for every client.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from protocol.errors import ErrorCode

Json = Any


class Unsupported(Exception):
    """This client has no way to do this operation."""


FENCED = "PRODUCER_FENCED"  # every client's "a newer producer with this transactional id exists", one name
AUTHENTICATION_FAILED = "SASL_AUTHENTICATION_FAILED"  # every client's "the broker refused my credentials"
SECURITY_ENV = "KBROKER_COMPAT_SECURITY"


class AuthenticationFailures(logging.Handler):
    """kafka-python and aiokafka retry a refused authentication until their bootstrap or request times out,
    and raise only the timeout; the refusal is in their log, which this handler watches (on ``logger``)."""

    def __init__(self, logger: str) -> None:
        super().__init__(logging.DEBUG)
        self.seen: str | None = None
        logging.getLogger(logger).addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "SaslAuthenticationFailed" in message or "Authentication failed" in message:
            self.seen = message


# librdkafka's names for the security settings (confluent-kafka's config, kcat's -X options).
LIBRDKAFKA_SECURITY_OPTIONS = {
    "security_protocol": "security.protocol",
    "sasl_mechanism": "sasl.mechanism",
    "sasl_username": "sasl.username",
    "sasl_password": "sasl.password",
    "ssl_cafile": "ssl.ca.location",
    "ssl_certfile": "ssl.certificate.location",
    "ssl_keyfile": "ssl.key.location",
}


def security_settings() -> dict[str, str]:
    """The process's security settings (see the module docstring); {} for plaintext."""
    return dict(json.loads(os.environ.get(SECURITY_ENV) or "{}"))


class ClientError(Exception):
    """The client reported an error; ``error`` is Kafka's error code name when the client exposes it."""

    def __init__(self, error: str, message: str = "") -> None:
        super().__init__(f"{error}: {message}" if message else error)
        self.error = error
        self.message = message


def error_name(code: int) -> str:
    """Kafka's name for an error code (MESSAGE_TOO_LARGE for 10)."""
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"ERROR_{code}"


def raise_error_codes(pairs: list[tuple[str, int]]) -> None:
    """For clients that hand back raw responses: raise the first non-zero (what, error code) pair."""
    for what, code in pairs:
        if code:
            raise ClientError(error_name(code), what)


def errno_error(exc: Exception) -> ClientError:
    """kafka-python and aiokafka errors: a broker error carries its code in ``errno``."""
    errno = getattr(exc, "errno", None)
    name = error_name(errno) if isinstance(errno, int) and errno > 0 else type(exc).__name__
    return ClientError(name, str(exc))


def consumed_record(record: Any) -> dict[str, Json]:
    """A consumed record of a client whose records have topic, partition, ... attributes (kafka-python, aiokafka)."""
    return {
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp": record.timestamp,
        "key": text(record.key),
        "value": text(record.value),
        "headers": [[k, text(v)] for k, v in record.headers],
    }


def set_on_topic(source_or_is_default: int | bool) -> bool:
    """From a DescribeConfigs entry: was the value set on the topic itself? v0 answers is_default (a bool),
    v1+ config_source (1 is DYNAMIC_TOPIC_CONFIG)."""
    if isinstance(source_or_is_default, bool):
        return not source_or_is_default
    return source_or_is_default == 1


def send_arguments(record: dict[str, Json]) -> dict[str, Any]:
    """A record as keyword arguments of kafka-python's and aiokafka's ``producer.send``."""
    return {
        "key": encode(record.get("key")),
        "value": encode(record.get("value")),
        "headers": [(k, encode(v)) for k, v in record.get("headers") or []],
        "partition": record.get("partition"),
        "timestamp_ms": record.get("timestamp"),
    }


def text(data: bytes | None) -> str | None:
    return None if data is None else data.decode()


def encode(value: str | None) -> bytes | None:
    return None if value is None else value.encode()


class Adapter:
    """The operations; each raises Unsupported unless the adapter implements it.

    Producer settings: {"codec": "none"|"gzip"|"snappy"|"lz4"|"zstd", "idempotent": true|false|null
    (null: the client's default), "max_request_bytes": int|null (the client-side size limit)}.
    Consumer settings: {"session_timeout_ms", "heartbeat_interval_ms"}; group consumers start from the
    earliest offset when the group has no commit, and never commit on their own.
    """

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.security = security_settings()
        self._handles: dict[int, Any] = {}

    # Handles name the producers and consumers an adapter keeps open between calls.
    def _keep(self, kind: str, thing: Any) -> int:
        handle = max(self._handles, default=0) + 1
        self._handles[handle] = (kind, thing)
        return handle

    def _get(self, handle: int) -> Any:
        return self._handles[handle][1]

    def _drop(self, handle: int) -> Any:
        return self._handles.pop(handle)[1]

    def version(self) -> str:
        raise NotImplementedError

    def shutdown(self) -> None:
        """End of the session: close whatever is still open."""
        for handle, (kind, _) in list(self._handles.items()):
            (self.producer_close if kind == "producer" else self.consumer_close)(handle)

    # --- admin ---------------------------------------------------------------------------------------------
    def create_topic(self, topic: str, partitions: int, configs: dict[str, str]) -> None:
        raise Unsupported("create topics")

    def delete_topic(self, topic: str) -> None:
        raise Unsupported("delete topics")

    def list_topics(self) -> list[str]:
        """Topic names, internal topics (__consumer_offsets, ...) left out."""
        raise Unsupported("list topics")

    def describe_topic(self, topic: str) -> list[int]:
        """The topic's partition numbers."""
        raise Unsupported("describe topics")

    def create_partitions(self, topic: str, total: int) -> None:
        raise Unsupported("create partitions")

    def describe_configs(self, topic: str, names: list[str]) -> dict[str, str | None]:
        raise Unsupported("describe configs")

    def alter_configs(self, topic: str, configs: dict[str, str]) -> None:
        """Set these topic configs and leave the others as they are."""
        raise Unsupported("alter configs")

    # --- producing -----------------------------------------------------------------------------------------
    def producer_open(self, settings: dict[str, Json]) -> int:
        raise Unsupported("produce")

    def producer_send(self, handle: int, topic: str, records: list[dict[str, Json]]) -> list[list[int]]:
        """Send in order, wait for every acknowledgement; [partition, offset] per record, in send order."""
        raise Unsupported("produce")

    def producer_close(self, handle: int) -> None:
        raise Unsupported("produce")

    # --- transactions (KIP-98) -----------------------------------------------------------------------------
    def txn_producer_open(self, transactional_id: str, settings: dict[str, Json]) -> int:
        """A transactional producer with its transactions initialised (InitProducerId). Settings:
        {"transaction_timeout_ms": int|null}. A producer fenced by a newer instance with the same
        transactional id raises ClientError("PRODUCER_FENCED") from whichever call notices it."""
        raise Unsupported("transactions")

    def txn_begin(self, handle: int) -> None:
        raise Unsupported("transactions")

    def txn_send(self, handle: int, topic: str, records: list[dict[str, Json]]) -> list[list[int]]:
        """Send inside the open transaction and wait for every acknowledgement, as ``producer_send``."""
        raise Unsupported("transactions")

    def txn_send_offsets(self, handle: int, group: str, topic: str, offsets: dict[str, int]) -> None:
        """sendOffsetsToTransaction: the group's offsets, committed with the transaction."""
        raise Unsupported("transactions")

    def txn_commit(self, handle: int) -> None:
        raise Unsupported("transactions")

    def txn_abort(self, handle: int) -> None:
        raise Unsupported("transactions")

    def describe_producers(self, topic: str, partition: int) -> list[list[int]]:
        """Admin describeProducers: [producer id, epoch, last sequence, ongoing transaction's first offset or
        -1] per active producer of the partition, by producer id."""
        raise Unsupported("describe producers")

    def list_transactions(self) -> list[list[str]]:
        """Admin listTransactions: [transactional id, state name] per transaction, by id."""
        raise Unsupported("list transactions")

    # --- reading by position -------------------------------------------------------------------------------
    def read(
        self, topic: str, partition: int, offset: int, count: int, settings: dict[str, Json]
    ) -> list[dict[str, Json]]:
        """Up to ``count`` records of one partition from ``offset`` (no group). Settings:
        {"max_partition_fetch_bytes": int|null, "timeout_ms": int, "isolation_level":
        "read_committed"|"read_uncommitted"|null (null: the client's default)}."""
        raise Unsupported("read by position")

    def offsets_for_times(self, topic: str, timestamps: dict[str, int]) -> dict[str, int | None]:
        """Per partition, the first offset whose timestamp is >= the given one (null if none)."""
        raise Unsupported("offsets for times")

    def list_offsets(self, topic: str, partitions: list[int], spec: str) -> dict[str, int]:
        """spec "earliest" (log start offset) or "latest" (high watermark)."""
        raise Unsupported("list offsets")

    # --- consumer groups -----------------------------------------------------------------------------------
    def consumer_open(self, group: str, topics: list[str], settings: dict[str, Json]) -> int:
        raise Unsupported("consumer groups")

    def consumer_poll(self, handle: int, timeout_ms: int) -> dict[str, Json]:
        """{"records": [...], "assignment": [[topic, partition], ...]} after one poll."""
        raise Unsupported("consumer groups")

    def consumer_commit(self, handle: int) -> None:
        """Commit the consumer's positions synchronously."""
        raise Unsupported("commit")

    def consumer_close(self, handle: int) -> None:
        """Close: leave the group (LeaveGroup), so it rebalances at once."""
        raise Unsupported("consumer groups")


OPERATIONS = frozenset(
    name for name, value in vars(Adapter).items() if callable(value) and not name.startswith("_")
) - {"version", "shutdown"}
