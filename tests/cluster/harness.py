"""N ``kbroker serve`` processes for tests, each with its own data directory and a FaultProxy in front of it.

Each broker advertises its proxy's address, so clients (and, in a replicated cluster, the other brokers) always
reach it through the proxy: ``isolate()`` (which also blocks the broker's own connections through the other
proxies) and ``hold()`` cut it off without touching the process, while
``kill()`` (SIGKILL), ``pause()`` (SIGSTOP), ``resume()`` (SIGCONT), ``stop()`` (SIGTERM, drained) and
``start()``/``restart()`` act on the process. The proxy's address stays the same across restarts; the broker
itself listens on a port picked here (another is picked if that one was taken meanwhile).

    with Cluster(tmp_path, size=3) as cluster:
        producer = Producer({"bootstrap.servers": cluster.bootstrap})
        cluster.brokers[0].kill()
        cluster.brokers[0].start()

tests/cluster/conftest.py shares one Cluster per test module (``cluster`` fixture) and puts every broker back
to running, resumed and healed after each test.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Literal

from kbroker.fault_proxy import Direction, FaultProxy, ProxyHost
from kbroker.pytest_plugin import DEFAULT_OVERRIDES
from kbroker.testing import BrokerProcess

HOST = "127.0.0.1"
START_ATTEMPTS = 5  # a port picked for a broker can be taken by another process before the broker binds it
State = Literal["running", "paused", "stopped"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll ``condition`` until true; fail naming ``what`` after a generous ``timeout`` (a bound, not a pace)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(0.01)


def process_state(pid: int) -> str:
    """The state letter of /proc/PID/stat (R, S, T for stopped, Z, ...)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


class ClusterBroker:
    def __init__(self, data_dir: Path, node_id: int, overrides: Mapping[str, str], proxy: FaultProxy) -> None:
        self.node_id = node_id
        self.name = f"broker-{node_id}"
        self.proxy = proxy
        self.process = BrokerProcess(
            data_dir,
            {**DEFAULT_OVERRIDES, "node.id": str(node_id), **overrides},
            host=HOST,
            port=free_port(),
            advertised=proxy.bootstrap,
        )
        self.state: State = "stopped"

    def __repr__(self) -> str:
        return f"<broker {self.node_id} {self.state} at {self.bootstrap} -> {self.process.port}>"

    @property
    def bootstrap(self) -> str:
        """The proxy's address: the one this broker advertises, for clients."""
        return self.proxy.bootstrap

    @property
    def direct_bootstrap(self) -> str:
        """Where the process listens, bypassing the proxy (its metadata still names the proxy)."""
        return f"{HOST}:{self.process.port}"

    @property
    def data_dir(self) -> Path:
        return self.process.data_dir

    @property
    def log_path(self) -> Path:
        return self.process.log_path

    @property
    def pid(self) -> int:
        assert self.process.process is not None, f"broker {self.node_id} is not running"
        return self.process.process.pid

    def exit_code(self) -> int | None:
        """The process's exit status if it has ended (None while it runs, or if it was never started)."""
        return None if self.process.process is None else self.process.process.poll()

    def log_tail(self, size: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-size:]
        except OSError:
            return ""

    # --- the process --------------------------------------------------------------------------------------

    def start(self) -> ClusterBroker:
        assert self.state == "stopped", f"broker {self.node_id} is {self.state}"
        for attempt in range(START_ATTEMPTS):
            try:
                self.process.start()
                break
            except RuntimeError as exc:
                if "Address already in use" not in str(exc) or attempt == START_ATTEMPTS - 1:
                    raise
                self.process.port = free_port()
        self.proxy.set_upstream((HOST, self.process.port))
        self.proxy.host.name_source(self.pid, self.name)
        self.state = "running"
        return self

    def stop(self) -> None:
        """SIGTERM: drained and flushed (a paused broker is resumed first, so that it can)."""
        if self.state == "paused":
            self.resume()
        self._forget_process()
        self.process.stop()
        self.state = "stopped"

    def kill(self) -> None:
        """SIGKILL, as a crash (also of a paused broker): nothing drained or flushed beyond what was written."""
        self._forget_process()
        self.process.kill()
        self.state = "stopped"

    def _forget_process(self) -> None:
        if self.process.process is not None:
            self.proxy.host.forget_source(self.pid)

    def restart(self) -> ClusterBroker:
        """Stop (drained) if running, then start on the same data directory behind the same proxy."""
        self.stop()
        return self.start()

    def pause(self) -> None:
        """SIGSTOP: the process is frozen; its sockets stay open and the kernel keeps accepting and buffering."""
        assert self.state == "running", f"broker {self.node_id} is {self.state}"
        os.kill(self.pid, signal.SIGSTOP)
        wait_for(lambda: process_state(self.pid) == "T", f"broker {self.node_id} stopped by SIGSTOP")
        self.state = "paused"

    def resume(self) -> None:
        """SIGCONT."""
        assert self.state == "paused", f"broker {self.node_id} is {self.state}"
        os.kill(self.pid, signal.SIGCONT)
        wait_for(lambda: process_state(self.pid) != "T", f"broker {self.node_id} resumed by SIGCONT")
        self.state = "running"

    # --- the network (the proxy) -------------------------------------------------------------------------------

    def _peer_proxies(self) -> list[FaultProxy]:
        return [proxy for proxy in self.proxy.host.proxies if proxy is not self.proxy]

    def isolate(self) -> None:
        """Cut this broker off until heal(): every connection to it, and every one it made through the other
        proxies of the cluster (to its peers), is reset, and new ones are refused (reset)."""
        self.proxy.drop()
        for proxy in self._peer_proxies():
            proxy.block(self.name)

    def hold(self, direction: Direction = Direction.BOTH) -> None:
        """Stop forwarding to and/or from this broker; what is sent meanwhile waits in the proxy, in order."""
        self.proxy.hold(direction)

    def release(self, direction: Direction = Direction.BOTH) -> None:
        self.proxy.release(direction)

    def heal(self) -> None:
        """Undo isolate() and every hold of this broker's proxy."""
        self.proxy.heal()
        for proxy in self._peer_proxies():
            proxy.unblock(self.name)


class Cluster:
    """``size`` brokers with node ids 0..size-1 under ``root``, each behind its own proxy.

    ``overrides`` go to every broker; ``overrides_for(node_id)`` adds per-broker ones (listeners of a
    replicated cluster, a controller quorum, ...).
    """

    def __init__(
        self,
        root: Path,
        size: int = 1,
        overrides: Mapping[str, str] | None = None,
        overrides_for: Callable[[int], Mapping[str, str]] | None = None,
    ) -> None:
        self.root = Path(root)
        self.size = size
        self.overrides = dict(overrides or {})
        self.overrides_for = overrides_for
        self.proxies = ProxyHost()
        self.brokers: list[ClusterBroker] = []

    @property
    def bootstrap(self) -> str:
        """Every broker's proxy, comma-separated, for ``bootstrap.servers``."""
        return ",".join(broker.bootstrap for broker in self.brokers)

    def start(self) -> Cluster:
        self.proxies.start()
        try:
            for node_id in range(self.size):
                overrides = {**self.overrides, **(self.overrides_for(node_id) if self.overrides_for else {})}
                data_dir = self.root / f"broker-{node_id}" / "data"
                self.brokers.append(ClusterBroker(data_dir, node_id, overrides, self.proxies.add_proxy()))
            # Started side by side: most of a start is the interpreter importing the broker, on a core of its own.
            with concurrent.futures.ThreadPoolExecutor(self.size) as pool:
                for started in [pool.submit(broker.start) for broker in self.brokers]:
                    started.result()
        except BaseException:
            self.close()
            raise
        return self

    def partition(self, *groups: Iterable[int]) -> None:
        """Cut the network between groups of brokers (node ids, each in one group) until heal(): what a broker
        connects to in another group is reset and refused. Clients still reach every broker."""
        side = {node_id: number for number, group in enumerate(groups) for node_id in group}
        assert sorted(side) == [broker.node_id for broker in self.brokers], f"every broker in one group: {groups}"
        for source in self.brokers:
            for target in self.brokers:
                if side[source.node_id] != side[target.node_id]:
                    target.proxy.block(source.name)

    def heal(self) -> None:
        """Undo every isolate(), hold() and partition()."""
        for broker in self.brokers:
            broker.heal()

    def restore(self) -> None:
        """Every broker running, resumed and reachable again: what a test leaves behind for the next one.

        A broker that exited on its own is started again too, and then reported (AssertionError with its log).
        """
        exited = []
        for broker in self.brokers:
            broker.heal()
            if broker.state == "paused":
                broker.resume()
            elif broker.state == "running" and (code := broker.exit_code()) is not None:
                exited.append(f"broker {broker.node_id} exited with {code}:\n{broker.log_tail()}")
                broker.kill()  # reaped and forgotten
            if broker.state == "stopped":
                broker.start()
        if exited:
            raise AssertionError("\n".join(exited))

    def close(self) -> None:
        """Stop every broker (drained; killed if it does not stop within 30 s), then the proxies."""
        try:
            for broker in self.brokers:
                broker.stop()
        finally:
            self.proxies.close()

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
