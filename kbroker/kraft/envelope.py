"""The Envelope (API key 58, KIP-590) a broker wraps a client's admin request in to forward it to the controller.

Kafka's broker forwards the request's header and body as it received them (or, for a request it answered in
part, the rest re-encoded with the client's header), the client's principal as its KafkaPrincipalSerde writes it
and the client's IP address; the controller handles the inner request as that principal from that address and
answers the inner response, header included, in the EnvelopeResponse. This is the sans-I/O half: building the
envelope and reading the inner response back.

The principal is serialized as Kafka's DefaultKafkaPrincipalBuilder does: an int16 version, then a
DefaultPrincipalData record (type, name, token_authenticated) at that version. Kafka's generated writer refuses a
string longer than 32767 bytes, so a principal with such a name cannot be forwarded (``PrincipalSerializationError``).
"""

from __future__ import annotations

import ipaddress
import struct

from protocol._codec import Buffer, Message
from protocol.exceptions import DecodeError
from protocol.framing import decode_response
from protocol.messages.default_principal_data import DefaultPrincipalData
from protocol.messages.envelope_request import EnvelopeRequest

PRINCIPAL_DATA_VERSION = DefaultPrincipalData.VALID_VERSIONS[1]
MAX_STRING_BYTES = 0x7FFF  # Kafka's generated code writes no longer string
_VERSION = struct.Struct(">h")


class PrincipalSerializationError(ValueError):
    """The principal cannot be written as Kafka's DefaultPrincipalData."""


def serialize_principal(principal: str, *, token_authenticated: bool = False) -> bytes:
    """``Type:name`` as Kafka's DefaultKafkaPrincipalBuilder.serialize writes it (version-prefixed)."""
    principal_type, colon, name = principal.partition(":")
    if not colon:
        raise PrincipalSerializationError(f"principal {principal[:80]!r} has no type (Type:name)")
    for what, text in (("type", principal_type), ("name", name)):
        if len(text.encode()) > MAX_STRING_BYTES:
            raise PrincipalSerializationError(f"the principal's {what} is too long to be serialized")
    data = DefaultPrincipalData(type=principal_type, name=name, token_authenticated=token_authenticated)
    return _VERSION.pack(PRINCIPAL_DATA_VERSION) + data.encode(PRINCIPAL_DATA_VERSION)


def deserialize_principal(data: Buffer) -> tuple[str, bool]:
    """``Type:name`` and token_authenticated from Kafka's serialized principal (DecodeError if unreadable)."""
    if len(data) < _VERSION.size:
        raise DecodeError("serialized principal shorter than its version")
    (version,) = _VERSION.unpack_from(data, 0)
    if version != PRINCIPAL_DATA_VERSION:
        raise DecodeError(f"Invalid principal data version {version}")
    record, end = DefaultPrincipalData.decode(data, version, _VERSION.size)
    if end != len(data):
        raise DecodeError(f"serialized principal has {len(data) - end} trailing bytes")
    return f"{record.type}:{record.name}", record.token_authenticated


def address_bytes(host: str) -> bytes:
    """The client's IP address as Java's InetAddress.getAddress gives it: 4 bytes, or 16 for IPv6."""
    address = ipaddress.ip_address(host.strip("[]").partition("%")[0])
    return address.packed


def envelope(request_frame: Buffer, principal: str, client_host: str) -> EnvelopeRequest:
    """The Envelope of one request frame (header and body, no size prefix) sent by ``principal`` from
    ``client_host`` (an IP address); PrincipalSerializationError if the principal cannot be written."""
    return EnvelopeRequest(
        request_data=bytes(request_frame),
        request_principal=serialize_principal(principal),
        client_host_address=address_bytes(client_host),
    )


def inner_response(response_data: Buffer, api_key: int, api_version: int) -> tuple[int, Message]:
    """Correlation id and body of the response an EnvelopeResponse carries (DecodeError if unreadable)."""
    correlation_id, body = decode_response(response_data, api_key, api_version)
    return correlation_id, body
