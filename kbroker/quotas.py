"""Client quotas: the quotas of the metadata image (AlterClientQuotas/DescribeClientQuotas) and their enforcement
by throttling.

What is kept, as in Kafka, are ClientQuotaRecords in the metadata log: quotas per entity, an entity being a user,
a client id, both, or an IP, each either named or the default (name None). User and client-id entities take
``producer_byte_rate``, ``consumer_byte_rate``, ``request_percentage`` and ``controller_mutation_rate``; IP entities
take ``connection_creation_rate``. ``alter_records`` validates exactly as Kafka 4.3's controller does
(ClientQuotaControlManager) and gives the records the controller commits; ``describe`` filters the image's
quotas as Kafka's metadata image does (ClientQuotasImage). ``ClientQuotas`` is a MetadataCache subscriber: each
image whose quotas changed replaces the quotas it enforces. Older kbrokers kept the quotas in the checked file
``client-quotas`` (``read_quotas_file``); it is moved into the metadata log once at start-up
(kbroker/metadata/migration.py).

What is enforced, as Kafka's quota managers do (ClientQuotaManager, ClientRequestQuotaManager, ConnectionQuotas):

- Resolution: a connection's quota for a key is the first entity in Kafka's precedence order that sets that key
  (user+client-id, user+default client-id, user, default user+client-id, default user+default client-id, default
  user, client-id, default client-id); the user is the principal's name (ANONYMOUS without SASL). The entity found
  also decides who shares the measured rate: a user quota is shared by all that user's clients, a client-id quota
  by every connection with that client id, a user+client-id quota by that pair (Kafka's metric tags).
- Measurement: a rate over ``quota.window.num`` samples of ``quota.window.size.seconds`` each (Kafka's Rate over
  a SampledStat), recorded per request. Produce records the request's size, Fetch its response's size, and every
  request its handler's time (100 = one thread busy all the time, as ``request_percentage`` is defined).
- Throttle: once the rate is above the quota, ``(rate - quota) / quota * window`` milliseconds, the time after which
  the rate falls back to the quota if nothing more is sent. The request quota's throttle is capped at one sample
  window (Kafka's boundedThrottleTime); the byte rates' are not. The connection layer puts the time in the
  response's throttle_time_ms and stops reading from the connection for that long (KIP-219).
- ``connection_creation_rate`` per IP: a connection accepted over the rate is closed after the throttle time.
- ``controller_mutation_rate`` (KIP-599) is refused with INVALID_REQUEST: kbroker does not throttle topic creation
  and deletion, and a quota that is stored but not applied would mislead.

The core of the broker never imports the network layer: this module is given sizes and times, and answers
throttle times in milliseconds. With no quota set, ``enforcing`` is False and the connection layer asks nothing.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from kbroker.durable.files import DamagedFileError, read_checked, write_checked
from kbroker.java_hashing import copied_map_capacity, java_hashmap_order, java_string_hash
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from kbroker.metadata.image import MetadataDelta, MetadataImage
    from protocol.metadata_frame import MetadataRecord

log = logging.getLogger("kbroker.quotas")

USER, CLIENT_ID, IP = "user", "client-id", "ip"
PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
CONTROLLER_MUTATION_RATE = "controller_mutation_rate"
CONNECTION_CREATION_RATE = "connection_creation_rate"

# Kafka's QuotaConfig: the keys each kind of entity takes, with their ConfigDef types.
USER_AND_CLIENT_KEYS = {
    PRODUCER_BYTE_RATE: "LONG",
    CONSUMER_BYTE_RATE: "LONG",
    REQUEST_PERCENTAGE: "DOUBLE",
    CONTROLLER_MUTATION_RATE: "DOUBLE",
}
IP_KEYS = {CONNECTION_CREATION_RATE: "INT"}
ENFORCED_CLIENT_KEYS = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE)
NOT_ENFORCED = {
    CONTROLLER_MUTATION_RATE: (
        "kbroker does not enforce controller_mutation_rate (KIP-599): CreateTopics, CreatePartitions and "
        "DeleteTopics are not throttled, so the quota is refused rather than stored unapplied"
    ),
}
_LONG_MAX = float(2**63 - 1)
_INT_MAX = float(2**31 - 1)

MATCH_EXACT, MATCH_DEFAULT, MATCH_ANY = 0, 1, 2

QUOTAS_FILE = "client-quotas"  # where older kbrokers kept the quotas (migrated at start-up)
QUOTAS_KIND = "client-quotas"
QUOTAS_FORMAT_VERSION = 1

# An entity as stored: its (type, name) parts sorted by type; a None name is the default entity of that type
# (the metadata image's QuotaEntity).
Entity = tuple[tuple[str, str | None], ...]
# An AlterClientQuotas entry: the entity's parts as sent, then (key, value) ops, value None to remove.
QuotaEntry = tuple[Sequence[tuple[str, str | None]], Sequence[tuple[str, float | None]]]


def entity_of(parts: Iterable[tuple[str, str | None]]) -> Entity:
    """The entity named by ``parts`` (a repeated type keeps its last name, as Kafka's entity map does)."""
    return tuple(sorted(dict(parts).items()))


# --- Kafka's orders ----------------------------------------------------------------------------------------------
# Kafka builds its answers from Java HashMaps, so their order is the maps' bucket order; these reproduce it for
# the maps whose capacity follows from the request alone (the response's entity parts, quota values, the errors
# of one AlterClientQuotas), so the answers come in the order Kafka gives (kbroker/java_hashing.py).


def entity_hash(parts: Iterable[tuple[str, str | None]]) -> int:
    """Kafka's ClientQuotaEntity.hashCode: Objects.hash of its map, 31 + the map's hash (the sum of each type's
    hash XOR its name's)."""
    return (31 + sum(java_string_hash(t) ^ java_string_hash(n) for t, n in parts)) & 0xFFFFFFFF


def entity_parts_in_kafka_order(
    parts: Sequence[tuple[str, str | None]], capacity: int = 2
) -> list[tuple[str, str | None]]:
    """An entity's parts as Kafka lists them: a map from type to name (a repeated type keeps its first place and
    its last name) created with ``capacity`` slots (the number of parts sent; 2 for a stored entity)."""
    distinct = list(dict(parts).items())
    return java_hashmap_order(distinct, lambda part: java_string_hash(part[0]), capacity)


def values_in_kafka_order(values: dict[str, float]) -> list[tuple[str, float]]:
    """An entity's quota values as Kafka's metadata image lists them (a map copied from the stored one)."""
    keys = java_hashmap_order(list(values), java_string_hash, copied_map_capacity(len(values)))
    return [(key, values[key]) for key in keys]


def describe_entity(parts: Sequence[tuple[str, str | None]]) -> str:
    """Java's ClientQuotaEntity.toString, as Kafka's error messages show an entity."""
    inner = ", ".join(f"{t}={'null' if n is None else n}" for t, n in parts)
    return f"ClientQuotaEntity(entries={{{inner}}})"


# --- rates ---------------------------------------------------------------------------------------------------------


class RateSensor:
    """Kafka's Rate over a SampledStat: ``samples`` slots of ``window_ms`` each, reused round-robin.

    A sample is [start_ms, value]. A record goes to the current sample unless that one is a whole window old,
    in which case the next slot is started; samples older than samples * window are reset before measuring.
    The rate divides the sum by the time from the oldest sample's start to now, counting at least samples - 1
    whole windows, so a burst right after a quiet period is measured over the full window, never over 1 ms.
    """

    __slots__ = ("_samples", "_current", "last_record_ms")

    def __init__(self) -> None:
        self._samples: list[list[float]] = []
        self._current = 0
        self.last_record_ms = 0.0

    def record(self, value: float, now_ms: float, window_ms: float, samples: int) -> None:
        if not self._samples:
            self._samples.append([now_ms, 0.0])
        sample = self._samples[self._current]
        if now_ms - sample[0] >= window_ms:
            self._current = (self._current + 1) % samples
            if self._current >= len(self._samples):
                sample = [now_ms, 0.0]
                self._samples.append(sample)
            else:
                sample = self._samples[self._current]
                sample[0], sample[1] = now_ms, 0.0
        sample[1] += value
        self.last_record_ms = now_ms

    def _purge(self, now_ms: float, window_ms: float, samples: int) -> None:
        expire_age = samples * window_ms
        for sample in self._samples:
            if now_ms - sample[0] >= expire_age:
                sample[0], sample[1] = now_ms, 0.0

    def window_size_ms(self, now_ms: float, window_ms: float, samples: int) -> float:
        self._purge(now_ms, window_ms, samples)
        oldest = min((sample[0] for sample in self._samples), default=now_ms)
        elapsed = now_ms - oldest
        full_windows = int(elapsed // window_ms)
        if full_windows < samples - 1:
            elapsed += (samples - 1 - full_windows) * window_ms
        return max(elapsed, 1.0)

    def rate(self, now_ms: float, window_ms: float, samples: int) -> float:
        """Per second."""
        size = self.window_size_ms(now_ms, window_ms, samples)
        return sum(sample[1] for sample in self._samples) / (size / 1000)

    def throttle_ms(self, limit: float, now_ms: float, window_ms: float, samples: int) -> int:
        """Kafka's throttle time for this rate against ``limit``: 0 while the rate is within it."""
        size = self.window_size_ms(now_ms, window_ms, samples)
        rate = sum(sample[1] for sample in self._samples) / (size / 1000)
        if rate <= limit or not math.isfinite(limit) or limit <= 0:
            return 0
        throttle = (rate - limit) / limit * size
        return round(throttle) if math.isfinite(throttle) else 0


# --- the store -----------------------------------------------------------------------------------------------------


class AlterResult(NamedTuple):
    """One entity's answer to AlterClientQuotas: its parts as Kafka echoes them, and the error if any."""

    parts: list[tuple[str, str | None]]
    error: ErrorCode
    message: str | None


QuotaAlterResult = tuple[Entity, AlterResult]


class QuotaFilterError(Exception):
    """A DescribeClientQuotas filter Kafka refuses as a whole, with its error code and message."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _value_problem(key: str, value: float, keys: dict[str, str]) -> str | None:
    """Kafka's validateQuotaKeyValue: the message of what is wrong with setting ``key`` to ``value``."""
    value_type = keys.get(key)
    if value_type is None:
        return f"Invalid configuration key {key}"
    if value <= 0.0:
        return f"Quota {key} must be greater than 0"
    if value_type == "DOUBLE":
        return None
    if value_type == "INT" and value > _INT_MAX:
        return f"Proposed value for {key} is too large for an INT."
    if value_type == "LONG" and value > _LONG_MAX:
        return f"Proposed value for {key} is too large for a LONG."
    if abs(math.fmod(value, 1.0)) > 1e-6:  # NaN passes, as in Kafka
        return f"{key} cannot be a fractional value."
    return None


# The precedence of user and client-id quotas (Kafka's DefaultQuotaCallback): the entity to look for given the user
# and client id, and the metric tags (who shares the rate) that finding it gives. "" in a tag: not part of it.
def _precedence(user: str, client_id: str) -> list[tuple[Entity, tuple[str, str]]]:
    both = (user, client_id)
    return [
        (((CLIENT_ID, client_id), (USER, user)), both),
        (((CLIENT_ID, None), (USER, user)), both),
        (((USER, user),), (user, "")),
        (((CLIENT_ID, client_id), (USER, None)), both),
        (((CLIENT_ID, None), (USER, None)), both),
        (((USER, None),), (user, "")),
        (((CLIENT_ID, client_id),), ("", client_id)),
        (((CLIENT_ID, None),), ("", client_id)),
    ]


Resolved = tuple[tuple[str, str], float] | None  # (metric tags, limit), or no quota


def read_quotas_file(path: Path) -> dict[Entity, dict[str, float]]:
    """The quotas an older kbroker kept in ``path``; DamagedFileError, one line, for a file it cannot read."""
    _, payload = read_checked(path, QUOTAS_KIND, (QUOTAS_FORMAT_VERSION,))
    try:
        document = json.loads(payload)
        return {
            entity_of((str(t), None if n is None else str(n)) for t, n in item["entity"]): {
                str(k): float(v) for k, v in item["quotas"].items()
            }
            for item in document["entities"]
        }
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DamagedFileError(path, f"unreadable client quotas ({exc})") from None


def write_quotas_file(path: Path, quotas: dict[Entity, dict[str, float]]) -> None:
    """A quotas file as older kbrokers wrote it (for tests of the migration)."""
    document = {
        "entities": [
            {"entity": [list(part) for part in entity], "quotas": values}
            for entity, values in sorted(quotas.items(), key=lambda item: repr(item[0]))
        ]
    }
    write_checked(path, QUOTAS_KIND, QUOTAS_FORMAT_VERSION, json.dumps(document).encode())


def quota_record(entity: Entity, key: str, value: float | None) -> MetadataRecord:
    """The ClientQuotaRecord setting (or, for None, removing) ``key`` of ``entity``."""
    from kbroker.metadata.controller import record
    from protocol.metadata_records.client_quota_record import ClientQuotaRecord

    return record(
        ClientQuotaRecord(
            entity=[ClientQuotaRecord.EntityData(entity_type=t, entity_name=n) for t, n in entity],
            key=key,
            value=0.0 if value is None else value,
            remove=value is None,
        )
    )


def _entity_problem(parts: Sequence[tuple[str, str | None]], resolvable: Callable[[str], bool]) -> str | None:
    """Kafka's validateEntity and configKeysForEntityType: what is wrong with the entity, if anything."""
    if not parts:
        return "Invalid empty client quota entity"
    for entity_type, name in parts:
        if entity_type not in (USER, CLIENT_ID, IP):
            return f"Unhandled client quota entity type: {entity_type}"
        if name is not None and not name:
            return f"Empty {entity_type} not supported"
    types = {entity_type for entity_type, _ in parts}
    if IP in types:
        if len(types) > 1:
            return "Invalid quota entity combination, IP entity shouldnot be combined with User or ClientId"
        ip = dict(parts)[IP]
        if ip is not None and not resolvable(ip):
            return f"{ip} is not a valid IP or resolvable host."
    return None


def alter_records(
    image: MetadataImage, entries: Sequence[QuotaEntry], resolvable: Callable[[str], bool] = is_ip_literal
) -> tuple[list[tuple[Entity, AlterResult]], list[MetadataRecord]]:
    """An AlterClientQuotas request against ``image``, as Kafka's ClientQuotaControlManager answers it: one result
    per distinct entity (an entity named twice gets "Ignoring duplicate entity", and the first entry's changes
    still apply, as in Kafka), and the ClientQuotaRecords of the valid entries' changes."""
    results: dict[Entity, AlterResult] = {}
    changes: list[MetadataRecord] = []
    for parts, ops in entries:
        entity = entity_of(parts)
        shown = entity_parts_in_kafka_order(parts, len(parts))
        alterations: dict[str, float | None] = {}
        for key, value in ops:
            if key in alterations:
                results[entity] = AlterResult(shown, ErrorCode.INVALID_REQUEST, "duplicate key")
            else:
                alterations[key] = value
        if entity in results:
            message = f"Ignoring duplicate entity {describe_entity(shown)}"
            results[entity] = AlterResult(shown, ErrorCode.INVALID_REQUEST, message)
            continue
        problem = _entity_problem(shown, resolvable)
        if problem is None:
            keys = IP_KEYS if entity[0][0] == IP else USER_AND_CLIENT_KEYS
            current = image.client_quotas.get(entity, {})
            entity_changes: list[MetadataRecord] = []
            # Kafka walks its map of the ops, so the first problem reported is the first in that map's order.
            for key in java_hashmap_order(list(alterations), java_string_hash, len(ops)):
                value = alterations[key]
                if value is None:
                    if key in current:
                        entity_changes.append(quota_record(entity, key, None))
                    continue
                problem = _value_problem(key, value, keys) or NOT_ENFORCED.get(key)
                if problem is not None:
                    break
                if current.get(key) != value:
                    entity_changes.append(quota_record(entity, key, value))
            if problem is None:
                changes.extend(entity_changes)
        error = ErrorCode.NONE if problem is None else ErrorCode.INVALID_REQUEST
        results[entity] = AlterResult(shown, error, problem)
    return list(results.items()), changes


class ClientQuotas:
    """The quotas of the newest metadata image (``publish``, as a MetadataCache subscriber) and the rates measured
    against them."""

    def __init__(
        self,
        *,
        window_samples: int = 11,
        window_seconds: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window_samples = window_samples
        self.window_ms = window_seconds * 1000.0
        self._clock = clock
        self._quotas: Mapping[Entity, Mapping[str, float]] = {}
        self._resolved: dict[tuple[str, str, str], Resolved] = {}
        self._sensors: dict[tuple[str, str, str], RateSensor] = {}
        self._next_sweep_ms = 0.0
        self.enforcing = False  # any user or client-id quota that is enforced: the connection layer asks
        self.limits_connections = False  # any IP quota: the accept loop asks
        self._refresh()

    def publish(self, image: MetadataImage, delta: MetadataDelta) -> None:
        """A new metadata image: its quotas are enforced from now on (the rates measured so far are kept)."""
        if image.client_quotas is not self._quotas:
            changed = dict(image.client_quotas) != dict(self._quotas)
            self._quotas = image.client_quotas
            self._refresh()
            if changed:
                log.info("client quotas now %s", {entity: dict(values) for entity, values in self._quotas.items()})

    def _refresh(self) -> None:
        self._resolved.clear()
        self.enforcing = any(
            key in ENFORCED_CLIENT_KEYS
            for entity, values in self._quotas.items()
            if entity[0][0] != IP
            for key in values
        )
        self.limits_connections = any(entity[0][0] == IP for entity in self._quotas)

    # --- DescribeClientQuotas ----------------------------------------------------------------------------------

    def describe(
        self, components: Sequence[tuple[str, int, str | None]], strict: bool
    ) -> list[tuple[Entity, dict[str, float]]]:
        """The entities matching a filter of (entity type, match type, match) components, as Kafka's metadata
        image matches them; QuotaFilterError for a filter Kafka refuses."""
        exact: dict[str, str | None] = {}
        of_type: set[str] = set()
        for entity_type, match_type, match in components:
            if not entity_type:
                raise QuotaFilterError(ErrorCode.INVALID_REQUEST, "Invalid empty entity type.")
            if entity_type in exact or entity_type in of_type:
                raise QuotaFilterError(
                    ErrorCode.INVALID_REQUEST, f"Entity type {entity_type} cannot appear more than once in the filter."
                )
            if entity_type not in (USER, CLIENT_ID, IP):
                raise QuotaFilterError(ErrorCode.UNSUPPORTED_VERSION, f"Unsupported entity type {entity_type}")
            if match_type == MATCH_EXACT:
                if match is None:
                    raise QuotaFilterError(
                        ErrorCode.INVALID_REQUEST, "Request specified MATCH_TYPE_EXACT, but set match string to null."
                    )
                exact[entity_type] = match
            elif match_type == MATCH_DEFAULT:
                if match is not None:
                    raise QuotaFilterError(
                        ErrorCode.INVALID_REQUEST,
                        "Request specified MATCH_TYPE_DEFAULT, but also specified a match string.",
                    )
                exact[entity_type] = None
            elif match_type == MATCH_ANY:
                if match is not None:
                    raise QuotaFilterError(
                        ErrorCode.INVALID_REQUEST,
                        "Request specified MATCH_TYPE_SPECIFIED, but also specified a match string.",
                    )
                of_type.add(entity_type)
            else:
                raise QuotaFilterError(ErrorCode.INVALID_REQUEST, f"Unknown match type {match_type}")
        named = set(exact) | of_type
        if IP in named and (USER in named or CLIENT_ID in named):
            raise QuotaFilterError(
                ErrorCode.INVALID_REQUEST,
                "Invalid entity filter component combination. IP filter component should not be used with user or "
                "clientId filter component.",
            )
        if not named and strict:
            return []  # Kafka: nothing to match strictly
        matches = []
        for entity, values in self._quotas.items():
            parts = dict(entity)
            if any(t not in parts or parts[t] != name for t, name in exact.items()):
                continue
            if any(t not in parts for t in of_type):
                continue
            if strict and len(parts) != len(named):
                continue
            matches.append((entity, dict(values)))
        order = java_hashmap_order([entity for entity, _ in matches], entity_hash, copied_map_capacity(len(matches)))
        by_entity = dict(matches)
        return [(entity, by_entity[entity]) for entity in order]

    # --- enforcement -------------------------------------------------------------------------------------------

    def _resolve(self, key: str, user: str, client_id: str) -> Resolved:
        """The quota on ``key`` for this user and client id, and the metric tags that share it (cached until the
        quotas change: the per-request cost is one dict look-up)."""
        cache_key = (key, user, client_id)
        try:
            return self._resolved[cache_key]
        except KeyError:
            pass
        resolved: Resolved = None
        for entity, tags in _precedence(user, client_id):
            limit = self._quotas.get(entity, {}).get(key)
            if limit is not None:
                resolved = (tags, limit)
                break
        if len(self._resolved) > 100_000:  # client ids are the client's to choose: keep the cache bounded
            self._resolved.clear()
        self._resolved[cache_key] = resolved
        return resolved

    def _now_ms(self) -> float:
        return self._clock() * 1000.0

    def _sensor(self, key: str, tags: tuple[str, str], now_ms: float) -> RateSensor:
        sensor_key = (key, *tags)
        sensor = self._sensors.get(sensor_key)
        if sensor is None:
            if now_ms >= self._next_sweep_ms:
                self._sweep(now_ms)
            sensor = self._sensors[sensor_key] = RateSensor()
        return sensor

    def _sweep(self, now_ms: float) -> None:
        """Forget the rates of clients not seen for a whole quota window (they measure 0 by then anyway)."""
        horizon = now_ms - self.window_samples * self.window_ms
        for sensor_key in [k for k, s in self._sensors.items() if s.last_record_ms < horizon]:
            del self._sensors[sensor_key]
        self._next_sweep_ms = now_ms + self.window_samples * self.window_ms

    def applies(self, key: str, user: str, client_id: str) -> bool:
        """Whether a quota on ``key`` applies to this user and client id."""
        return self._resolve(key, user, client_id) is not None

    def record(self, key: str, user: str, client_id: str, amount: float) -> int:
        """Record ``amount`` (bytes, or percent-seconds for request_percentage) for this user and client id and
        return the throttle time in ms (0 without a quota or within it)."""
        resolved = self._resolve(key, user, client_id)
        if resolved is None:
            return 0
        tags, limit = resolved
        now_ms = self._now_ms()
        sensor = self._sensor(key, tags, now_ms)
        sensor.record(amount, now_ms, self.window_ms, self.window_samples)
        throttle = sensor.throttle_ms(limit, now_ms, self.window_ms, self.window_samples)
        if key == REQUEST_PERCENTAGE:
            throttle = min(throttle, int(self.window_ms))  # Kafka bounds the request quota's throttle
        return throttle

    def record_connection(self, ip: str) -> int:
        """A connection from ``ip`` was accepted: the time to hold it before closing it if it is over the IP's
        connection_creation_rate, else 0 (and then it is not counted, as Kafka unrecords a refused connection)."""
        limit = self._quotas.get(((IP, ip),), {}).get(CONNECTION_CREATION_RATE)
        tags = (ip, "")
        if limit is None:
            limit = self._quotas.get(((IP, None),), {}).get(CONNECTION_CREATION_RATE)
        if limit is None:
            return 0
        now_ms = self._now_ms()
        sensor = self._sensor(CONNECTION_CREATION_RATE, tags, now_ms)
        sensor.record(1.0, now_ms, self.window_ms, self.window_samples)
        throttle = sensor.throttle_ms(limit, now_ms, self.window_ms, self.window_samples)
        if throttle:
            sensor.record(-1.0, now_ms, self.window_ms, self.window_samples)
        return min(throttle, int(self.window_ms))
