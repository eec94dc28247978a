"""The generated codecs match the schemas they came from, and every API/version round-trips."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from protocol.messages import APIS

REPO = Path(__file__).resolve().parent.parent


def test_generated_code_has_not_drifted() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "tools" / "gen_messages.py"), "--check"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_registry_covers_every_api_of_the_schema_jar() -> None:
    import zipfile

    sys.path.insert(0, str(REPO / "tools"))
    import gen_messages

    with zipfile.ZipFile(gen_messages.schema_jar()) as jar:
        names = [Path(n).stem for n in jar.namelist() if n.startswith("common/message/") and n.endswith("Request.json")]
    removed = {"ControlledShutdownRequest", "LeaderAndIsrRequest", "StopReplicaRequest", "UpdateMetadataRequest"}
    assert len(names) > 90  # about 200 schemas, half of them requests
    ours = {api.request_class for api in APIS.values()}
    assert set(names) - removed - {"RequestHeader"} == ours
    assert {"ConsumerGroupHeartbeatRequest", "ShareFetchRequest", "StreamsGroupHeartbeatRequest"} <= ours
    assert APIS[0].name == "Produce" and APIS[1].valid_versions == (4, 18)
    assert APIS[18].flexible_versions == (3, 32767)
    assert APIS[69].name == "ConsumerGroupDescribe" and APIS[69].valid_versions == (0, 1)


CASES = [
    (api, kind, version)
    for api in APIS.values()
    for kind in ("request", "response")
    for version in range(api.valid_versions[0], api.valid_versions[1] + 1)
]


@pytest.mark.parametrize("api,kind,version", CASES, ids=[f"{a.name}-{k}-v{v}" for a, k, v in CASES])
def test_default_message_round_trips(api, kind, version) -> None:
    cls = api.request_type() if kind == "request" else api.response_type()
    encoded = cls().encode(version)
    decoded, end = cls.decode(encoded, version)
    assert end == len(encoded)
    assert decoded.encode(version) == encoded


def test_unknown_tagged_fields_are_kept_and_re_encoded() -> None:
    from protocol.messages.metadata_request import MetadataRequest

    plain = MetadataRequest(topics=None).encode(12)
    assert plain.endswith(b"\x00")  # the empty tagged-field section
    with_tags = plain[:-1] + bytes([2, 5, 3, 1, 2, 3, 90, 1, 9])  # tags 5 and 90
    decoded, end = MetadataRequest.decode(with_tags, 12)
    assert end == len(with_tags)
    assert decoded.unknown_tagged_fields == {5: b"\x01\x02\x03", 90: b"\x09"}
    assert decoded.encode(12) == with_tags


def test_known_tagged_field_decodes_into_its_attribute() -> None:
    from protocol.messages.fetch_request import FetchRequest

    request = FetchRequest(cluster_id="abc", max_wait_ms=10, min_bytes=1)
    encoded = request.encode(12)
    decoded, _ = FetchRequest.decode(encoded, 12)
    assert decoded.cluster_id == "abc"
    assert FetchRequest.decode(FetchRequest(max_wait_ms=10).encode(12), 12)[0].cluster_id is None


def test_modules_import_lazily() -> None:
    code = "import sys, protocol.framing; print(sum(1 for m in sys.modules if m.startswith('protocol.messages.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert int(out.stdout) == 2, out.stderr  # only the two header modules


def test_every_module_imports() -> None:
    for api in APIS.values():
        importlib.import_module(api.request_module)
        importlib.import_module(api.response_module)
