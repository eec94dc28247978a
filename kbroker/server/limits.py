"""The open-file limit: raised at start-up as the JVM does, and named with its fix when accept runs out.

Every connection and every open segment or index file is a descriptor. Kafka's JVM raises its soft
RLIMIT_NOFILE to the hard limit at start-up (HotSpot's -XX:+MaxFDLimit, on by default); kbroker does the same
(``raise_open_file_limit``, called by kbroker/app.py). When accept() still fails for lack of descriptors the
accept loop retries with backoff and logs ``accept_failure_message`` once: the limits in force and how to raise
them, instead of one error per attempt.
"""

from __future__ import annotations

import errno
import logging
import sys
from typing import NamedTuple

try:
    import resource
except ImportError:  # not on this platform (Windows): there is no limit to read or raise
    resource = None  # type: ignore[assignment]

log = logging.getLogger("kbroker.server")

# macOS refuses a soft limit above OPEN_MAX even when the hard limit is unlimited (the JVM caps it the same way).
_DARWIN_OPEN_MAX = 10240
_LINUX_NR_OPEN = 1 << 20  # the most descriptors a Linux process may have by default (fs.nr_open)


class OpenFileLimit(NamedTuple):
    soft: int  # resource.RLIM_INFINITY (-1 on Linux) for no limit
    hard: int

    def __str__(self) -> str:
        return f"soft {_limit_text(self.soft)}, hard {_limit_text(self.hard)}"


def _limit_text(value: int) -> str:
    return "unlimited" if resource is not None and value == resource.RLIM_INFINITY else str(value)


def open_file_limit() -> OpenFileLimit | None:
    """The process's RLIMIT_NOFILE, or None where the platform has none."""
    if resource is None:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return OpenFileLimit(soft, hard)


def raise_open_file_limit() -> tuple[OpenFileLimit, OpenFileLimit] | None:
    """Raise the soft open-file limit to the hard one; (before, after) when it changed, else None."""
    before = open_file_limit()
    if resource is None or before is None or before.soft == resource.RLIM_INFINITY:
        return None
    target = before.hard
    if target == resource.RLIM_INFINITY:  # a soft limit must be a number: Linux's default fs.nr_open
        target = _LINUX_NR_OPEN
    if sys.platform == "darwin":
        target = min(_DARWIN_OPEN_MAX, target)
    if target <= before.soft:
        return None
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, before.hard))
    except (ValueError, OSError) as exc:  # refused (a container's policy, say): run with what we have
        log.info("could not raise the open-file limit (%s) to %s: %s", before, _limit_text(target), exc)
        return None
    after = open_file_limit()
    assert after is not None
    return before, after


def accept_failure_message(listener: str, exc: OSError) -> str:
    """One line for an accept() that failed for lack of resources: what ran out and how to give more."""
    if exc.errno == errno.EMFILE:
        limit = open_file_limit()
        return (
            f"listener {listener} cannot accept connections: {exc.strerror or exc} (open-file limit: {limit}). "
            "Raise it before starting kbroker (ulimit -n 65536, or LimitNOFILE=65536 in a systemd unit); "
            "connections already open are still served and accepting is retried with backoff"
        )
    if exc.errno == errno.ENFILE:
        return (
            f"listener {listener} cannot accept connections: {exc.strerror or exc} (the system-wide limit, "
            "fs.file-max). Raise it (sysctl fs.file-max) or close other programs' files; connections already "
            "open are still served and accepting is retried with backoff"
        )
    return (
        f"listener {listener} cannot accept connections: {exc.strerror or exc} (out of memory for sockets); "
        "connections already open are still served and accepting is retried with backoff"
    )
