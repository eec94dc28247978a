"""A helper of the storage tests that race a worker thread against the event loop's operations."""

from __future__ import annotations

import threading
from collections.abc import Callable


def run_in_thread(target: Callable[[], object]) -> tuple[threading.Thread, list[BaseException]]:
    """Start ``target`` in a thread; the list collects what it raised, for the test to assert on."""
    errors: list[BaseException] = []

    def guarded() -> None:
        try:
            target()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors.append(exc)

    thread = threading.Thread(target=guarded)
    thread.start()
    return thread, errors
