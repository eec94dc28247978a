"""How the message browser shows a record's bytes: as text, as indented JSON, or as hex.

The result is plain text; the templates escape it (record contents are untrusted).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

FORMATS = ("text", "json", "hex")


@dataclass(frozen=True)
class Shown:
    """Bytes as shown: the text, and a note when the chosen format did not fit (e.g. "not JSON")."""

    text: str
    note: str = ""
    null: bool = False


def show(data: bytes | None, fmt: str) -> Shown:
    if data is None:
        return Shown("null", null=True)
    if fmt == "hex":
        return Shown(hex_dump(data))
    if fmt == "json":
        pretty = pretty_json(data)
        if pretty is not None:
            return Shown(pretty)
        shown = as_text(data)
        return Shown(shown.text, "not JSON" + (f"; {shown.note}" if shown.note else ""))
    return as_text(data)


def as_text(data: bytes) -> Shown:
    """UTF-8 text; bytes that are not UTF-8 become U+FFFD, with a note saying so."""
    try:
        return Shown(data.decode("utf-8"))
    except UnicodeDecodeError:
        return Shown(data.decode("utf-8", errors="replace"), "not UTF-8: see hex")


def pretty_json(data: bytes) -> str | None:
    """``data`` as JSON indented by two spaces (keys in their order), or None if it is not JSON."""
    try:
        return json.dumps(json.loads(data), indent=2, ensure_ascii=False)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None


def hex_dump(data: bytes, width: int = 16) -> str:
    """Lines of ``width`` bytes: offset, hex pairs, and the printable ASCII (``.`` for the rest), as ``xxd``."""
    lines = []
    for start in range(0, len(data), width):
        chunk = data[start : start + width]
        pairs = " ".join(f"{byte:02x}" for byte in chunk)
        ascii_text = "".join(chr(byte) if 0x20 <= byte < 0x7F else "." for byte in chunk)
        lines.append(f"{start:08x}  {pairs:<{width * 3 - 1}}  {ascii_text}")
    return "\n".join(lines) if lines else "(empty)"
