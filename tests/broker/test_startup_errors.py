"""Start-up: errors that name the real problem (data directory, port, lock, damaged files) in one line with a
non-zero exit, `kbroker --version`, and a ready line that counts from process start."""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import kbroker
from kbroker.cli import DAMAGED_FILE_FIXES, seconds_since_process_start
from kbroker.config import BrokerConfig
from kbroker.durable.files import LOCK_FILE, DamagedFileError, DataDirError, DataDirLock, lock_data_dir
from kbroker.health import check
from kbroker.storage import LogManager
from kbroker.storage.backend import LOG_START_OFFSET_FILE
from kbroker.storage.log import LogConfig, PartitionLog
from kbroker.storage.producer_state import ProducerStateTable
from kbroker.testing import BrokerProcess, RunningBroker


def serve(data_dir: Path | str, *args: str, listen: str = "127.0.0.1:0") -> subprocess.CompletedProcess[str]:
    """`kbroker serve` that is expected to stop at start-up (a broker that starts is killed after 30 s)."""
    command = [sys.executable, "-m", "kbroker", "serve", "--data-dir", str(data_dir), "--listen", listen, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=30)


def assert_one_line(result: subprocess.CompletedProcess[str], expected: str) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip() == expected
    assert result.returncode == 1


# --- --version ---------------------------------------------------------------------------------------------


def test_version_flag_prints_the_package_version() -> None:
    result = subprocess.run([sys.executable, "-m", "kbroker", "--version"], capture_output=True, text=True, timeout=30)
    assert (result.returncode, result.stdout, result.stderr) == (0, f"kbroker {kbroker.__version__}\n", "")
    assert kbroker.__version__ == importlib.metadata.version("kbroker")


def test_serve_path_does_not_load_importlib_metadata() -> None:
    code = "import sys, kbroker.cli, kbroker.broker; print('importlib.metadata' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert result.stdout.strip() == "False", result.stderr


# --- the data directory --------------------------------------------------------------------------------------


def test_data_dir_that_is_a_file(tmp_path: Path) -> None:
    target = tmp_path / "data"
    target.write_text("not a directory")
    assert_one_line(serve(target), f"kbroker: data directory {target} exists but is not a directory")


def test_data_dir_under_a_file(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    target = blocker / "sub" / "data"
    assert_one_line(serve(target), f"kbroker: cannot create data directory {target}: {blocker} is not a directory")


def _read_only_directory(tmp_path: Path) -> Path:
    """A directory this user cannot write: a chmod'ed one, or for root (who ignores modes) /proc/sys."""
    directory = tmp_path / "read-only"
    directory.mkdir()
    directory.chmod(0o555)
    if not os.access(directory, os.W_OK):
        return directory
    directory.chmod(0o755)
    if os.path.isdir("/proc/sys") and not os.access("/proc/sys", os.W_OK):
        return Path("/proc/sys")
    pytest.skip("no directory here that this user cannot write")


def test_unwritable_data_dir(tmp_path: Path) -> None:
    target = _read_only_directory(tmp_path)
    try:
        assert_one_line(serve(target), f"kbroker: data directory {target} is not writable")
    finally:
        if target.is_relative_to(tmp_path):
            target.chmod(0o755)


def test_data_dir_whose_parent_cannot_be_created(tmp_path: Path) -> None:
    parent = tmp_path / "read-only"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        if os.access(parent, os.W_OK):  # root: sysfs refuses new directories at its top even to root
            parent = Path("/sys")
            if not parent.is_dir() or (parent / "kbroker-test").exists():
                pytest.skip("no directory here in which this user cannot create one")
        target = parent / "kbroker-test" / "data"
        result = serve(target)
        if result.returncode == 0 or "kbroker ready" in result.stderr:
            pytest.skip(f"{parent} accepted a new directory")
        assert_one_line(result, f"kbroker: cannot create data directory {target}: {parent} is not writable")
    finally:
        (tmp_path / "read-only").chmod(0o755)


def test_data_dir_checks_name_the_problem_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same checks, without depending on what this user may write: os.access says no."""
    target = tmp_path / "data"
    target.mkdir()
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(DataDirError, match=re.escape(f"data directory {target} is not writable")):
        lock_data_dir(target)


# --- the listener ---------------------------------------------------------------------------------------------


def test_port_in_use_still_says_cannot_listen(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = serve(tmp_path / "data", listen=f"127.0.0.1:{port}")
    assert_one_line(result, f"kbroker: cannot listen on 127.0.0.1:{port}: Address already in use")


# --- one broker per data directory -----------------------------------------------------------------------------


def test_a_data_dir_in_use_is_refused_and_freed_at_shutdown(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    first = RunningBroker(data_dir).start()
    try:
        assert (data_dir / LOCK_FILE).exists()
        expected = f"data directory {data_dir} is in use: another broker holds its lock ({data_dir / LOCK_FILE})"
        assert_one_line(serve(data_dir), f"kbroker: {expected}")
        with pytest.raises(RuntimeError) as info:  # a second broker in the same process is refused too
            RunningBroker(data_dir).start()
        assert str(info.value) == f"broker failed to start: {expected}"
        first.restart()  # stop releases the lock, so the same broker starts again on the same directory
        socket.create_connection(("127.0.0.1", first.port), timeout=5).close()
    finally:
        first.stop()
    process = BrokerProcess(data_dir).start()  # released at shutdown: another process can have it now
    try:
        with pytest.raises(DataDirError, match="another broker holds its lock"):
            DataDirLock(data_dir).acquire()
    finally:
        process.kill()  # a crash: the operating system drops the lock with the process
    DataDirLock(data_dir).acquire().release()


def test_a_broker_that_fails_to_start_releases_the_lock(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "producer-id-block").write_text("garbage")
    with pytest.raises(RuntimeError, match="damaged file"):
        RunningBroker(data_dir).start()
    DataDirLock(data_dir).acquire().release()


# --- damaged metadata files -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "content", "problem"),
    [
        ("topics.json", '{"version": 1, "topics": {', "not valid JSON (line 1, column 27)"),
        ("topics.json", b'{"\x80"}', "not valid JSON"),
        (
            "topics.json",
            '{"version": 1, "topics": {"t": {"id": "nope", "partitions": 1}}}',
            "unexpected content (ValueError: badly formed hexadecimal UUID string)",
        ),
        ("topics.json", "[]", "unexpected content (AttributeError: 'list' object has no attribute 'get')"),
        ("meta.properties", "version=1\nnode.id=0\n", "no cluster.id"),
        ("meta.properties", "version=1\ncluster.id=x\nnode.id=one\n", "node.id 'one' is not an integer"),
        ("producer-id-block", "12x", "expected the next producer id, found '12x'"),
        ("finalized-features.json", "{not json", "not valid JSON (line 1, column 2)"),
    ],
)
def test_damaged_metadata_file_is_named(tmp_path: Path, name: str, content: str | bytes, problem: str) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    path = data_dir / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert_one_line(serve(data_dir), f"kbroker: damaged file {path}: {problem}; to fix: {DAMAGED_FILE_FIXES[name]}")


def test_damaged_log_start_offset_is_named(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    manager = LogManager(tmp_path, BrokerConfig({}).topic_defaults())
    manager.create_topic("t", 1, {})
    manager.close()
    path = tmp_path / "t-0" / LOG_START_OFFSET_FILE
    path.write_text("-")
    with caplog.at_level(logging.ERROR, logger="kbroker.storage"):
        plog = PartitionLog("t", 0, tmp_path / "t-0", LogConfig(), clean=True)
    # As Kafka with an unreadable log-start-offset-checkpoint: the log starts at its first segment (issue #26).
    assert plog.log_start_offset == 0
    assert f"damaged file {path}: expected the log start offset, found '-'" in caplog.text


@pytest.mark.parametrize("content", ["{", "[1]", '{"7": {"epoch": "x"}}'])
def test_damaged_producer_snapshot_is_named_and_rebuilt_from_the_log(
    tmp_path: Path, content: str, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "t-0"
    directory.mkdir()
    ProducerStateTable().write_snapshot(directory, 0)
    snapshot = directory / f"{0:020d}.snapshot"
    snapshot.write_text(content)
    with pytest.raises(DamagedFileError, match=f"^damaged file {re.escape(str(snapshot))}: "):
        ProducerStateTable.load_snapshot(directory, 0)
    with caplog.at_level(logging.WARNING, logger="kbroker.storage"):
        plog = PartitionLog("t", 0, directory, LogConfig(), clean=True)
    plog.close()
    assert f"unreadable producer snapshot, rebuilding it from the log: damaged file {snapshot}" in caplog.text


def test_damaged_offsets_journal_line_is_named_and_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from kbroker.coordinators.migration import migrate_offsets_journal
    from kbroker.groups.offsets import OffsetStore

    # The JSON-lines journal of older kbrokers, migrated into __consumer_offsets with its damaged line skipped.
    path = tmp_path / "__consumer_offsets" / "offsets.journal"
    path.parent.mkdir()
    path.write_text(json.dumps({"g": "g", "t": "t", "p": 0, "o": 5, "e": -1, "m": None, "ts": 1}) + "\n")
    with open(path, "ab") as journal:
        journal.write(b"\xff{not json\n")
    journal_line = json.dumps({"g": "g", "t": "t", "p": 1, "o": 9})
    with open(path, "a") as journal:
        journal.write(journal_line + "\n")
    store = OffsetStore.in_data_dir(tmp_path, partitions=2)
    with caplog.at_level(logging.WARNING, logger="kbroker.groups"):
        assert migrate_offsets_journal(tmp_path, store)
    store.close()
    assert f"{path}: skipping record 2, whose content is not a valid offsets change" in caplog.text
    reopened = OffsetStore.in_data_dir(tmp_path, partitions=2)
    assert {k: c.offset for k, c in reopened.get("g").items()} == {("t", 0): 5, ("t", 1): 9}
    reopened.close()


# --- the ready line -------------------------------------------------------------------------------------------


def test_process_age_counts_from_process_start() -> None:
    code = "import time; time.sleep(0.5); from kbroker.cli import seconds_since_process_start as s; print(s())"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    if result.stdout.strip() == "None":
        pytest.skip("no /proc/self/stat here")
    assert 0.5 <= float(result.stdout) < 20
    here = seconds_since_process_start()
    assert here is None or here > 0


def test_ready_line_reports_time_since_process_start(tmp_path: Path) -> None:
    """Half a second spent before kbroker is even imported shows in the ready line's start-up time."""
    code = (
        "import sys, time; time.sleep(0.5); from kbroker.cli import main; "
        f"sys.exit(main(['serve', '--listen', '127.0.0.1:0', '--data-dir', {str(tmp_path / 'data')!r}]))"
    )
    process = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    try:
        deadline = time.monotonic() + 30
        line = ""
        while "kbroker ready" not in line and time.monotonic() < deadline and process.poll() is None:
            line = process.stderr.readline()
        match = re.search(r"kbroker ready in (\d+\.\d\d)s: listening on 127\.0\.0\.1:(\d+)", line)
        assert match, line
        if seconds_since_process_start() is not None:
            assert float(match.group(1)) >= 0.5
        check(f"127.0.0.1:{match.group(2)}", 10)  # answered: its SIGTERM handler is installed by now
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == 0


# --- a full disk at start-up (issue #26, item 7) ----------------------------------------------------------------


def test_a_write_failing_at_start_up_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: "kbroker: No space left on device" and nothing else (a failed write names no file). The live case, a
    full tmpfs, is in tests/broker/test_resource_exhaustion_live.py."""
    from kbroker import cli
    from kbroker.durable import fs
    from kbroker.durable.fs import FaultyFileSystem

    data_dir = tmp_path / "data"
    with RunningBroker(data_dir):
        pass
    with fs.installed(FaultyFileSystem(disk_full=True)):
        code = cli.main(["serve", "--data-dir", str(data_dir), "--listen", "127.0.0.1:0", "--log-level", "ERROR"])
    assert code == 1
    # The first write of a start: the metadata log's new epoch, in quorum-state, before anything is committed.
    quorum_state = data_dir / "__cluster_metadata-0" / "quorum-state.tmp"
    assert capsys.readouterr().err == f"kbroker: No space left on device: {quorum_state}\n"


def test_an_os_error_naming_no_file_names_the_data_directory() -> None:
    from kbroker.cli import error_line

    assert error_line(OSError(28, "No space left on device"), Path("/var/lib/kbroker")) == (
        "kbroker: No space left on device (data directory /var/lib/kbroker)"
    )
    assert error_line(OSError(28, "No space left on device", "/d/f.tmp"), Path("/d")) == (
        "kbroker: No space left on device: /d/f.tmp"
    )
