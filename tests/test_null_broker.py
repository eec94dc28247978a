"""tools/null_broker.py, the benchmark's reference broker: a stock producer's records are acknowledged with
consecutive offsets per partition, in v2 record batches, and nothing else is asked of it."""

from __future__ import annotations

import threading
import time

from confluent_kafka import Producer

from compat.apache_kafka import free_port
from tools.null_broker import NullBroker


def test_a_producer_gets_consecutive_offsets_per_partition_for_every_acks_setting() -> None:
    port = free_port()
    broker = NullBroker("127.0.0.1", port, partitions=2)
    threading.Thread(target=broker.serve_forever, daemon=True).start()
    for acks, topic in (("1", "one"), ("all", "all"), ("0", "none")):
        producer = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "acks": acks, "linger.ms": 5})
        reports: list[tuple[int, int]] = []

        def on_delivery(error: object, message: object, reports: list[tuple[int, int]] = reports) -> None:
            assert error is None
            reports.append((message.partition(), message.offset()))  # type: ignore[attr-defined]

        for index in range(10):
            producer.produce(topic, f"record {index}".encode(), partition=index % 2, on_delivery=on_delivery)
        assert producer.flush(30) == 0
        if acks == "0":  # no answer, so no offsets: every record is reported delivered all the same
            assert len(reports) == 10
        else:
            assert sorted(reports) == [(p, offset) for p in (0, 1) for offset in range(5)]
        # Counted from the batches' headers, which are v2 (a v0/v1 message set would count wrongly). With
        # acks=0 flush() returns once the request is sent, maybe before the broker has read it.
        deadline = time.monotonic() + 10
        while (counted := [broker.next_offsets.get((topic, p)) for p in (0, 1)]) != [5, 5]:
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
        assert counted == [5, 5]
