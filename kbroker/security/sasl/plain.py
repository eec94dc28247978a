"""PLAIN (RFC 4616) as Kafka's PlainSaslServer with its PlainServerCallbackHandler.

One message, ``[authzid] NUL authcid NUL passwd``, checked against the ``user_<name>="<password>"`` options of the
listener's PLAIN JAAS config. Every failure is told to the client as it is (Kafka's SaslAuthenticationException),
with Kafka's texts: a message without exactly three parts, an empty user or password, a wrong user or password
(one text for both), an authorization id other than the user.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from kbroker.security.sasl import SaslAuthenticationFailed


class PlainSaslServer:
    mechanism = "PLAIN"

    def __init__(self, users: Mapping[str, str]) -> None:
        self._users = users
        self._authorization_id: str | None = None

    @property
    def is_complete(self) -> bool:
        return self._authorization_id is not None

    @property
    def authorization_id(self) -> str:
        if self._authorization_id is None:
            raise RuntimeError("Authentication exchange has not completed")
        return self._authorization_id

    @property
    def credential_expiry_ms(self) -> int | None:
        return None

    def evaluate_response(self, response: bytes) -> bytes:
        tokens = _tokens(response.decode("utf-8", "replace"))
        if len(tokens) != 3:
            raise SaslAuthenticationFailed(f"Invalid SASL/PLAIN response: expected 3 tokens, got {len(tokens)}")
        authorization_id, username, password = tokens
        if not username:
            raise SaslAuthenticationFailed("Authentication failed: username not specified")
        if not password:
            raise SaslAuthenticationFailed("Authentication failed: password not specified")
        expected = self._users.get(username)
        # Compared in constant time, as Kafka does, so the time taken tells nothing of the password: digests of
        # equal length (compare_digest may return early on a length difference, which would tell the password's
        # length), and an unknown user compared as a known one.
        matches = hmac.compare_digest(_digest(password), _digest("" if expected is None else expected))
        if expected is None or not matches:
            raise SaslAuthenticationFailed("Authentication failed: Invalid username or password")
        if authorization_id and authorization_id != username:
            raise SaslAuthenticationFailed(
                "Authentication failed: Client requested an authorization id that is different from username"
            )
        self._authorization_id = username
        return b""


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


def _tokens(message: str) -> list[str]:
    """Up to four NUL-separated parts, as Kafka counts them (a fourth part makes the message invalid)."""
    tokens: list[str] = []
    start = 0
    for _ in range(4):
        end = message.find("\0", start)
        if end == -1:
            tokens.append(message[start:])
            break
        tokens.append(message[start:end])
        start = end + 1
    return tokens
