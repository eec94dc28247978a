"""A confluent-kafka (librdkafka) consumer using the KIP-848 protocol, in its own process so a test can kill it.

    python consumer_protocol_member.py BOOTSTRAP GROUP TOPIC CLIENT_ID

Prints the same JSON lines as tests/groups/java/ConsumerGroupMember.java: {"event": "assigned", ...} on each
change of assignment, {"event": "records", ...} for each batch once a synchronous commit stored it, and
{"event": "closed"} after closing on the stdin line "close".
"""

from __future__ import annotations

import json
import sys
import threading

from confluent_kafka import Consumer, KafkaException


def main(bootstrap: str, group: str, topic: str, client_id: str) -> None:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "group.protocol": "consumer",
            "client.id": client_id,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    closing = threading.Event()

    def watch_stdin() -> None:
        for line in sys.stdin:
            if line.strip() == "close":
                break
        closing.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    assigned: list[int] | None = None
    while not closing.is_set():
        messages = consumer.consume(100, 0.1)
        records = [[m.partition(), m.offset()] for m in messages if m.error() is None]
        if records:
            try:
                consumer.commit(asynchronous=False)
                print(json.dumps({"event": "records", "records": records}), flush=True)
            except KafkaException as exc:  # not committed, so not counted: the next owner reads them again
                print(json.dumps({"event": "commit-failed", "error": str(exc)}), flush=True)
        now = sorted(tp.partition for tp in consumer.assignment())
        if now != assigned:
            assigned = now
            print(json.dumps({"event": "assigned", "partitions": now}), flush=True)
    consumer.close()
    print(json.dumps({"event": "closed"}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:5])
