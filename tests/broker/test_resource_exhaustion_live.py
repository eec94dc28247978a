"""The real system out of resources (issue #26, items 1 and 7): a `kbroker serve` child process on a 16 MB tmpfs
filled to the last byte, and one under `prlimit --nofile=256:256` flooded with idle connections. Neither exits:
the recovery-point checkpoint that cannot be written is logged once and retried, produce answers
KAFKA_STORAGE_ERROR and OffsetCommit NOT_COORDINATOR while reads go on, and when the resources come back the
broker works again (after a restart where the data directory went offline, as Kafka's log dir does).

Mounting a tmpfs needs root, and the descriptor test needs the prlimit command: each skips, saying why, without.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kbroker.testing import BrokerProcess
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from tests.groups.test_offsets_durability import TOPIC, commit, committed, create, fetch_values, produce

CHECKPOINT_MS = 500  # log.flush.offset.checkpoint.interval.ms: the failing write comes at once, and often
CHECKPOINT_FAILED = "flush: recovery-point checkpoint failed, tried again later:"


@contextlib.contextmanager
def small_tmpfs(mount_point: Path, size: str = "16m") -> Iterator[Path]:
    mount_point.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and the mount command")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)], check=False)
    if mounted.returncode != 0:
        pytest.skip("mount -t tmpfs failed")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(directory: Path) -> Path:
    """A file taking every byte left on the file system."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError:
        while True:  # the last partial block
            try:
                os.write(fd, b"\0" * 512)
            except OSError:
                break
    finally:
        os.close(fd)
    return filler


def alive_for(process: subprocess.Popen[bytes] | None, seconds: float) -> None:
    assert process is not None
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the broker exited with {process.returncode}"
        time.sleep(0.05)


def test_a_full_disk_keeps_the_broker_up_writes_refused_reads_served_until_space_and_a_restart(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "mnt") as mnt:
        data_dir = mnt / "data"
        broker = BrokerProcess(data_dir, {"log.flush.offset.checkpoint.interval.ms": str(CHECKPOINT_MS)}, "127.0.0.1")
        broker.log_path = tmp_path / "broker.log"  # not on the full disk
        broker.start()
        try:
            with WireClient(broker.bootstrap) as client:
                create(client)
                acked = {}
                for n in range(20):
                    code, offset = produce(client, b"before %d" % n)
                    assert (code, offset) == (ErrorCode.NONE, n)
                    acked[offset] = b"before %d" % n
                assert commit(client, 5) == ErrorCode.NONE

                filler = fill(mnt)
                # Before: the broker exited 1 at the next checkpoint ("kbroker: No space left on device").
                alive_for(broker.process, 4 * CHECKPOINT_MS / 1000)
                refused_in_a_row = 0
                for n in range(500):  # what still fits in the segment's last page is written, then refusals
                    value = b"full %d " % n + b"x" * 1000
                    code, offset = produce(client, value)
                    if code == ErrorCode.NONE:
                        assert offset == len(acked)  # no gap, no offset used twice
                        acked[offset] = value
                        refused_in_a_row = 0
                    else:
                        assert (code, offset) == (ErrorCode.KAFKA_STORAGE_ERROR, -1)
                        refused_in_a_row += 1
                        if refused_in_a_row == 10:  # enough failed writes in a row to take the directory offline
                            break
                assert refused_in_a_row == 10
                assert fetch_values(client) == sorted(acked.items())  # reads go on
                assert commit(client, 7) == ErrorCode.NOT_COORDINATOR

                filler.unlink()  # space is back; the directory stays offline until a restart, as Kafka's
                alive_for(broker.process, 2 * CHECKPOINT_MS / 1000)
                assert produce(client, b"freed") == (ErrorCode.KAFKA_STORAGE_ERROR, -1)
                # Item 7: before, this commit answered NONE although the directory was offline.
                assert commit(client, 8) == ErrorCode.NOT_COORDINATOR
                assert committed(client) == 5
                assert fetch_values(client) == sorted(acked.items())
            assert broker.process is not None
            process = broker.process
            broker.stop()
            assert process.returncode == 0
            log = broker.log_path.read_text()
            assert log.count(CHECKPOINT_FAILED) == 1, log  # once, not at every interval
            assert f"data directory {data_dir} is offline until the broker restarts" in log
            assert "Traceback" not in log

            broker.start()  # the restart recovers the logs and brings the directory back
            with WireClient(broker.bootstrap) as client:
                assert fetch_values(client) == sorted(acked.items())
                assert produce(client, b"restarted") == (ErrorCode.NONE, len(acked))
                assert committed(client) == 5
                assert commit(client, 9) == ErrorCode.NONE
            broker.stop()

            # Start-up on a full disk: one line that names the file (before: no path at all). A new data directory,
            # so that nothing the start removes (an index trimmed, a temporary file) gives it room to write in.
            fill(mnt)
            fresh = BrokerProcess(mnt / "fresh")
            fresh.log_path = tmp_path / "fresh.log"
            with pytest.raises(RuntimeError, match="exited with 1"):
                fresh.start()
            lines = [line for line in fresh.log_path.read_text().splitlines() if line.startswith("kbroker:")]
            assert lines == [f"kbroker: No space left on device: {mnt / 'fresh' / 'meta.properties.tmp'}"]
        finally:
            broker.kill()


# --- out of descriptors -------------------------------------------------------------------------------------------


def start_limited(tmp_path: Path, nofile: int) -> tuple[subprocess.Popen[bytes], str, Path]:
    """`prlimit --nofile=N:N kbroker serve`: (process, address, log file) once it is ready."""
    prlimit = shutil.which("prlimit")
    if prlimit is None:
        pytest.skip("no prlimit command")
    ready, log = tmp_path / "ready", tmp_path / "broker.log"
    command = [prlimit, f"--nofile={nofile}:{nofile}", sys.executable, "-m", "kbroker", "serve"]
    command += ["--data-dir", str(tmp_path / "data"), "--ready-file", str(ready), "--listen", "127.0.0.1:0"]
    command += ["--override", f"log.flush.offset.checkpoint.interval.ms={CHECKPOINT_MS}"]
    with open(log, "ab") as out:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    deadline = time.monotonic() + 30
    while not (ready.exists() and ready.read_text().strip()):
        assert process.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "the broker did not start"
        time.sleep(0.01)
    return process, ready.read_text().strip(), log


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prlimit is Linux's")
def test_out_of_descriptors_the_broker_stays_up_and_works_again_once_connections_close(tmp_path: Path) -> None:
    """300 idle connections against 256 descriptors, opened in the broker's first second (before its background
    handler loader runs) and held over several checkpoint intervals. Before: it exited 1, from the handler loader
    (".../kbroker/apis/produce.py") or the checkpoint (".../recovery-point-offset-checkpoint.tmp")."""
    process, address, log_path = start_limited(tmp_path, 256)
    host, port = address.rsplit(":", 1)
    idle: list[socket.socket] = []
    try:
        for _ in range(300):
            idle.append(socket.create_connection((host, int(port)), timeout=10))
        alive_for(process, 1.0 + 6 * CHECKPOINT_MS / 1000)
        for sock in idle:
            sock.close()
        idle.clear()
        deadline = time.monotonic() + 30
        while True:  # descriptors come back as the broker sees the connections close
            try:
                client = WireClient(address)
                create(client)
                break
            except (OSError, ConnectionError):
                assert time.monotonic() < deadline, "the broker never served a new connection"
                time.sleep(0.2)
        with client:
            assert produce(client, b"after") == (ErrorCode.NONE, 0)
            assert fetch_values(client) == [(0, b"after")]
            assert commit(client, 1) == ErrorCode.NONE
            assert committed(client) == 1
        alive_for(process, 3 * CHECKPOINT_MS / 1000)
    finally:
        for sock in idle:
            sock.close()
        if process.poll() is None:
            process.terminate()
        process.wait(timeout=60)
    log = log_path.read_text()
    assert process.returncode == 0, log
    assert log.count(CHECKPOINT_FAILED) <= 1, log
    assert "Traceback" not in log, log
    assert TOPIC  # the topic the helpers use
