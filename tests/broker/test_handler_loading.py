"""A handler that cannot be imported (the process is out of descriptors, EMFILE) fails only the request that needed
it (issue #26, item 1): the request is answered UNKNOWN_SERVER_ERROR, the failure is logged once, the import is
tried again on the next request, and the background loader (kbroker.server.connection.load_handlers) retries
instead of ending the broker. The live case, a broker under a low open-file limit, is in
tests/broker/test_resource_exhaustion_live.py."""

from __future__ import annotations

import errno
import importlib
import logging
from pathlib import Path
from types import ModuleType

import pytest
import trio
import trio.testing

from kbroker import apis
from kbroker.apis import ApiHandler, HandlerUnavailable
from kbroker.server import connection as connection_module
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol import messages
from protocol.errors import ErrorCode
from protocol.messages.describe_cluster_request import DescribeClusterRequest

DESCRIBE_CLUSTER = 60
DESCRIBE_TOPIC_PARTITIONS = 75
SOURCE = "/kbroker/apis/cluster.py"


class OutOfDescriptors:
    """importlib.import_module for kbroker.apis: kbroker.apis.cluster fails with EMFILE while ``failing``."""

    def __init__(self) -> None:
        self.failing = True
        self.attempts = 0

    def __call__(self, name: str, package: str | None = None) -> ModuleType:
        if name == "kbroker.apis.cluster":
            self.attempts += 1
            if self.failing:
                raise OSError(errno.EMFILE, "Too many open files", SOURCE)
        return importlib.import_module(name, package)


@pytest.fixture
def out_of_descriptors(monkeypatch: pytest.MonkeyPatch) -> OutOfDescriptors:
    failing = OutOfDescriptors()
    monkeypatch.setattr(apis, "importlib", type("importlib", (), {"import_module": staticmethod(failing)}))
    # Handlers never loaded in this process (the table's own may already hold their functions); both are in
    # kbroker/apis/cluster.py.
    for key, high, function in [
        (DESCRIBE_CLUSTER, 2, "describe_cluster"),
        (DESCRIBE_TOPIC_PARTITIONS, 0, "describe_topic_partitions"),
    ]:
        monkeypatch.setitem(apis.HANDLERS, key, ApiHandler(key, 0, high, f"cluster.handle_{function}"))
    return failing


def _lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name.startswith("kbroker")]


def test_a_handler_that_cannot_be_imported_raises_a_kafka_error_logs_once_and_loads_later(
    out_of_descriptors: OutOfDescriptors, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kbroker")
    handler = apis.HANDLERS[DESCRIBE_CLUSTER]
    for _ in range(3):
        with pytest.raises(HandlerUnavailable) as refused:
            handler.handle  # noqa: B018 - the property imports the module
        assert refused.value.code == ErrorCode.UNKNOWN_SERVER_ERROR
        assert refused.value.message == f"cannot load the DescribeCluster handler: Too many open files: {SOURCE}"
    assert handler.load() == f"Too many open files: {SOURCE}"
    out_of_descriptors.failing = False
    assert handler.load() is None
    assert handler.handle.__name__ == "handle_describe_cluster"
    assert out_of_descriptors.attempts == 5  # tried again each time, not given up on
    assert _lines(caplog) == [
        (
            "ERROR",
            f"cannot load the DescribeCluster handler: Too many open files: {SOURCE} "
            "(its requests fail until it can be)",
        ),
        ("WARNING", "the DescribeCluster handler is loaded now"),
    ]


def test_the_background_loader_retries_the_handlers_it_could_not_load_instead_of_failing(
    out_of_descriptors: OutOfDescriptors, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: the OSError escaped load_handlers, ended the server's nursery and the broker with it."""
    caplog.set_level(logging.INFO, logger="kbroker")
    delay, retry = connection_module.HANDLER_LOAD_DELAY_S, connection_module.HANDLER_LOAD_RETRY_S

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(connection_module.load_handlers)
            await trio.sleep(delay + 2.5 * retry)
            assert out_of_descriptors.attempts == 2 * 3  # both cluster handlers: the first pass, then two retries
            out_of_descriptors.failing = False
            await trio.sleep(retry)
            assert out_of_descriptors.attempts == 2 * 4
            await trio.sleep(10 * retry)
            assert out_of_descriptors.attempts == 2 * 4  # all loaded: the loader is done

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert apis.HANDLERS[DESCRIBE_CLUSTER].handle.__name__ == "handle_describe_cluster"
    retry = connection_module.HANDLER_LOAD_RETRY_S
    assert _lines(caplog) == [  # one line for all the handlers that failed, not one per handler or attempt
        (
            "ERROR",
            f"2 of {len(apis.HANDLERS)} handlers could not be loaded yet (the first: Too many open files: {SOURCE}); "
            f"tried again every {retry:g} s",
        ),
        ("WARNING", "every handler is loaded now"),
    ]


def test_the_request_is_answered_with_the_error_and_the_connection_goes_on(
    out_of_descriptors: OutOfDescriptors, tmp_path: Path
) -> None:
    with RunningBroker(tmp_path / "data") as broker, WireClient(broker.bootstrap) as client:
        refused = client.request(DescribeClusterRequest(), 0)
        assert (refused.error_code, refused.error_message) == (
            ErrorCode.UNKNOWN_SERVER_ERROR,
            f"cannot load the DescribeCluster handler: Too many open files: {SOURCE}",
        )
        out_of_descriptors.failing = False
        answered = client.request(DescribeClusterRequest(), 0)  # the same connection: it was not closed
        assert answered.error_code == ErrorCode.NONE
        assert [b.port for b in answered.brokers] == [int(broker.bootstrap.rsplit(":", 1)[1])]


def test_a_request_codec_that_cannot_be_imported_closes_only_that_connection(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The request's codec is imported on first use too: out of descriptors, the request cannot be read, so its
    connection is closed with one warning (no traceback), and the codec loads once descriptors are back."""
    caplog.set_level(logging.INFO, logger="kbroker")
    codec = "protocol.messages.describe_cluster_request"
    failing = OutOfDescriptors()

    def import_module(name: str, package: str | None = None) -> ModuleType:
        if name == codec and failing.failing:
            raise OSError(errno.EMFILE, "Too many open files", "/protocol/messages/describe_cluster_request.py")
        return importlib.import_module(name, package)

    monkeypatch.setattr(messages, "importlib", type("importlib", (), {"import_module": staticmethod(import_module)}))
    messages._message_class.cache_clear()  # this process may have loaded the codec already
    with RunningBroker(tmp_path / "data") as broker:
        with WireClient(broker.bootstrap) as client, pytest.raises(ConnectionError):
            client.request(DescribeClusterRequest(), 0)
        closing = [r for r in caplog.records if "cannot load the request's codec" in r.getMessage()]
        assert [(r.levelname, r.exc_info) for r in closing] == [("WARNING", None)]
        assert (
            closing[0]
            .getMessage()
            .endswith(
                "cannot load the request's codec: [Errno 24] Too many open files: "
                "'/protocol/messages/describe_cluster_request.py'"
            )
        )
        failing.failing = False
        with WireClient(broker.bootstrap) as client:
            assert client.request(DescribeClusterRequest(), 0).error_code == ErrorCode.NONE
    messages._message_class.cache_clear()
