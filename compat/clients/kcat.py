"""kcat (librdkafka inside), driven as a user drives it: one kcat command per step.

What kcat cannot do is Unsupported: admin changes (it only lists metadata), per-record timestamps, listing
watermarks, and committing on request in group mode. It reports no offsets for what it produces, only
"delivered to partition P (offset O)" lines at -vvv in delivery order, so the adapter reads those offsets
back with kcat to tell which record landed where. With SCRAM, a librdkafka older than 2.6.1 cannot log in to
Kafka 4 (SCRAM_FIXED_IN says why): compat/test_security.py expects that refusal from such a kcat.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import threading
import time
from collections import defaultdict
from functools import cache
from typing import Any

from compat.clients.api import (
    AUTHENTICATION_FAILED,
    LIBRDKAFKA_SECURITY_OPTIONS,
    Adapter,
    ClientError,
    Json,
    Unsupported,
)

KCAT = shutil.which("kcat") or shutil.which("kafkacat")
KEY_END = "\x1f"  # -K: between key and value (ASCII unit separator)
RECORD_END = "\x1e"  # -D: between records (ASCII record separator), so values may hold newlines
DELIVERED = re.compile(r"% Message delivered to partition (\d+) \(offset (\d+)\)")
FAILED = re.compile(r"% Delivery failed for message: (.*)")
REBALANCED = re.compile(r"% Group \S+ rebalanced \(memberid [^)]*\): (assigned|revoked): ?(.*)")
ASSIGNED_PARTITION = re.compile(r"(\S+) \[(\d+)\]")
# librdkafka's messages for the broker errors scenarios expect, by Kafka's name.
BROKER_ERRORS = {
    "Broker: Message size too large": "MESSAGE_TOO_LARGE",
    "Broker: Broker failed to validate record": "INVALID_RECORD",
    "Broker: Topic authorization failed": "TOPIC_AUTHORIZATION_FAILED",
    "Broker: Group authorization failed": "GROUP_AUTHORIZATION_FAILED",
    # a group member's refusal at FindCoordinator: "% ERROR: Consumer error: FindCoordinator response error: ..."
    "response error: Group authorization failed": "GROUP_AUTHORIZATION_FAILED",
}
# librdkafka's log line for credentials the broker refused (kcat retries until its message timeout).
AUTHENTICATION_FAILURE = re.compile(r"SASL authentication error: [^\n]*|Authentication failed[^\n]*")


# librdkafka before 2.6.1 puts the client nonce twice in SCRAM's client-final message (r=<client nonce><client
# nonce><server nonce>; confluentinc/librdkafka#4895). Kafka 4.x compares that nonce with its own exactly, as
# RFC 5802 says, and refuses: "invalid credentials with SASL mechanism SCRAM-SHA-256" for the right password.
SCRAM_FIXED_IN = (2, 6, 1)


@cache
def librdkafka_version() -> tuple[int, ...]:
    banner = subprocess.run([KCAT, "-V"], capture_output=True, text=True).stdout if KCAT else ""
    found = re.search(r"librdkafka (\d+)\.(\d+)\.(\d+)", banner)
    return tuple(int(part) for part in found.groups()) if found else (0, 0, 0)


def scram_nonce_bug() -> str | None:
    """Why this kcat's SCRAM logins are refused by Kafka 4.x (and kbroker) though the password is right; None if
    its librdkafka has the fix."""
    if librdkafka_version() >= SCRAM_FIXED_IN:
        return None
    version = ".".join(map(str, librdkafka_version()))
    return f"kcat's librdkafka {version} repeats the client nonce in SCRAM's final message (fixed in 2.6.1)"


def security_arguments(security: dict[str, str]) -> list[str]:
    arguments = [f"{LIBRDKAFKA_SECURITY_OPTIONS[key]}={value}" for key, value in security.items()]
    if security:
        arguments.append("message.timeout.ms=10000")  # a refused authentication is retried until then
    return [part for argument in arguments for part in ("-X", argument)]


def consumed(line: dict[str, Any]) -> dict[str, Json]:
    headers = line.get("headers") or []
    return {
        "topic": line["topic"],
        "partition": line["partition"],
        "offset": line["offset"],
        "timestamp": line["ts"],
        "key": line["key"],
        "value": line["payload"],
        "headers": [[headers[i], headers[i + 1]] for i in range(0, len(headers), 2)],
    }


class GroupMember:
    """``kcat -G``: a balanced consumer streaming JSON records; its assignment read from its stderr."""

    def __init__(self, command: list[str]) -> None:
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.records: list[dict[str, Json]] = []
        self.assignment: list[list[Json]] = []
        self.log: list[str] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._records, daemon=True).start()
        self.events = threading.Thread(target=self._events, daemon=True)
        self.events.start()

    def _records(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("{"):
                with self.lock:
                    self.records.append(consumed(json.loads(line)))

    def _events(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.log.append(line)
            found = REBALANCED.search(line)
            if found:
                kind, partitions = found.groups()
                now = sorted([t, int(p)] for t, p in ASSIGNED_PARTITION.findall(partitions))
                with self.lock:
                    self.assignment = now if kind == "assigned" else []

    def take(self) -> dict[str, Json]:
        with self.lock:
            records, self.records = self.records, []
            return {"records": records, "assignment": list(self.assignment)}


class KcatAdapter(Adapter):
    def __init__(self, bootstrap: str) -> None:
        if KCAT is None:
            raise RuntimeError("kcat is not installed")
        super().__init__(bootstrap)
        self.connection = ["-b", bootstrap, *security_arguments(self.security)]

    def _run(
        self, *args: str, stdin: str | None = None, timeout: float = 60, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        run = subprocess.run(
            [KCAT, *self.connection, *args], input=stdin, capture_output=True, text=True, timeout=timeout
        )
        refused = AUTHENTICATION_FAILURE.search(run.stderr)
        if refused and run.returncode != 0:
            raise ClientError(AUTHENTICATION_FAILED, refused.group(0))
        if check and run.returncode != 0:
            raise ClientError("KCAT_FAILED", f"kcat {' '.join(args)} exited {run.returncode}: {run.stderr[-2000:]}")
        return run

    def version(self) -> str:
        line = subprocess.run([KCAT, "-V"], capture_output=True, text=True).stdout.splitlines()[3]
        found = re.search(r"Version (\S+) .*librdkafka (\S+)", line)
        return f"{found.group(1)} (librdkafka {found.group(2)})" if found else line

    # --- admin: metadata only ------------------------------------------------------------------------------
    def list_topics(self) -> list[str]:
        metadata = json.loads(self._run("-L", "-J").stdout)
        return sorted(t["topic"] for t in metadata["topics"] if not t["topic"].startswith("__"))

    def describe_topic(self, topic: str) -> list[int]:
        metadata = json.loads(self._run("-L", "-J", "-t", topic).stdout)
        found = metadata["topics"][0]
        if found.get("error"):
            raise ClientError("KCAT_METADATA", found["error"])
        return sorted(p["partition"] for p in found["partitions"])

    # --- producing -----------------------------------------------------------------------------------------
    def producer_open(self, settings: dict[str, Json]) -> int:
        options = ["-z", settings.get("codec") or "none"]
        if settings.get("idempotent") is not None:
            options += ["-X", f"enable.idempotence={str(settings['idempotent']).lower()}"]
        if settings.get("max_request_bytes"):
            options += ["-X", f"message.max.bytes={settings['max_request_bytes']}"]
        return self._keep("producer", options)

    def producer_send(self, handle: int, topic: str, records: list[dict[str, Json]]) -> list[list[int]]:
        options: list[str] = self._get(handle)
        if any(r.get("timestamp") is not None for r in records):
            raise Unsupported("kcat cannot set a record's timestamp")
        # One kcat run per stretch of records sharing partition and headers (kcat sets those per run).
        runs: list[tuple[Any, list[tuple[int, dict[str, Json]]]]] = []
        for index, r in enumerate(records):
            shape = (r.get("partition"), json.dumps(r.get("headers") or []))
            if not runs or runs[-1][0] != shape:
                runs.append((shape, []))
            runs[-1][1].append((index, r))
        delivered: list[tuple[int, int]] = []
        for (partition, headers_json), members in runs:
            args = ["-P", "-t", topic, "-K", r"\x1f", "-D", r"\x1e", "-vvv", *options]
            if partition is not None:
                args += ["-p", str(partition)]
            for name, value in json.loads(headers_json):
                args += ["-H", name if value is None else f"{name}={value}"]
            stdin = "".join(
                ("" if r.get("key") is None else r["key"] + KEY_END) + (r.get("value") or "") + RECORD_END
                for _, r in members
            )
            run = self._run(*args, stdin=stdin, check=False)  # kcat exits 1 after a failed delivery
            refused = AUTHENTICATION_FAILURE.search(run.stderr)
            if refused:
                raise ClientError(AUTHENTICATION_FAILED, refused.group(0))
            failures = FAILED.findall(run.stderr)
            if failures:
                raise ClientError(BROKER_ERRORS.get(failures[0], "KCAT_DELIVERY_FAILED"), failures[0])
            if run.returncode != 0:
                raise ClientError("KCAT_FAILED", f"kcat exited {run.returncode}: {run.stderr[-2000:]}")
            delivered += [(int(p), int(o)) for p, o in DELIVERED.findall(run.stderr)]
        if len(delivered) != len(records):
            raise ClientError("KCAT_DELIVERY_REPORTS", f"{len(delivered)} reports for {len(records)} records")
        return self._where(topic, records, delivered)

    def _where(self, topic: str, records: list[dict[str, Json]], delivered: list[tuple[int, int]]) -> list[list[int]]:
        """Match the delivery reports to the records by reading what is at those offsets."""
        offsets: dict[int, list[int]] = defaultdict(list)
        for partition, offset in delivered:
            offsets[partition].append(offset)
        waiting: dict[tuple[Any, Any], list[int]] = defaultdict(list)  # (key, value) -> record indexes, in order
        for index, r in enumerate(records):
            waiting[(r.get("key"), r.get("value") or "")].append(index)
        where: list[list[int]] = [[]] * len(records)
        for partition, found in offsets.items():
            first, last = min(found), max(found)
            for stored in self.read(topic, partition, first, last - first + 1, {}):
                if stored["offset"] in found:
                    index = waiting[(stored["key"], stored["value"] or "")].pop(0)
                    where[index] = [partition, stored["offset"]]
        return where

    def producer_close(self, handle: int) -> None:
        self._drop(handle)

    # --- reading by position -------------------------------------------------------------------------------
    def read(
        self, topic: str, partition: int, offset: int, count: int, settings: dict[str, Json]
    ) -> list[dict[str, Json]]:
        args = ["-C", "-t", topic, "-p", str(partition), "-o", str(offset), "-c", str(count), "-e", "-J", "-q"]
        if settings.get("max_partition_fetch_bytes"):
            args += ["-X", f"max.partition.fetch.bytes={settings['max_partition_fetch_bytes']}"]
        run = self._run(*args, timeout=settings.get("timeout_ms", 15000) / 1000 + 30)
        return [consumed(json.loads(line)) for line in run.stdout.splitlines() if line.startswith("{")]

    def offsets_for_times(self, topic: str, timestamps: dict[str, int]) -> dict[str, int | None]:
        args = ["-Q", "-J"]
        for partition, ts in timestamps.items():
            args += ["-t", f"{topic}:{partition}:{ts}"]
        answer = json.loads(self._run(*args).stdout)[topic]
        return {p: (None if answer[p]["offset"] < 0 else answer[p]["offset"]) for p in timestamps}

    # --- consumer groups -----------------------------------------------------------------------------------
    def consumer_open(self, group: str, topics: list[str], settings: dict[str, Json]) -> int:
        command = [KCAT, *self.connection, "-G", group, "-J", "-u"]
        command += ["-X", "auto.offset.reset=earliest", "-X", "enable.auto.commit=false"]
        command += ["-X", f"session.timeout.ms={settings['session_timeout_ms']}"]
        command += ["-X", f"heartbeat.interval.ms={settings['heartbeat_interval_ms']}", *topics]
        return self._keep("consumer", GroupMember(command))

    def consumer_poll(self, handle: int, timeout_ms: int) -> dict[str, Json]:
        member: GroupMember = self._get(handle)
        if member.process.poll() is not None:
            member.events.join(10)  # its last lines (the reason it exited) read to the end
            log = "".join(member.log[-20:])
            refused = AUTHENTICATION_FAILURE.search(log)
            if refused:
                raise ClientError(AUTHENTICATION_FAILED, refused.group(0))
            for message, name in BROKER_ERRORS.items():
                if message in log:
                    raise ClientError(name, log)
            raise ClientError("KCAT_EXITED", log)
        time.sleep(timeout_ms / 1000)
        return member.take()

    def consumer_close(self, handle: int) -> None:
        member: GroupMember = self._drop(handle)
        member.process.send_signal(signal.SIGTERM)  # kcat closes its consumer: LeaveGroup
        try:
            member.process.wait(30)
        except subprocess.TimeoutExpired:
            member.process.kill()
            member.process.wait()
