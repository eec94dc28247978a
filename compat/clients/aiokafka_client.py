"""aiokafka. It is asyncio-only: its event loop runs on a thread of the client process for the whole session,
so group members keep heartbeating between the suite's calls. Its admin client returns raw responses and
has only the non-incremental AlterConfigs, so ``alter_configs`` merges with the topic's current configs."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Coroutine
from typing import Any

import aiokafka
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError, ProducerFenced, SaslAuthenticationFailed
from aiokafka.helpers import create_ssl_context

from compat.clients.api import (
    AUTHENTICATION_FAILED,
    FENCED,
    Adapter,
    AuthenticationFailures,
    ClientError,
    Json,
    consumed_record,
    errno_error,
    raise_error_codes,
    send_arguments,
    set_on_topic,
)


def connection_options(security: dict[str, str]) -> dict[str, Any]:
    """aiokafka's names for the suite's security settings (compat/clients/api.py); TLS through an SSLContext."""
    options: dict[str, Any] = {}
    if "security_protocol" in security:
        options["security_protocol"] = security["security_protocol"]
    if "sasl_mechanism" in security:
        options["sasl_mechanism"] = security["sasl_mechanism"]
        options["sasl_plain_username"] = security["sasl_username"]
        options["sasl_plain_password"] = security["sasl_password"]
    if "ssl_cafile" in security:
        options["ssl_context"] = create_ssl_context(
            cafile=security["ssl_cafile"], certfile=security.get("ssl_certfile"), keyfile=security.get("ssl_keyfile")
        )
    return options


class AiokafkaAdapter(Adapter):
    def __init__(self, bootstrap: str) -> None:
        super().__init__(bootstrap)
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="aiokafka-loop", daemon=True).start()
        self._admin: AIOKafkaAdminClient | None = None
        self.options = connection_options(self.security)
        self.auth_failures = AuthenticationFailures("aiokafka")

    def run(self, work: Coroutine[Any, Any, Any]) -> Any:
        try:
            return asyncio.run_coroutine_threadsafe(work, self.loop).result()
        except ProducerFenced as exc:
            raise ClientError(FENCED, str(exc)) from None
        except KafkaError as exc:
            if isinstance(exc, SaslAuthenticationFailed):
                raise ClientError(AUTHENTICATION_FAILED, str(exc)) from None
            if self.auth_failures.seen is not None and not getattr(exc, "errno", None):  # a connection error
                raise ClientError(AUTHENTICATION_FAILED, self.auth_failures.seen) from None
            raise errno_error(exc) from None

    def version(self) -> str:
        return aiokafka.__version__

    async def admin(self) -> AIOKafkaAdminClient:
        if self._admin is None:
            self._admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, **self.options)
            await self._admin.start()
        return self._admin

    # --- admin ---------------------------------------------------------------------------------------------
    def create_topic(self, topic: str, partitions: int, configs: dict[str, str]) -> None:
        async def work() -> Any:
            return await (await self.admin()).create_topics([NewTopic(topic, partitions, 1, topic_configs=configs)])

        raise_error_codes([(t[0], t[1]) for t in self.run(work()).topic_errors])

    def delete_topic(self, topic: str) -> None:
        async def work() -> Any:
            return await (await self.admin()).delete_topics([topic])

        raise_error_codes(list(self.run(work()).topic_error_codes))

    def list_topics(self) -> list[str]:
        async def work() -> list[str]:
            return await (await self.admin()).list_topics()

        return sorted(t for t in self.run(work()) if not t.startswith("__"))

    def describe_topic(self, topic: str) -> list[int]:
        async def work() -> list[Any]:
            return await (await self.admin()).describe_topics([topic])

        described = self.run(work())[0]
        raise_error_codes([(topic, described["error_code"])])
        return sorted(p["partition"] for p in described["partitions"])

    def create_partitions(self, topic: str, total: int) -> None:
        async def work() -> Any:
            return await (await self.admin()).create_partitions({topic: NewPartitions(total_count=total)})

        self.run(work())

    def _all_configs(self, topic: str) -> dict[str, tuple[str | None, bool]]:
        """name -> (value, set on the topic itself)."""

        async def work() -> list[Any]:
            return await (await self.admin()).describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])

        # (error_code, error_message, resource_type, resource_name, entries); an entry's fourth field is
        # is_default (v0) or config_source (v1+).
        resource = self.run(work())[0].resources[0]
        raise_error_codes([(topic, resource[0])])
        return {e[0]: (e[1], set_on_topic(e[3])) for e in resource[4]}

    def describe_configs(self, topic: str, names: list[str]) -> dict[str, str | None]:
        everything = self._all_configs(topic)
        return {name: everything[name][0] for name in names if name in everything}

    def alter_configs(self, topic: str, configs: dict[str, str]) -> None:
        current = {k: v for k, (v, on_topic) in self._all_configs(topic).items() if on_topic}

        async def work() -> list[Any]:
            resource = ConfigResource(ConfigResourceType.TOPIC, topic, {**current, **configs})
            return await (await self.admin()).alter_configs([resource])

        raise_error_codes([(topic, r[0]) for answer in self.run(work()) for r in answer.resources])

    # --- producing -----------------------------------------------------------------------------------------
    def producer_open(self, settings: dict[str, Json]) -> int:
        options: dict[str, Any] = {
            "compression_type": None if settings.get("codec") in (None, "none") else settings["codec"]
        }
        if settings.get("idempotent") is not None:
            options["enable_idempotence"] = settings["idempotent"]
        if settings.get("max_request_bytes"):
            options["max_request_size"] = settings["max_request_bytes"]

        async def work() -> AIOKafkaProducer:
            producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, **self.options, **options)
            await producer.start()
            return producer

        return self._keep("producer", self.run(work()))

    def producer_send(self, handle: int, topic: str, records: list[dict[str, Json]]) -> list[list[int]]:
        producer: AIOKafkaProducer = self._get(handle)

        async def work() -> list[list[int]]:
            futures = [await producer.send(topic, **send_arguments(r)) for r in records]
            return [[m.partition, m.offset] for m in await asyncio.gather(*futures)]

        return self.run(work())

    def producer_close(self, handle: int) -> None:
        self.run(self._drop(handle).stop())

    # --- transactions --------------------------------------------------------------------------------------
    def txn_producer_open(self, transactional_id: str, settings: dict[str, Json]) -> int:
        options: dict[str, Any] = {"transactional_id": transactional_id}
        if settings.get("transaction_timeout_ms"):
            options["transaction_timeout_ms"] = settings["transaction_timeout_ms"]

        async def work() -> AIOKafkaProducer:
            producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, **self.options, **options)
            await producer.start()  # InitProducerId with the transactional id
            return producer

        return self._keep("producer", self.run(work()))

    def txn_begin(self, handle: int) -> None:
        self.run(self._get(handle).begin_transaction())

    def txn_send(self, handle: int, topic: str, records: list[dict[str, Json]]) -> list[list[int]]:
        return self.producer_send(handle, topic, records)

    def txn_send_offsets(self, handle: int, group: str, topic: str, offsets: dict[str, int]) -> None:
        positions = {TopicPartition(topic, int(p)): offset for p, offset in offsets.items()}
        self.run(self._get(handle).send_offsets_to_transaction(positions, group))

    def txn_commit(self, handle: int) -> None:
        self.run(self._get(handle).commit_transaction())

    def txn_abort(self, handle: int) -> None:
        self.run(self._get(handle).abort_transaction())

    # --- reading by position -------------------------------------------------------------------------------
    def _consumer(self, *topics: str, **options: Any) -> AIOKafkaConsumer:
        return AIOKafkaConsumer(
            *topics, bootstrap_servers=self.bootstrap, enable_auto_commit=False, **self.options, **options
        )

    def read(
        self, topic: str, partition: int, offset: int, count: int, settings: dict[str, Json]
    ) -> list[dict[str, Json]]:
        options = {}
        if settings.get("max_partition_fetch_bytes"):
            options["max_partition_fetch_bytes"] = settings["max_partition_fetch_bytes"]
        if settings.get("isolation_level"):
            options["isolation_level"] = settings["isolation_level"]

        async def work() -> list[dict[str, Json]]:
            consumer = self._consumer(**options)
            await consumer.start()
            try:
                tp = TopicPartition(topic, partition)
                consumer.assign([tp])
                consumer.seek(tp, offset)
                out: list[dict[str, Json]] = []
                deadline = time.monotonic() + settings.get("timeout_ms", 15000) / 1000
                while len(out) < count and time.monotonic() < deadline:
                    for batch in (await consumer.getmany(timeout_ms=200)).values():
                        out.extend(consumed_record(r) for r in batch)
                return out[:count]
            finally:
                await consumer.stop()

        return self.run(work())

    def offsets_for_times(self, topic: str, timestamps: dict[str, int]) -> dict[str, int | None]:
        async def work() -> dict[str, int | None]:
            consumer = self._consumer()
            await consumer.start()
            try:
                found = await consumer.offsets_for_times(
                    {TopicPartition(topic, int(p)): ts for p, ts in timestamps.items()}
                )
                return {str(tp.partition): (None if at is None else at.offset) for tp, at in found.items()}
            finally:
                await consumer.stop()

        return self.run(work())

    def list_offsets(self, topic: str, partitions: list[int], spec: str) -> dict[str, int]:
        async def work() -> dict[str, int]:
            consumer = self._consumer()
            await consumer.start()
            try:
                tps = [TopicPartition(topic, p) for p in partitions]
                found = await (consumer.beginning_offsets(tps) if spec == "earliest" else consumer.end_offsets(tps))
                return {str(tp.partition): offset for tp, offset in found.items()}
            finally:
                await consumer.stop()

        return self.run(work())

    # --- consumer groups -----------------------------------------------------------------------------------
    def consumer_open(self, group: str, topics: list[str], settings: dict[str, Json]) -> int:
        async def work() -> AIOKafkaConsumer:
            consumer = self._consumer(
                *topics,
                group_id=group,
                client_id=f"compat-{uuid.uuid4()}",
                auto_offset_reset="earliest",
                session_timeout_ms=settings["session_timeout_ms"],
                heartbeat_interval_ms=settings["heartbeat_interval_ms"],
            )
            try:  # start() waits for the first assignment: a refused group (FindCoordinator) is raised here
                await consumer.start()
            except BaseException:
                await consumer.stop()
                raise
            return consumer

        return self._keep("consumer", self.run(work()))

    def consumer_poll(self, handle: int, timeout_ms: int) -> dict[str, Json]:
        consumer: AIOKafkaConsumer = self._get(handle)

        async def work() -> dict[str, Json]:
            batches = await consumer.getmany(timeout_ms=timeout_ms)
            records = [consumed_record(r) for batch in batches.values() for r in batch]
            return {"records": records, "assignment": sorted([tp.topic, tp.partition] for tp in consumer.assignment())}

        return self.run(work())

    def consumer_commit(self, handle: int) -> None:
        self.run(self._get(handle).commit())

    def consumer_close(self, handle: int) -> None:
        self.run(self._drop(handle).stop())

    def shutdown(self) -> None:
        super().shutdown()
        if self._admin is not None:
            self.run(self._admin.close())
