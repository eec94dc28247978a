"""Python transactional producers on kbroker (transaction version 1: AddPartitionsToTxn, AddOffsetsToTxn,
TxnOffsetCommit, EndTxn): confluent-kafka (librdkafka), kafka-python 3 and aiokafka. Each commits 10 records with
offsets sent to the transaction, aborts 10 (sent before the abort), commits 5: a read_committed consumer sees
exactly the 15 committed in order, read_uncommitted all 25, and the group's offset is the one sent in the committed
transaction."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from kafka import KafkaConsumer, TopicPartition

from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.messages.create_topics_request import CreateTopicsRequest

TRANSACTIONS = ((10, True), (10, False), (5, True))  # (records, commit?)
GROUP_OFFSET = 7


def value(commit: bool, number: int, index: int) -> bytes:
    return f"{'commit' if commit else 'abort'}-{number}-{index}".encode()


def with_confluent_kafka(bootstrap: str, topic: str, group: str) -> None:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka import TopicPartition as CkTopicPartition

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-id"})
    producer.init_transactions(30)
    metadata = Consumer({"bootstrap.servers": bootstrap, "group.id": group}).consumer_group_metadata()
    for number, (count, commit) in enumerate(TRANSACTIONS):
        producer.begin_transaction()
        for index in range(count):
            producer.produce(topic, value=value(commit, number, index))
        producer.flush(30)  # so that the aborted records are written, not dropped by the client
        if commit:
            offsets = [CkTopicPartition(topic, 0, GROUP_OFFSET)]
            producer.send_offsets_to_transaction(offsets, metadata, 30)
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)


def with_kafka_python(bootstrap: str, topic: str, group: str) -> None:
    from kafka import KafkaProducer
    from kafka.structs import OffsetAndMetadata

    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"{topic}-id")
    producer.init_transactions()
    for number, (count, commit) in enumerate(TRANSACTIONS):
        producer.begin_transaction()
        for index in range(count):
            producer.send(topic, value=value(commit, number, index))
        producer.flush()
        if commit:
            offsets = {TopicPartition(topic, 0): OffsetAndMetadata(GROUP_OFFSET, "", -1)}
            producer.send_offsets_to_transaction(offsets, group)
            producer.commit_transaction()
        else:
            producer.abort_transaction()
    producer.close()


def with_aiokafka(bootstrap: str, topic: str, group: str) -> None:
    from aiokafka import AIOKafkaProducer
    from aiokafka.structs import TopicPartition as AioTopicPartition

    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"{topic}-id")
        await producer.start()
        try:
            for number, (count, commit) in enumerate(TRANSACTIONS):
                await producer.begin_transaction()
                sent = [await producer.send(topic, value(commit, number, index)) for index in range(count)]
                await asyncio.gather(*sent)  # written before the end, aborted ones too
                if commit:
                    await producer.send_offsets_to_transaction({AioTopicPartition(topic, 0): GROUP_OFFSET}, group)
                    await producer.commit_transaction()
                else:
                    await producer.abort_transaction()
        finally:
            await producer.stop()

    asyncio.run(run())


def read(bootstrap: str, topic: str, isolation_level: str) -> list[bytes]:
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level=isolation_level,
        auto_offset_reset="earliest",
        consumer_timeout_ms=2000,
    )
    consumer.assign([TopicPartition(topic, 0)])
    values = [message.value for message in consumer]
    consumer.close()
    return values


@pytest.mark.parametrize("client", [with_confluent_kafka, with_kafka_python, with_aiokafka])
def test_commit_abort_commit(broker: RunningBroker, client: Callable[[str, str, str], None]) -> None:
    topic = f"py-txn-{client.__name__}"
    with WireClient(broker.bootstrap) as wire:
        created = CreateTopicsRequest.CreatableTopic(name=topic, num_partitions=1, replication_factor=1)
        assert wire.request(CreateTopicsRequest(topics=[created], timeout_ms=5000), 7).topics[0].error_code == 0
    client(broker.bootstrap, topic, f"{topic}-group")
    committed = [value(True, 0, i) for i in range(10)] + [value(True, 2, i) for i in range(5)]
    assert read(broker.bootstrap, topic, "read_committed") == committed
    everything = read(broker.bootstrap, topic, "read_uncommitted")
    assert everything == committed[:10] + [value(False, 1, i) for i in range(10)] + committed[10:]
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=f"{topic}-group")
    assert consumer.committed(TopicPartition(topic, 0)) == GROUP_OFFSET
    consumer.close()
