from __future__ import annotations

from collections.abc import Iterator

import pytest
from member_processes import MemberProcess


@pytest.fixture
def members() -> Iterator[list[MemberProcess]]:
    """The member processes a test starts (it appends them here); any still running are killed at its end."""
    started: list[MemberProcess] = []
    yield started
    for member in started:
        member.stop()
