"""The ``records_loops`` fixture: a test that uses it runs twice, once with protocol.records' C loops
(protocol/_records_native.c) and once with its pure-Python loops, which a machine without a compiler runs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from protocol import records

NATIVE = records._native


@pytest.fixture(params=["native", "python"])
def records_loops(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "native" and NATIVE is None:
        pytest.skip("protocol._records_native is not built (pip install -e . builds it; CI requires it)")
    monkeypatch.setattr(records, "_native", NATIVE if request.param == "native" else None)
    yield request.param
