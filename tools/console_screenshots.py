"""Take the web console's screenshots for the README (docs/screenshots/*.png) in headless Chromium.

    python tools/console_screenshots.py [--out docs/screenshots]

Starts a throwaway kbroker and the console in this process, fills the broker with a few topics, records and a
consumer group with lag, then saves the overview, a topic, the message browser (JSON view) and the groups page.
Needs Debian's chromium and chromium-driver (/usr/bin/chromium, /usr/bin/chromedriver) and selenium.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from pathlib import Path

import trio
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient
from kafka.structs import OffsetAndMetadata
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from kbroker.commands.connection import ClientSettings
from kbroker.console.app import serve
from kbroker.console.cluster import Cluster
from kbroker.testing import RunningBroker


def start_console(bootstrap: str) -> int:
    """The console on a free port of 127.0.0.1, on a daemon thread; its port."""
    ready = threading.Event()
    port: list[int] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            _, bound = await nursery.start(serve, Cluster(ClientSettings(bootstrap)), "127.0.0.1", 0)
            port.append(bound)
            ready.set()

    threading.Thread(target=trio.run, args=(main,), daemon=True).start()
    if not ready.wait(30):
        raise SystemExit("the console did not start")
    return port[0]


def fill(bootstrap: str) -> KafkaConsumer:
    """Topics with records, and a consumer group part of the way through one of them (its member, returned)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics(
        {
            "orders": {"num_partitions": 3, "configs": {"retention.ms": "604800000"}},
            "payments": {"num_partitions": 2, "configs": {"cleanup.policy": "compact"}},
            "clickstream": {"num_partitions": 6},
        }
    )
    admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    for number in range(120):
        order = {"order_id": 1000 + number, "customer": f"c-{number % 17:03d}", "total": round(9.5 + number * 1.25, 2)}
        order["lines"] = [{"sku": f"SKU-{number % 7}", "qty": 1 + number % 3}]
        headers = [("source", b"web" if number % 2 else b"mobile"), ("trace-id", f"{number:016x}".encode())]
        producer.send(
            "orders",
            key=f"order-{1000 + number}".encode(),
            value=json.dumps(order).encode(),
            headers=headers,
            partition=number % 3,
        )
        producer.send(
            "payments",
            key=f"c-{number % 17:03d}".encode(),
            value=f"paid {order['total']}".encode(),
            partition=number % 2,
        )
        producer.send("clickstream", value=f"/products/{number % 40}".encode(), partition=number % 6)
    producer.flush()
    producer.close()
    # A member that stays in the group while the pictures are taken (kafka-python heartbeats on its own thread).
    consumer = KafkaConsumer(
        "orders", bootstrap_servers=bootstrap, group_id="billing", enable_auto_commit=False, client_id="billing-service"
    )
    for _ in range(50):
        consumer.poll(timeout_ms=200, max_records=1)
        if consumer.assignment():
            break
    consumer.commit({TopicPartition("orders", p): OffsetAndMetadata(25 + 5 * p, "", -1) for p in range(3)})
    return consumer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/screenshots"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as data_dir, RunningBroker(Path(data_dir)) as broker:
        member = fill(broker.bootstrap)
        url = f"http://127.0.0.1:{start_console(broker.bootstrap)}"
        options = webdriver.ChromeOptions()
        options.binary_location = "/usr/bin/chromium"
        for argument in (
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--window-size=1280,900",
            "--hide-scrollbars",
        ):
            options.add_argument(argument)
        driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
        try:
            pages = {
                "overview": "/",
                "topic": "/topics/orders",
                "messages": "/topics/orders/messages?partition=0&count=5&format=json",
                "groups": "/groups/billing",
            }
            for name, path in pages.items():
                driver.get(url + path)
                target = args.out / f"{name}.png"
                driver.save_screenshot(str(target))
                print(f"wrote {target}")
        finally:
            driver.quit()
            member.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
