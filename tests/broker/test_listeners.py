"""Several listeners (kbroker/server/listeners.py): Kafka's listener keys parsed in one place, every listener
served at once, Metadata answering with the address of the listener a request came in on, and a security
listener kbroker cannot secure (no key store, no SASL users) refused at start-up."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from kbroker import app
from kbroker.broker import Broker, Endpoint
from kbroker.config import BrokerConfig, ConfigError
from kbroker.server.connection import Connection
from kbroker.server.listeners import ListenerSpec, parse_listeners
from protocol.framing import FrameBuffer, decode_response, encode_request
from protocol.messages.find_coordinator_request import FindCoordinatorRequest
from protocol.messages.metadata_request import MetadataRequest


def test_listeners_are_parsed_as_kafka_does() -> None:
    plan = parse_listeners(
        "PLAINTEXT://:9092,internal://10.0.0.1:9093,CONTROLLER://:9094",
        "PLAINTEXT://public.example:19092",
        {
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "INTERNAL",
        },
    )
    assert plan.listeners == (
        ListenerSpec("PLAINTEXT", "PLAINTEXT", "0.0.0.0", 9092, Endpoint("public.example", 19092)),
        ListenerSpec("INTERNAL", "PLAINTEXT", "10.0.0.1", 9093, None),
    )
    assert plan.primary == "INTERNAL"
    assert plan.listeners[1].advertised_address(9093) == Endpoint("10.0.0.1", 9093)
    assert plan.listeners[0].advertised_address(9092) == Endpoint("public.example", 19092)
    # kbroker's own forms: a bare host:port is PLAINTEXT, a wildcard is advertised as localhost.
    bare = parse_listeners("0.0.0.0:0")
    assert (bare.primary, bare.listeners[0].advertised_address(4321)) == ("PLAINTEXT", Endpoint("localhost", 4321))


@pytest.mark.parametrize(
    ("listeners", "advertised", "settings", "problem"),
    [
        ("A://:1,A://:2", "", {"listener.security.protocol.map": "A:PLAINTEXT"}, "A named more than once"),
        ("A://:1,B://:1", "", {"listener.security.protocol.map": "A:PLAINTEXT,B:PLAINTEXT"}, "a port of its own"),
        ("A://:1", "", {}, "listener A: listener.security.protocol.map gives it no security protocol"),
        ("PLAINTEXT://:1", "OTHER://h:1", {}, "advertised.listeners: listener OTHER is not in listeners"),
        ("PLAINTEXT://:1", "", {"inter.broker.listener.name": "X"}, "inter.broker.listener.name: X"),
        ("PLAINTEXT://:1", "", {"listener.security.protocol.map": "PLAINTEXT:TLS"}, "'TLS' for PLAINTEXT"),
        ("PLAINTEXT://nowhere", "", {}, "must be HOST:PORT"),
    ],
)
def test_listener_mistakes_are_one_line(
    listeners: str, advertised: str, settings: dict[str, str], problem: str
) -> None:
    with pytest.raises(ConfigError, match=problem):
        parse_listeners(listeners, advertised, settings)


@pytest.mark.parametrize(
    ("protocol", "settings", "problem"),
    [
        # Kafka's default key store type is JKS, which Python cannot read: the listener names the fix.
        ("SSL", [], "listener SECURE (SSL): "),
        (
            "SASL_PLAINTEXT",
            [],
            "listener SECURE (SASL_PLAINTEXT): sasl.enabled.mechanisms includes GSSAPI (Kafka's default), which "
            "kbroker does not implement: enable PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER",
        ),
        (
            "SASL_PLAINTEXT",
            ["sasl.enabled.mechanisms=PLAIN"],
            "listener SECURE (SASL_PLAINTEXT): PLAIN needs its users: set "
            "listener.name.secure.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule "
            'required user_alice="alice-secret";',
        ),
    ],
)
def test_serve_refuses_a_listener_it_cannot_secure_at_start_up(
    tmp_path: Path, protocol: str, settings: list[str], problem: str
) -> None:
    overrides = [
        "listeners=PLAINTEXT://127.0.0.1:0,SECURE://127.0.0.1:0",
        f"listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SECURE:{protocol}",
        *settings,
    ]
    args = [sys.executable, "-m", "kbroker", "serve", "--data-dir", str(tmp_path / "data")]
    for item in overrides:
        args += ["--override", item]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("kbroker: configuration error: " + problem), lines[0]
    assert not (tmp_path / "data").exists()  # refused before anything was opened or created


class _Client:
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream, self.frames, self.correlation_id = stream, FrameBuffer(), 0

    async def request(self, body: Any, version: int) -> Any:
        self.correlation_id += 1
        await self.stream.send_all(encode_request(body, version, self.correlation_id))
        while (frame := self.frames.next_frame()) is None:
            data = await self.stream.receive_some(65536)
            assert data, "the broker closed the connection"
            self.frames.feed(data)
        return decode_response(frame, body.API_KEY, version)[1]


def test_two_listeners_are_served_each_advertising_itself(tmp_path: Path) -> None:
    config = BrokerConfig(
        {
            "listeners": "OUTSIDE://127.0.0.1:0,INSIDE://127.0.0.1:0",
            "advertised.listeners": "OUTSIDE://outside.example:0",
            "listener.security.protocol.map": "OUTSIDE:PLAINTEXT,INSIDE:PLAINTEXT",
            "inter.broker.listener.name": "INSIDE",
        }
    )
    plan = parse_listeners(config["listeners"], config["advertised.listeners"], config.listener_settings)
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            broker: Broker = (await nursery.start(app.run, app.Settings(config, tmp_path / "data", plan))).broker
            bound = dict(broker.listeners)
            for name in ("OUTSIDE", "INSIDE"):
                stream = await trio.open_tcp_stream("127.0.0.1", bound[name].port)
                async with stream:
                    client = _Client(stream)
                    metadata = await client.request(MetadataRequest(topics=[]), 12)
                    coordinator = await client.request(FindCoordinatorRequest(key="g"), 3)
                    [connection] = broker.open_connections.values()
                    assert isinstance(connection, Connection)
                    seen[name] = (
                        [(b.host, b.port) for b in metadata.brokers],
                        (coordinator.host, coordinator.port),
                        connection.listener_name,
                    )
                with trio.fail_after(5):
                    while broker.open_connections:
                        await trio.sleep(0.01)
            seen["bound"] = bound
            seen["advertised"] = broker.advertised
            nursery.cancel_scope.cancel()

    trio.run(main)
    outside, inside = seen["bound"]["OUTSIDE"].port, seen["bound"]["INSIDE"].port
    assert outside != inside
    assert seen["OUTSIDE"] == ([("outside.example", outside)], ("outside.example", outside), "OUTSIDE")
    assert seen["INSIDE"] == ([("127.0.0.1", inside)], ("127.0.0.1", inside), "INSIDE")
    assert seen["advertised"] == Endpoint("127.0.0.1", inside)  # the inter-broker listener is the main address
