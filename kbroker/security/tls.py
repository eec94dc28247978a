"""The SSLContext of an SSL or SASL_SSL listener, from Kafka's ``ssl.*`` settings.

Kafka's DefaultSslEngineFactory rules, carried over to Python's ssl module (OpenSSL):

- Key store: ``ssl.keystore.type=PEM`` with ``ssl.keystore.certificate.chain`` + ``ssl.keystore.key`` inline (a
  PKCS#8 key, encrypted when ``ssl.key.password`` is set) or ``ssl.keystore.location`` naming a PEM file that holds
  both; ``PKCS12`` with ``ssl.keystore.location`` + ``ssl.keystore.password``. Java reads a PKCS12 file whatever the
  type says (Kafka's default type JKS included); a real JKS file cannot be read here and is refused with the
  keytool command that converts it. Kafka's consistency checks (a key without a chain, a password with PEM...) give
  its messages.
- Trust store (the CAs client certificates must chain to): ``ssl.truststore.certificates`` inline or
  ``ssl.truststore.location`` (PEM or PKCS12); without one, the system's CAs, as Java falls back to cacerts.
- ``ssl.client.auth``: none (no certificate asked), requested (asked, verified if sent), required.
- ``ssl.enabled.protocols`` TLSv1.2/TLSv1.3 (older versions are refused with the reason), ``ssl.protocol`` checked.
- ``ssl.cipher.suites`` in Java's (IANA) names, mapped to OpenSSL's. Python cannot pick among TLS 1.3 suites, so a
  list names all three TLS 1.3 suites or none (none turns TLS 1.3 off, as it does in Java, where no suite is left).

Every problem is a ConfigError with one line that names the key.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import secrets
import ssl
import tempfile
from collections.abc import Mapping
from enum import Enum

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes
from cryptography.hazmat.primitives.serialization import pkcs12

from kbroker.config_registry import ConfigError


class ClientAuth(Enum):
    NONE = "none"
    REQUESTED = "requested"
    REQUIRED = "required"


PEM = "PEM"
PKCS12 = "PKCS12"
JKS = "JKS"  # Kafka's default store type

DEFAULT_PROTOCOL = "TLSv1.3"
DEFAULT_ENABLED_PROTOCOLS = "TLSv1.2,TLSv1.3"

_PROTOCOLS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
_REFUSED_PROTOCOLS = {"SSLv2Hello", "SSLv2", "SSLv3", "SSL", "TLSv1", "TLSv1.1"}
_REFUSED_REASON = "TLS 1.1 and older are deprecated (RFC 8996) and Java and OpenSSL disable them; use TLSv1.2/TLSv1.3"

# The TLS 1.3 suites (same names in Java and OpenSSL), which OpenSSL enables all of.
_TLS13_SUITES = frozenset({"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"})
# The TLS 1.2 suites Java offers, by their IANA name (Java's), with OpenSSL's name (`openssl ciphers -stdname`).
_TLS12_SUITES = {
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA384": "ECDHE-ECDSA-AES256-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256": "ECDHE-ECDSA-AES128-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA384": "ECDHE-RSA-AES256-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256": "ECDHE-RSA-AES128-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_DHE_RSA_WITH_AES_256_GCM_SHA384": "DHE-RSA-AES256-GCM-SHA384",
    "TLS_DHE_RSA_WITH_AES_128_GCM_SHA256": "DHE-RSA-AES128-GCM-SHA256",
    "TLS_DHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "DHE-RSA-CHACHA20-POLY1305",
    "TLS_DHE_RSA_WITH_AES_256_CBC_SHA256": "DHE-RSA-AES256-SHA256",
    "TLS_DHE_RSA_WITH_AES_128_CBC_SHA256": "DHE-RSA-AES128-SHA256",
    "TLS_DHE_RSA_WITH_AES_256_CBC_SHA": "DHE-RSA-AES256-SHA",
    "TLS_DHE_RSA_WITH_AES_128_CBC_SHA": "DHE-RSA-AES128-SHA",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_CBC_SHA256": "AES256-SHA256",
    "TLS_RSA_WITH_AES_128_CBC_SHA256": "AES128-SHA256",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
}

_JKS_MAGIC = b"\xfe\xed\xfe\xed"
# A PEM block; Kafka's parser also tolerates text around blocks and whitespace inside the base64.
_PEM_BLOCK = re.compile(r"-----BEGIN ([A-Z0-9 ]+)-----(.*?)-----END \1-----", re.DOTALL)


def _value(settings: Mapping[str, str], key: str) -> str | None:
    """A setting's text, None when unset or empty (Kafka's null)."""
    value = settings.get(key)
    return value if value else None


def client_auth(settings: Mapping[str, str]) -> ClientAuth:
    """``ssl.client.auth`` (default none)."""
    text = (_value(settings, "ssl.client.auth") or "none").strip().lower()
    try:
        return ClientAuth(text)
    except ValueError:
        raise ConfigError(
            f"ssl.client.auth: invalid value {settings.get('ssl.client.auth')!r}: expected none, requested or required"
        ) from None


def client_auth_required(settings: Mapping[str, str]) -> bool:
    """Whether a client without a certificate is refused in the handshake."""
    return client_auth(settings) is ClientAuth.REQUIRED


def server_context(settings: Mapping[str, str]) -> ssl.SSLContext:
    """The server SSLContext for one listener's effective ssl.* settings; ConfigError naming the key if wrong."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.options |= ssl.OP_NO_RENEGOTIATION  # kbroker/server/tls.py reads without ever having to write
    _apply_protocols(context, settings)
    chain, key = _key_store(settings)
    _load_key_and_chain(context, chain, key)
    auth = client_auth(settings)
    if auth is not ClientAuth.NONE:
        context.verify_mode = ssl.CERT_REQUIRED if auth is ClientAuth.REQUIRED else ssl.CERT_OPTIONAL
        trusted = _trust_store(settings)
        if trusted is None:
            context.load_default_certs(ssl.Purpose.CLIENT_AUTH)  # Java's fallback: the JVM's cacerts
        else:
            context.load_verify_locations(
                cadata="".join(cert.public_bytes(serialization.Encoding.PEM).decode() for cert in trusted)
            )
    _apply_cipher_suites(context, settings)
    return context


def client_context(settings: Mapping[str, str]) -> ssl.SSLContext:
    """A client SSLContext from a Java client's ssl.* settings (the CLI's --command-config): the trust store (else
    the system's CAs), a key store if one is set (for ``ssl.client.auth``), and host name checking unless
    ``ssl.endpoint.identification.algorithm`` is empty, as in Kafka's clients."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    _apply_protocols(context, settings)
    trusted = _trust_store(settings)
    if trusted is None:
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    else:
        context.load_verify_locations(
            cadata="".join(cert.public_bytes(serialization.Encoding.PEM).decode() for cert in trusted)
        )
    if _value(settings, "ssl.keystore.location") or _value(settings, "ssl.keystore.key"):
        chain, key = _key_store(settings)
        _load_key_and_chain(context, chain, key)
    algorithm = settings.get("ssl.endpoint.identification.algorithm", "https").strip().lower()
    if algorithm not in ("", "https"):
        raise ConfigError(f"ssl.endpoint.identification.algorithm: {algorithm!r} is not https or empty")
    context.check_hostname = algorithm == "https"
    _apply_cipher_suites(context, settings)
    return context


# --- protocols and cipher suites -----------------------------------------------------------------------------


def _split_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _apply_protocols(context: ssl.SSLContext, settings: Mapping[str, str]) -> None:
    protocol = (_value(settings, "ssl.protocol") or DEFAULT_PROTOCOL).strip()
    if protocol in _REFUSED_PROTOCOLS:
        raise ConfigError(f"ssl.protocol: {protocol} is refused: {_REFUSED_REASON}")
    if protocol not in _PROTOCOLS and protocol != "TLS":
        raise ConfigError(f"ssl.protocol: unknown protocol {protocol!r}: expected TLSv1.3, TLSv1.2 or TLS")
    enabled = _split_list(_value(settings, "ssl.enabled.protocols") or DEFAULT_ENABLED_PROTOCOLS)
    versions = []
    for name in enabled:
        if name in _REFUSED_PROTOCOLS:
            raise ConfigError(f"ssl.enabled.protocols: {name} is refused: {_REFUSED_REASON}")
        if name not in _PROTOCOLS:
            raise ConfigError(f"ssl.enabled.protocols: unknown protocol {name!r}: expected TLSv1.2 and/or TLSv1.3")
        versions.append(_PROTOCOLS[name])
    context.minimum_version = min(versions)
    context.maximum_version = max(versions)


def openssl_cipher_names(suites: list[str]) -> tuple[list[str], bool]:
    """OpenSSL's names for Java's TLS 1.2 suite names, and whether the list keeps TLS 1.3 (ConfigError if not
    expressible)."""
    tls12: list[str] = []
    tls13: set[str] = set()
    for suite in suites:
        if suite in _TLS13_SUITES:
            tls13.add(suite)
        elif suite in _TLS12_SUITES:
            tls12.append(_TLS12_SUITES[suite])
        else:
            raise ConfigError(
                f"ssl.cipher.suites: unsupported cipher suite {suite!r} (Java's IANA names, e.g. "
                "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 or TLS_AES_128_GCM_SHA256)"
            )
    if tls13 and tls13 != _TLS13_SUITES:
        raise ConfigError(
            "ssl.cipher.suites: Python's ssl module cannot choose among TLS 1.3 suites: list all of "
            f"{', '.join(sorted(_TLS13_SUITES))} or none of them (none turns TLS 1.3 off)"
        )
    return tls12, bool(tls13)


def _apply_cipher_suites(context: ssl.SSLContext, settings: Mapping[str, str]) -> None:
    suites = _split_list(_value(settings, "ssl.cipher.suites") or "")
    if not suites:
        return
    tls12, keeps_tls13 = openssl_cipher_names(suites)
    # A protocol none of whose suites is listed cannot be negotiated, as in Java.
    if not keeps_tls13:
        if context.minimum_version is ssl.TLSVersion.TLSv1_3:
            raise ConfigError("ssl.cipher.suites: no TLS 1.3 suite listed, but ssl.enabled.protocols is TLSv1.3 only")
        context.maximum_version = ssl.TLSVersion.TLSv1_2
    if not tls12:
        if context.maximum_version is ssl.TLSVersion.TLSv1_2:
            raise ConfigError("ssl.cipher.suites: only TLS 1.3 suites are listed, but ssl.enabled.protocols is TLSv1.2")
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        return
    try:
        context.set_ciphers(":".join(tls12))
    except ssl.SSLError:
        raise ConfigError(f"ssl.cipher.suites: none of {', '.join(suites)} is available in this OpenSSL") from None


# --- key and trust stores ------------------------------------------------------------------------------------


def _read_file(key: str, path: str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {path}: {exc.strerror or exc}") from None


def _store_type(settings: Mapping[str, str], key: str) -> str:
    return (_value(settings, key) or JKS).strip().upper()


def _check_not_jks(data: bytes, type_key: str, location_key: str, path: str) -> None:
    if data.startswith(_JKS_MAGIC):
        raise ConfigError(
            f"{location_key}: {path} is a JKS key store, which kbroker cannot read: use PEM or PKCS12 ({type_key}), "
            f"e.g. keytool -importkeystore -srckeystore {path} -destkeystore {path}.p12 -deststoretype PKCS12"
        )


def _key_store(settings: Mapping[str, str]) -> tuple[list[x509.Certificate], PrivateKeyTypes]:
    store_type = _store_type(settings, "ssl.keystore.type")
    location = _value(settings, "ssl.keystore.location")
    password = _value(settings, "ssl.keystore.password")
    key_password = _value(settings, "ssl.key.password")
    inline_key = _value(settings, "ssl.keystore.key")
    inline_chain = _value(settings, "ssl.keystore.certificate.chain")
    # Kafka's checks, in its order and with its messages (DefaultSslEngineFactory.createKeystore).
    if inline_key is not None:
        if store_type != PEM:
            raise ConfigError(
                f"ssl.keystore.key: SSL private key can be specified only for PEM, but key store type is {store_type}."
            )
        if inline_chain is None:
            raise ConfigError(
                "ssl.keystore.certificate.chain: SSL private key is specified, but certificate chain is not specified."
            )
        if location is not None:
            raise ConfigError(
                "ssl.keystore.location: Both SSL key store location and separate private key are specified."
            )
        if password is not None:
            raise ConfigError(
                "ssl.keystore.password: SSL key store password cannot be specified with PEM format, "
                "only key password may be specified."
            )
        chain = _pem_certificates(inline_chain, "ssl.keystore.certificate.chain")
        return chain, _pem_private_key(inline_key, key_password, "ssl.keystore.key")
    if inline_chain is not None:
        raise ConfigError("ssl.keystore.key: SSL certificate chain is specified, but private key is not specified")
    if location is None:
        if password is not None:
            raise ConfigError(
                "ssl.keystore.location: SSL key store is not specified, but key store password is specified."
            )
        raise ConfigError(
            "ssl.keystore.location: an SSL listener needs a key store: set ssl.keystore.location, or "
            "ssl.keystore.type=PEM with ssl.keystore.certificate.chain and ssl.keystore.key"
        )
    if store_type == PEM:
        if password is not None:
            raise ConfigError(
                "ssl.keystore.password: SSL key store password cannot be specified with PEM format, "
                "only key password may be specified"
            )
        text = _read_file("ssl.keystore.location", location).decode("utf-8", errors="replace")
        chain = _pem_certificates(text, "ssl.keystore.location")
        return chain, _pem_private_key(text, key_password, "ssl.keystore.location")
    if password is None:
        raise ConfigError("ssl.keystore.password: SSL key store is specified, but key store password is not specified.")
    _check_store_type(store_type, "ssl.keystore.type")
    data = _read_file("ssl.keystore.location", location)
    _check_not_jks(data, "ssl.keystore.type", "ssl.keystore.location", location)
    try:
        key, certificate, extra = pkcs12.load_key_and_certificates(data, password.encode())
    except ValueError:
        raise ConfigError(
            f"ssl.keystore.password: cannot open the PKCS12 key store {location}: wrong password or not PKCS12"
        ) from None
    if key is None or certificate is None:
        raise ConfigError(f"ssl.keystore.location: {location} holds no private key with its certificate")
    return [certificate, *extra], key


def _check_store_type(store_type: str, key: str) -> None:
    if store_type not in (PKCS12, JKS, PEM):
        raise ConfigError(f"{key}: unsupported store type {store_type}: use PEM or PKCS12")


def _trust_store(settings: Mapping[str, str]) -> list[x509.Certificate] | None:
    store_type = _store_type(settings, "ssl.truststore.type")
    location = _value(settings, "ssl.truststore.location")
    password = _value(settings, "ssl.truststore.password")
    inline = _value(settings, "ssl.truststore.certificates")
    if inline is not None:
        if store_type != PEM:
            raise ConfigError(
                "ssl.truststore.certificates: SSL trust store certs can be specified only for PEM, "
                f"but trust store type is {store_type}."
            )
        if location is not None:
            raise ConfigError(
                "ssl.truststore.location: Both SSL trust store location and separate trust certificates are specified."
            )
        if password is not None:
            raise ConfigError("ssl.truststore.password: SSL trust store password cannot be specified for PEM format.")
        return _pem_certificates(inline, "ssl.truststore.certificates")
    if location is None:
        if password is not None:
            raise ConfigError(
                "ssl.truststore.location: SSL trust store is not specified, but trust store password is specified."
            )
        return None
    if store_type == PEM:
        if password is not None:
            raise ConfigError("ssl.truststore.password: SSL trust store password cannot be specified for PEM format.")
        text = _read_file("ssl.truststore.location", location).decode("utf-8", errors="replace")
        return _pem_certificates(text, "ssl.truststore.location")
    _check_store_type(store_type, "ssl.truststore.type")
    data = _read_file("ssl.truststore.location", location)
    _check_not_jks(data, "ssl.truststore.type", "ssl.truststore.location", location)
    try:
        store = pkcs12.load_pkcs12(data, password.encode() if password is not None else None)
    except ValueError:
        raise ConfigError(
            f"ssl.truststore.password: cannot open the PKCS12 trust store {location}: "
            + ("wrong password or not PKCS12" if password is not None else "it needs ssl.truststore.password")
        ) from None
    certificates = [entry.certificate for entry in store.additional_certs]
    if store.cert is not None:
        certificates.insert(0, store.cert.certificate)
    if not certificates:
        raise ConfigError(f"ssl.truststore.location: {location} holds no certificates")
    return certificates


def _pem_blocks(text: str) -> list[tuple[str, bytes]]:
    """(label, DER) of each PEM block; text around the blocks is ignored, as Kafka's parser ignores it."""
    blocks = []
    for match in _PEM_BLOCK.finditer(text):
        try:
            der = base64.b64decode(re.sub(r"\s", "", match.group(2)), validate=True)
        except binascii.Error:
            der = b""  # reported by the certificate or key loader as unreadable
        blocks.append((match.group(1), der))
    return blocks


def _pem_certificates(text: str, key: str) -> list[x509.Certificate]:
    certificates = []
    for label, der in _pem_blocks(text):
        if label == "CERTIFICATE":
            try:
                certificates.append(x509.load_der_x509_certificate(der))
            except ValueError:
                raise ConfigError(f"{key}: a CERTIFICATE block is not a valid X.509 certificate") from None
    if not certificates:
        raise ConfigError(f"{key}: At least one certificate expected, but none found")
    return certificates


def _pem_private_key(text: str, password: str | None, key: str) -> PrivateKeyTypes:
    keys = [(label, der) for label, der in _pem_blocks(text) if label.endswith("PRIVATE KEY")]
    if not keys:
        raise ConfigError(f"{key}: Private key not provided")
    if len(keys) != 1:
        raise ConfigError(f"{key}: Expected one private key, but found {len(keys)}")
    label, der = keys[0]
    if label not in ("PRIVATE KEY", "ENCRYPTED PRIVATE KEY"):
        raise ConfigError(
            f"{key}: a {label} is not PKCS#8, which Kafka requires: convert it with "
            "openssl pkcs8 -topk8 -in key.pem -out key.pkcs8.pem (add -nocrypt for no password)"
        )
    encrypted = label == "ENCRYPTED PRIVATE KEY"
    if encrypted and password is None:
        raise ConfigError(f"ssl.key.password: the private key in {key} is encrypted, but ssl.key.password is not set")
    if not encrypted and password is not None:
        raise ConfigError(f"ssl.key.password: is set, but the private key in {key} is not encrypted")
    try:
        return serialization.load_der_private_key(der, password.encode() if password is not None else None)
    except (ValueError, TypeError):
        if encrypted:
            raise ConfigError(f"ssl.key.password: cannot decrypt the private key in {key}: wrong password") from None
        raise ConfigError(f"{key}: Private key could not be loaded") from None
    except Exception as exc:  # e.g. UnsupportedAlgorithm for an unknown key type
        raise ConfigError(f"{key}: Private key could not be loaded: {exc}") from None


def _load_key_and_chain(context: ssl.SSLContext, chain: list[x509.Certificate], key: PrivateKeyTypes) -> None:
    """Python's ssl reads keys from files only: write key (encrypted under a one-time password) and chain to a
    private temporary file, load it, remove it."""
    one_time_password = secrets.token_bytes(32)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(one_time_password),
    ) + b"".join(cert.public_bytes(serialization.Encoding.PEM) for cert in chain)
    descriptor, path = tempfile.mkstemp(prefix="kbroker-key-", suffix=".pem")  # mode 0600
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(pem)
        context.load_cert_chain(path, password=one_time_password)
    except ssl.SSLError as exc:
        raise ConfigError(f"ssl.keystore.key: the private key does not match the certificate ({exc.reason})") from None
    finally:
        os.unlink(path)
