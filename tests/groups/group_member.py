"""A kafka-python group member in its own process, so a test can kill it without a LeaveGroup.

    python group_member.py BOOTSTRAP GROUP TOPIC

SIGTERM makes it close its consumer (a LeaveGroup); SIGKILL does not. Prints one JSON line per change of
assignment and per consumed batch: {"assigned": [...]} or
{"records": [[partition, offset], ...]}; commits synchronously after each batch.
"""

from __future__ import annotations

import json
import signal
import sys

from kafka import KafkaConsumer


def main(bootstrap: str, group: str, topic: str) -> None:
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=6000,
        heartbeat_interval_ms=500,
    )
    # SIGTERM closes the consumer, which leaves the group (SIGKILL is the crash without a LeaveGroup).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    assigned: list[int] | None = None
    try:
        while True:
            batches = consumer.poll(100)
            records = [[tp.partition, r.offset] for tp, rs in batches.items() for r in rs]
            if records:
                consumer.commit()
                print(json.dumps({"records": records}), flush=True)
            now = sorted(tp.partition for tp in consumer.assignment())
            if now != assigned:
                assigned = now
                print(json.dumps({"assigned": now}), flush=True)
    finally:
        consumer.close()


if __name__ == "__main__":
    main(*sys.argv[1:4])
