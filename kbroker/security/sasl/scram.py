"""SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677) as Kafka's ScramSaslServer runs them, sans-I/O.

The exchange is two round trips::

    client-first  n,[a=authzid],n=<saslname>,r=<client nonce>[,<extension>=<value>...]
    server-first  r=<client nonce><server nonce>,s=<base64 salt>,i=<iterations>
    client-final  c=<base64 gs2 header, "biws" for "n,,">,r=<combined nonce>,p=<base64 proof>
    server-final  v=<base64 server signature>

The messages are parsed with the grammar of Kafka's ScramMessages (a message that does not match fails the
exchange), and the AuthMessage is rebuilt as Kafka rebuilds it (the bare client-first with its extensions in a
Java HashMap's order, the client-final without its extensions), so a client that Kafka accepts, kbroker accepts.

Failure messages follow Kafka's split between what a client may be told and what it may not: an unknown user,
a wrong proof and a malformed message all fail with the same generic text ("... invalid credentials with SASL
mechanism SCRAM-SHA-256"), so that a client cannot probe which users exist; only an authorization id that
differs from the user name is told as such. The unknown user fails on the client-first message and the wrong
password on the client-final one, as in Kafka.

The formatter half (``salted_password``, ``client_key``, ``stored_key``, ``server_key``, ``credential_from_*``)
is shared with the credentials of the metadata image (kbroker/security/scram_credentials.py) and the admin API.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kbroker.java_hashing import java_hashmap_order, java_string_hash
from kbroker.security.sasl import SaslAuthenticationFailed, SaslExchangeAborted

if TYPE_CHECKING:
    from kbroker.security.scram_credentials import ScramCredentials


@dataclass(frozen=True, slots=True)
class ScramMechanism:
    """One SCRAM mechanism: its name, hash, the type code the admin APIs use, and Kafka's iteration bounds."""

    name: str
    hash_name: str  # hashlib's name of the hash
    type: int  # AlterUserScramCredentials/DescribeUserScramCredentials' int8 mechanism
    min_iterations: int = 4096
    max_iterations: int = 16384


SCRAM_SHA_256 = ScramMechanism("SCRAM-SHA-256", "sha256", 1)
SCRAM_SHA_512 = ScramMechanism("SCRAM-SHA-512", "sha512", 2)
SCRAM_MECHANISMS: dict[str, ScramMechanism] = {m.name: m for m in (SCRAM_SHA_256, SCRAM_SHA_512)}
SCRAM_MECHANISMS_BY_TYPE: dict[int, ScramMechanism] = {m.type: m for m in (SCRAM_SHA_256, SCRAM_SHA_512)}


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """What the server keeps of a password (RFC 5802 section 3): never the password nor the salted password."""

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


# --- the formatter -------------------------------------------------------------------------------------------


def hmac_digest(mechanism: ScramMechanism, key: bytes, data: bytes) -> bytes:
    return hmac.new(key, data, mechanism.hash_name).digest()


def salted_password(mechanism: ScramMechanism, password: str, salt: bytes, iterations: int) -> bytes:
    """Hi(Normalize(password), salt, i): PBKDF2 with the mechanism's HMAC. Like Kafka, "Normalize" is UTF-8 only
    (no SASLprep), so a client that does SASLprep agrees for every ASCII password."""
    return hashlib.pbkdf2_hmac(mechanism.hash_name, password.encode(), salt, iterations)


def client_key(mechanism: ScramMechanism, salted: bytes) -> bytes:
    return hmac_digest(mechanism, salted, b"Client Key")


def stored_key(mechanism: ScramMechanism, key: bytes) -> bytes:
    return hashlib.new(mechanism.hash_name, key).digest()


def server_key(mechanism: ScramMechanism, salted: bytes) -> bytes:
    return hmac_digest(mechanism, salted, b"Server Key")


def credential_from_salted_password(
    mechanism: ScramMechanism, salt: bytes, salted: bytes, iterations: int
) -> ScramCredential:
    """The credential of an AlterUserScramCredentials upsertion, which carries the salt and salted password."""
    return ScramCredential(
        salt, stored_key(mechanism, client_key(mechanism, salted)), server_key(mechanism, salted), iterations
    )


def random_string() -> str:
    """130 random bits in base 36, as Kafka's ScramFormatter.secureRandomString (nonces, salts)."""
    value = secrets.randbits(130)
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    text = ""
    while True:
        value, digit = divmod(value, 36)
        text = digits[digit] + text
        if value == 0:
            return text


def credential_from_password(
    mechanism: ScramMechanism, password: str, iterations: int, salt: bytes | None = None
) -> ScramCredential:
    """A new credential for ``password``; the salt, unless given, is random (Kafka's: a random base-36 string)."""
    salt = random_string().encode() if salt is None else salt
    return credential_from_salted_password(
        mechanism, salt, salted_password(mechanism, password, salt, iterations), iterations
    )


def sasl_name(username: str) -> str:
    """A user name as it travels in n= (RFC 5802: "=" is "=3D", "," is "=2C")."""
    return username.replace("=", "=3D").replace(",", "=2C")


def username_of(name: str) -> str:
    """The user name a saslname stands for; ValueError for a "=" that is not part of "=2C" or "=3D"."""
    decoded = name.replace("=2C", ",")
    if "=" in decoded.replace("=3D", ""):
        raise ValueError(f"Invalid username: {name}")
    return decoded.replace("=3D", "=")


def _xor(first: bytes, second: bytes) -> bytes:
    return bytes(a ^ b for a, b in zip(first, second, strict=True))


def client_proof(mechanism: ScramMechanism, salted: bytes, auth_message: bytes) -> bytes:
    """ClientProof = ClientKey XOR HMAC(StoredKey, AuthMessage): what a client sends (used by tests)."""
    key = client_key(mechanism, salted)
    return _xor(key, hmac_digest(mechanism, stored_key(mechanism, key), auth_message))


# --- the messages (Kafka's ScramMessages grammar) ------------------------------------------------------------

_VALUE_SAFE = r"[\x01-\x2B\x2D-\x3C\x3E-\x7F]+"  # [\x01-\x7F] but "=" and ","
_VALUE = r"[\x01-\x2B\x2D-\x7F]+"  # [\x01-\x7F] but ","
_PRINTABLE = r"[\x21-\x2B\x2D-\x7E]+"  # [\x21-\x7E] but ","
_SASLNAME = r"(?:[\x01-\x2B\x2D-\x3C\x3E-\x7F]|=2C|=3D)+"
_B64 = r"[a-zA-Z0-9/+]"
_BASE64 = rf"(?:{_B64}{{4}})*(?:{_B64}{{3}}=|{_B64}{{2}}==)?"
_RESERVED = rf"(?:m={_VALUE},)?"
_EXTENSIONS = rf"(?:,[A-Za-z]+={_VALUE})*"

_CLIENT_FIRST = re.compile(
    rf"n,(?:a=(?P<authzid>{_SASLNAME}))?,{_RESERVED}n=(?P<saslname>{_SASLNAME}),r=(?P<nonce>{_PRINTABLE})"
    rf"(?P<extensions>{_EXTENSIONS})"
)
_CLIENT_FINAL = re.compile(rf"c=(?P<channel>{_BASE64}),r=(?P<nonce>{_PRINTABLE}){_EXTENSIONS},p=(?P<proof>{_BASE64})")

TOKEN_AUTH_EXTENSION = "tokenauth"  # delegation tokens: kbroker has none, so such a client is refused


def _extensions(text: str) -> dict[str, str]:
    """Kafka's Utils.parseMap(text, "=", ","): a repeated key keeps its first place and its last value."""
    pairs: dict[str, str] = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        pairs[key] = value
    return pairs


@dataclass(frozen=True, slots=True)
class ClientFirstMessage:
    authorization_id: str
    sasl_name: str
    nonce: str
    extensions: dict[str, str]

    @classmethod
    def parse(cls, text: str) -> ClientFirstMessage:
        match = _CLIENT_FIRST.fullmatch(text)
        if match is None:
            raise ValueError(f"Invalid SCRAM client first message format: {text}")
        extensions = match["extensions"]
        return cls(
            match["authzid"] or "", match["saslname"], match["nonce"], _extensions(extensions[1:]) if extensions else {}
        )

    def bare(self) -> str:
        """client-first-message-bare as Kafka rebuilds it: extensions in its HashMap's order, no reserved m=."""
        text = f"n={self.sasl_name},r={self.nonce}"
        if self.extensions:
            order = java_hashmap_order(list(self.extensions), java_string_hash)
            text += "," + ",".join(f"{key}={self.extensions[key]}" for key in order)
        return text


@dataclass(frozen=True, slots=True)
class ClientFinalMessage:
    channel_binding: bytes
    nonce: str
    proof: bytes

    @classmethod
    def parse(cls, text: str) -> ClientFinalMessage:
        match = _CLIENT_FINAL.fullmatch(text)
        if match is None:
            raise ValueError(f"Invalid SCRAM client final message format: {text}")
        return cls(base64.b64decode(match["channel"]), match["nonce"], base64.b64decode(match["proof"]))

    def without_proof(self) -> str:
        return f"c={base64.b64encode(self.channel_binding).decode()},r={self.nonce}"


def server_first_message(nonce: str, salt: bytes, iterations: int) -> str:
    return f"r={nonce},s={base64.b64encode(salt).decode()},i={iterations}"


def auth_message(client_first_bare: str, server_first: str, client_final_without_proof: str) -> bytes:
    return f"{client_first_bare},{server_first},{client_final_without_proof}".encode()


# --- the server ----------------------------------------------------------------------------------------------


class ScramSaslServer:
    """One SCRAM exchange on the server side. States: client-first expected, client-final expected, complete,
    failed; any failure is final (a new exchange needs a new server)."""

    def __init__(
        self,
        mechanism: ScramMechanism,
        credentials: ScramCredentials,
        server_nonce: Callable[[], str] = random_string,  # fixed by tests replaying RFC test vectors
    ) -> None:
        self.mechanism = mechanism.name
        self._server_nonce = server_nonce
        self._scram = mechanism
        self._credentials = credentials
        self._state = "client-first"
        self._client_first: ClientFirstMessage | None = None
        self._server_first = ""
        self._nonce = ""
        self._credential: ScramCredential | None = None
        self._authorization_id: str | None = None

    @property
    def is_complete(self) -> bool:
        return self._state == "complete"

    @property
    def authorization_id(self) -> str:
        if self._state != "complete" or self._authorization_id is None:
            raise RuntimeError("Authentication exchange has not completed")
        return self._authorization_id

    @property
    def credential_expiry_ms(self) -> int | None:
        return None  # a password credential has no expiry of its own (only delegation tokens do)

    def _generic(self, reason: str) -> SaslAuthenticationFailed:
        return SaslAuthenticationFailed.generic(self.mechanism, reason)

    def evaluate_response(self, response: bytes) -> bytes:
        try:
            if self._state == "client-first":
                challenge = self._client_first_message(response)
                self._state = "client-final"
                return challenge
            if self._state == "client-final":
                answer = self._client_final_message(response)
                self._state = "complete"
                return answer
            raise SaslAuthenticationFailed(f"Unexpected challenge in Sasl server state {self._state}")
        except SaslAuthenticationFailed:
            self._state = "failed"
            self._credential = None
            raise

    def _client_first_message(self, response: bytes) -> bytes:
        try:
            first = ClientFirstMessage.parse(response.decode("utf-8", "replace"))
        except ValueError as exc:
            raise self._generic(str(exc)) from None
        try:
            username = username_of(first.sasl_name)
        except ValueError as exc:
            raise self._generic(f"Authentication failed: Credentials could not be obtained ({exc})") from None
        if first.extensions.get(TOKEN_AUTH_EXTENSION, "").lower() == "true":
            raise self._generic(f"Token Authentication failed: Invalid tokenId : {username}")
        credential = self._credentials.lookup(username, self.mechanism)
        if credential is None:
            raise self._generic("Authentication failed: Invalid user credentials")
        if first.authorization_id and first.authorization_id != username:
            raise SaslAuthenticationFailed(
                "Authentication failed: Client requested an authorization id that is different from username"
            )
        if credential.iterations < self._scram.min_iterations:
            raise self._generic(
                f"Iterations {credential.iterations} is less than the minimum {self._scram.min_iterations} "
                f"for {self.mechanism}"
            )
        self._client_first = first
        self._credential = credential
        self._authorization_id = username
        self._nonce = first.nonce + self._server_nonce()
        self._server_first = server_first_message(self._nonce, credential.salt, credential.iterations)
        return self._server_first.encode()

    def _client_final_message(self, response: bytes) -> bytes:
        assert self._client_first is not None and self._credential is not None
        try:
            final = ClientFinalMessage.parse(response.decode("utf-8", "replace"))
        except (ValueError, binascii.Error) as exc:
            raise self._generic(str(exc)) from None
        if final.nonce != self._nonce:  # exactly the server-first nonce (Kafka 4.3, CVE-2024-56128), no prefix
            raise self._generic("Invalid client nonce in the final client message.")
        message = auth_message(self._client_first.bare(), self._server_first, final.without_proof())
        expected = self._credential.stored_key
        signature = hmac_digest(self._scram, expected, message)
        if len(final.proof) != len(signature):
            # Kafka's xor of arrays of different lengths throws here: the connection closes without an answer.
            raise SaslExchangeAborted(f"SCRAM client proof of {len(final.proof)} bytes, {len(signature)} expected")
        if not hmac.compare_digest(stored_key(self._scram, _xor(signature, final.proof)), expected):
            raise self._generic("Invalid client credentials")
        server_signature = hmac_digest(self._scram, self._credential.server_key, message)
        self._credential = None
        return b"v=" + base64.b64encode(server_signature)
