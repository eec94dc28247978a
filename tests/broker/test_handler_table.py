"""The handler table: every entry resolves to a handler, and ApiVersions advertises exactly the table."""

from __future__ import annotations

import inspect

import pytest

from kbroker.apis import ADVERTISED_MIN_VERSION, HANDLERS, advertised_versions
from protocol.messages import APIS


@pytest.mark.parametrize("api_key", sorted(HANDLERS))
def test_every_entry_resolves_to_a_coroutine_handler(api_key: int) -> None:
    handler = HANDLERS[api_key]
    assert inspect.iscoroutinefunction(handler.handle), handler.target
    low, high = APIS[api_key].valid_versions
    assert low <= handler.min_version <= handler.max_version <= high


def test_api_versions_is_derived_from_the_table() -> None:
    advertised = {(v.api_key, v.min_version, v.max_version) for v in advertised_versions()}
    expected = {(k, ADVERTISED_MIN_VERSION.get(k, h.min_version), h.max_version) for k, h in HANDLERS.items()}
    assert advertised == expected
