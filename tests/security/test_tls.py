"""server_context: SSLContexts from Kafka's ssl.* settings, proven by real handshakes with Python's ssl client over
in-memory BIOs (every key store form, ssl.client.auth, protocol and cipher restrictions), and Kafka's messages for
inconsistent settings."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12

from kbroker.config_registry import ConfigError
from kbroker.security import certs
from kbroker.security.principal import principal_of_certificate
from kbroker.security.tls import client_auth_required, server_context


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> certs.GeneratedCerts:
    return certs.generate(tmp_path_factory.mktemp("pki"), clients=["alice"])


@pytest.fixture(scope="module")
def stranger(tmp_path_factory: pytest.TempPathFactory) -> certs.GeneratedCerts:
    """A client certificate from another CA."""
    return certs.generate(tmp_path_factory.mktemp("other"), clients=["mallory"])


def pem_parts(pki: certs.GeneratedCerts) -> tuple[str, str]:
    """(key, chain) of the broker's PEM file."""
    text = pki.broker.read_text()
    split = text.index("-----BEGIN CERTIFICATE-----")
    return text[:split], text[split:]


def file_settings(pki: certs.GeneratedCerts, **extra: str) -> dict[str, str]:
    settings = {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(pki.broker),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(pki.ca),
    }
    settings.update({key.replace("_", "."): value for key, value in extra.items()})
    return settings


def client_context(
    pki: certs.GeneratedCerts, as_client: str | None = None, *, owner: certs.GeneratedCerts | None = None
) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca))
    if as_client is not None:
        _, crt, key = (owner or pki).clients[as_client]
        context.load_cert_chain(str(crt), str(key))
    return context


class Handshake:
    def __init__(self, server: ssl.SSLObject, client: ssl.SSLObject) -> None:
        self.server, self.client = server, client


def handshake(server_context: ssl.SSLContext, client_context: ssl.SSLContext) -> Handshake:
    """A complete TLS handshake plus one round trip of application data, in memory; the first SSLError of either
    side is raised (in TLS 1.3 a rejected client certificate fails the server's handshake)."""
    server_in, server_out, client_in, client_out = (ssl.MemoryBIO() for _ in range(4))
    server = server_context.wrap_bio(server_in, server_out, server_side=True)
    client = client_context.wrap_bio(client_in, client_out, server_hostname="localhost")
    done = {"server": False, "client": False}
    for _ in range(20):
        for name, side in (("client", client), ("server", server)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
            server_in.write(client_out.read())
            client_in.write(server_out.read())
        if all(done.values()):
            break
    assert all(done.values()), "the handshake did not finish"
    client.write(b"ping")
    server_in.write(client_out.read())
    assert server.read() == b"ping"
    server.write(b"pong")
    client_in.write(server_out.read())
    assert client.read() == b"pong"
    return Handshake(server, client)


def test_pem_key_store_file(pki: certs.GeneratedCerts) -> None:
    result = handshake(server_context(file_settings(pki)), client_context(pki))
    assert result.client.version() == "TLSv1.3"
    assert result.server.getpeercert(binary_form=True) is None  # ssl.client.auth=none asks for no certificate


def test_pem_key_store_inline(pki: certs.GeneratedCerts) -> None:
    key, chain = pem_parts(pki)
    settings = {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.key": key,
        "ssl.keystore.certificate.chain": chain,
        "ssl.truststore.type": "PEM",
        "ssl.truststore.certificates": pki.ca.read_text(),
        "ssl.client.auth": "required",
    }
    result = handshake(server_context(settings), client_context(pki, "alice"))
    assert principal_of_certificate(result.server.getpeercert(binary_form=True), "DEFAULT") == "User:CN=alice"


def encrypted_key(pki: certs.GeneratedCerts, password: bytes) -> str:
    key = serialization.load_pem_private_key(pem_parts(pki)[0].encode(), None)
    encryption = serialization.BestAvailableEncryption(password)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption).decode()


def test_encrypted_pem_key(pki: certs.GeneratedCerts) -> None:
    key, chain = encrypted_key(pki, b"s3cret"), pem_parts(pki)[1]
    assert "ENCRYPTED PRIVATE KEY" in key
    settings = {"ssl.keystore.type": "PEM", "ssl.keystore.key": key, "ssl.keystore.certificate.chain": chain}
    handshake(server_context({**settings, "ssl.key.password": "s3cret"}), client_context(pki))
    with pytest.raises(ConfigError) as wrong:
        server_context({**settings, "ssl.key.password": "wrong"})
    assert str(wrong.value) == "ssl.key.password: cannot decrypt the private key in ssl.keystore.key: wrong password"
    with pytest.raises(ConfigError) as missing:
        server_context(settings)
    assert str(missing.value) == (
        "ssl.key.password: the private key in ssl.keystore.key is encrypted, but ssl.key.password is not set"
    )


def test_encrypted_pem_key_file(pki: certs.GeneratedCerts, tmp_path: Path) -> None:
    path = tmp_path / "broker.pem"
    path.write_text(encrypted_key(pki, b"pw") + pem_parts(pki)[1])
    settings = {"ssl.keystore.type": "PEM", "ssl.keystore.location": str(path), "ssl.key.password": "pw"}
    handshake(server_context(settings), client_context(pki))
    with pytest.raises(ConfigError, match="^ssl.key.password: cannot decrypt the private key in ssl.keystore.location"):
        server_context({**settings, "ssl.key.password": "nope"})


def write_pkcs12(pki: certs.GeneratedCerts, path: Path, password: bytes) -> None:
    key = serialization.load_pem_private_key(pem_parts(pki)[0].encode(), None)
    chain = x509.load_pem_x509_certificates(pem_parts(pki)[1].encode())
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    encryption = serialization.BestAvailableEncryption(password)
    data = pkcs12.serialize_key_and_certificates(b"kafka", key, chain[0], chain[1:], encryption)
    path.write_bytes(data)


@pytest.mark.parametrize("store_type", ["PKCS12", "JKS", None])
def test_pkcs12_key_store(pki: certs.GeneratedCerts, tmp_path: Path, store_type: str | None) -> None:
    """Java reads a PKCS12 file whatever ssl.keystore.type says, its default JKS included."""
    path = tmp_path / "broker.p12"
    write_pkcs12(pki, path, b"storepw")
    settings = {"ssl.keystore.location": str(path), "ssl.keystore.password": "storepw"}
    if store_type is not None:
        settings["ssl.keystore.type"] = store_type
    handshake(server_context(settings), client_context(pki))
    with pytest.raises(ConfigError) as wrong:
        server_context({**settings, "ssl.keystore.password": "bad"})
    assert str(wrong.value) == (
        f"ssl.keystore.password: cannot open the PKCS12 key store {path}: wrong password or not PKCS12"
    )


def test_pkcs12_trust_store(pki: certs.GeneratedCerts, tmp_path: Path) -> None:
    ca = x509.load_pem_x509_certificate(pki.ca.read_bytes())
    path = tmp_path / "trust.p12"
    path.write_bytes(
        pkcs12.serialize_key_and_certificates(None, None, None, [ca], serialization.BestAvailableEncryption(b"tpw"))
    )
    settings = {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(pki.broker),
        "ssl.truststore.type": "PKCS12",
        "ssl.truststore.location": str(path),
        "ssl.truststore.password": "tpw",
        "ssl.client.auth": "required",
    }
    handshake(server_context(settings), client_context(pki, "alice"))
    with pytest.raises(ConfigError, match="^ssl.truststore.password: cannot open the PKCS12 trust store"):
        server_context({**settings, "ssl.truststore.password": "bad"})


def test_jks_is_refused_with_the_conversion(tmp_path: Path) -> None:
    path = tmp_path / "broker.jks"
    path.write_bytes(b"\xfe\xed\xfe\xed" + bytes(60))
    with pytest.raises(ConfigError) as raised:
        server_context({"ssl.keystore.location": str(path), "ssl.keystore.password": "pw"})
    assert str(raised.value) == (
        f"ssl.keystore.location: {path} is a JKS key store, which kbroker cannot read: use PEM or PKCS12 "
        f"(ssl.keystore.type), e.g. keytool -importkeystore -srckeystore {path} -destkeystore {path}.p12 "
        "-deststoretype PKCS12"
    )


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {},
            "ssl.keystore.location: an SSL listener needs a key store: set ssl.keystore.location, or "
            "ssl.keystore.type=PEM with ssl.keystore.certificate.chain and ssl.keystore.key",
        ),
        (
            {"ssl.keystore.key": "x"},
            "ssl.keystore.key: SSL private key can be specified only for PEM, but key store type is JKS.",
        ),
        (
            {"ssl.keystore.type": "PEM", "ssl.keystore.key": "x"},
            "ssl.keystore.certificate.chain: SSL private key is specified, but certificate chain is not specified.",
        ),
        (
            {"ssl.keystore.type": "PEM", "ssl.keystore.certificate.chain": "x"},
            "ssl.keystore.key: SSL certificate chain is specified, but private key is not specified",
        ),
        (
            {"ssl.keystore.type": "PEM", "ssl.keystore.location": "/x", "ssl.keystore.password": "p"},
            "ssl.keystore.password: SSL key store password cannot be specified with PEM format, only key password may "
            "be specified",
        ),
        (
            {"ssl.keystore.location": "/x"},
            "ssl.keystore.password: SSL key store is specified, but key store password is not specified.",
        ),
        (
            {"ssl.keystore.password": "p"},
            "ssl.keystore.location: SSL key store is not specified, but key store password is specified.",
        ),
        (
            {"ssl.keystore.location": "/no/such/file", "ssl.keystore.password": "p"},
            "ssl.keystore.location: cannot read /no/such/file: No such file or directory",
        ),
        (
            {"ssl.keystore.location": "/x", "ssl.keystore.password": "p", "ssl.keystore.type": "BCFKS"},
            "ssl.keystore.type: unsupported store type BCFKS: use PEM or PKCS12",
        ),
        (
            {"ssl.keystore.type": "PEM", "ssl.keystore.key": "no pem here", "ssl.keystore.certificate.chain": "x"},
            "ssl.keystore.certificate.chain: At least one certificate expected, but none found",
        ),
    ],
)
def test_kafka_key_store_checks(settings: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        server_context(settings)
    assert str(raised.value) == message


def test_pkcs1_key_is_refused_as_kafka_refuses_it(pki: certs.GeneratedCerts) -> None:
    key = serialization.load_pem_private_key(pem_parts(pki)[0].encode(), None)
    traditional = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    ).decode()
    settings = {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.key": traditional,
        "ssl.keystore.certificate.chain": pem_parts(pki)[1],
    }
    with pytest.raises(ConfigError, match=r"^ssl.keystore.key: a EC PRIVATE KEY is not PKCS#8, which Kafka requires"):
        server_context(settings)


def test_key_not_matching_certificate(pki: certs.GeneratedCerts, stranger: certs.GeneratedCerts) -> None:
    settings = {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.key": pem_parts(stranger)[0],
        "ssl.keystore.certificate.chain": pem_parts(pki)[1],
    }
    with pytest.raises(ConfigError, match="^ssl.keystore.key: the private key does not match the certificate"):
        server_context(settings)


# --- ssl.client.auth ------------------------------------------------------------------------------------------


def test_client_auth_none_ignores_client_certificates(pki: certs.GeneratedCerts) -> None:
    result = handshake(server_context(file_settings(pki)), client_context(pki, "alice"))
    assert result.server.getpeercert(binary_form=True) is None
    assert not client_auth_required(file_settings(pki))


def test_client_auth_requested(pki: certs.GeneratedCerts, stranger: certs.GeneratedCerts) -> None:
    context = server_context(file_settings(pki, ssl_client_auth="requested"))
    assert handshake(context, client_context(pki)).server.getpeercert(binary_form=True) is None
    with_cert = handshake(context, client_context(pki, "alice"))
    assert principal_of_certificate(with_cert.server.getpeercert(binary_form=True), "DEFAULT") == "User:CN=alice"
    with pytest.raises(ssl.SSLError, match="CERTIFICATE_VERIFY_FAILED"):  # a certificate sent is verified
        handshake(context, client_context(pki, "mallory", owner=stranger))


def test_client_auth_required(pki: certs.GeneratedCerts, stranger: certs.GeneratedCerts) -> None:
    settings = file_settings(pki, ssl_client_auth="required")
    assert client_auth_required(settings)
    context = server_context(settings)
    with pytest.raises(ssl.SSLError, match="PEER_DID_NOT_RETURN_A_CERTIFICATE"):
        handshake(context, client_context(pki))
    with pytest.raises(ssl.SSLError, match="CERTIFICATE_VERIFY_FAILED"):
        handshake(context, client_context(pki, "mallory", owner=stranger))
    result = handshake(context, client_context(pki, "alice"))
    assert principal_of_certificate(result.server.getpeercert(binary_form=True), "RULE:^CN=(.*)$/$1/U") == "User:ALICE"


def test_bad_client_auth_value(pki: certs.GeneratedCerts) -> None:
    with pytest.raises(ConfigError) as raised:
        server_context(file_settings(pki, ssl_client_auth="always"))
    assert str(raised.value) == "ssl.client.auth: invalid value 'always': expected none, requested or required"


# --- protocols and cipher suites ---------------------------------------------------------------------------


def tls12_only_client(pki: certs.GeneratedCerts) -> ssl.SSLContext:
    context = client_context(pki)
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    return context


def tls13_only_client(pki: certs.GeneratedCerts) -> ssl.SSLContext:
    context = client_context(pki)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    return context


def test_enabled_protocols(pki: certs.GeneratedCerts) -> None:
    default = server_context(file_settings(pki))
    assert handshake(default, tls12_only_client(pki)).client.version() == "TLSv1.2"
    tls12 = server_context(file_settings(pki, ssl_enabled_protocols="TLSv1.2"))
    assert handshake(tls12, client_context(pki)).client.version() == "TLSv1.2"
    with pytest.raises(ssl.SSLError, match="UNSUPPORTED_PROTOCOL|NO_PROTOCOLS_AVAILABLE|VERSION"):
        handshake(tls12, tls13_only_client(pki))
    tls13 = server_context(file_settings(pki, ssl_enabled_protocols=" TLSv1.3 "))
    with pytest.raises(ssl.SSLError, match="UNSUPPORTED_PROTOCOL|NO_PROTOCOLS_AVAILABLE|VERSION"):
        handshake(tls13, tls12_only_client(pki))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"ssl_enabled_protocols": "TLSv1.1,TLSv1.2"},
            "ssl.enabled.protocols: TLSv1.1 is refused: TLS 1.1 and older are deprecated (RFC 8996) and Java and "
            "OpenSSL disable them; use TLSv1.2/TLSv1.3",
        ),
        (
            {"ssl_enabled_protocols": "TLSv2"},
            "ssl.enabled.protocols: unknown protocol 'TLSv2': expected TLSv1.2 and/or TLSv1.3",
        ),
        (
            {"ssl_protocol": "SSLv3"},
            "ssl.protocol: SSLv3 is refused: TLS 1.1 and older are deprecated (RFC 8996) and Java and OpenSSL disable "
            "them; use TLSv1.2/TLSv1.3",
        ),
        ({"ssl_protocol": "QUIC"}, "ssl.protocol: unknown protocol 'QUIC': expected TLSv1.3, TLSv1.2 or TLS"),
        (
            {"ssl_cipher_suites": "TLS_NOPE_WITH_NOTHING"},
            "ssl.cipher.suites: unsupported cipher suite 'TLS_NOPE_WITH_NOTHING' (Java's IANA names, e.g. "
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 or TLS_AES_128_GCM_SHA256)",
        ),
        (
            {"ssl_cipher_suites": "TLS_AES_128_GCM_SHA256"},
            "ssl.cipher.suites: Python's ssl module cannot choose among TLS 1.3 suites: list all of "
            "TLS_AES_128_GCM_SHA256, TLS_AES_256_GCM_SHA384, TLS_CHACHA20_POLY1305_SHA256 or none of them "
            "(none turns TLS 1.3 off)",
        ),
        (
            {"ssl_cipher_suites": "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", "ssl_enabled_protocols": "TLSv1.3"},
            "ssl.cipher.suites: no TLS 1.3 suite listed, but ssl.enabled.protocols is TLSv1.3 only",
        ),
    ],
)
def test_protocol_and_cipher_errors(pki: certs.GeneratedCerts, extra: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        server_context(file_settings(pki, **extra))
    assert str(raised.value) == message


def test_tls12_cipher_suites_in_java_names(pki: certs.GeneratedCerts) -> None:
    suites = "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"
    context = server_context(file_settings(pki, ssl_cipher_suites=suites))
    result = handshake(context, client_context(pki))
    # no TLS 1.3 suite listed: TLS 1.3 is off, as in Java; the one ECDSA suite listed is the one negotiated
    assert result.client.version() == "TLSv1.2"
    assert result.client.cipher()[0] == "ECDHE-ECDSA-AES256-GCM-SHA384"
    other = client_context(pki)
    other.set_ciphers("ECDHE-ECDSA-AES128-GCM-SHA256")
    other.maximum_version = ssl.TLSVersion.TLSv1_2
    with pytest.raises(ssl.SSLError, match="NO_SHARED_CIPHER|HANDSHAKE_FAILURE"):
        handshake(context, other)


def test_tls13_suites_only(pki: certs.GeneratedCerts) -> None:
    suites = "TLS_AES_128_GCM_SHA256,TLS_AES_256_GCM_SHA384,TLS_CHACHA20_POLY1305_SHA256"
    context = server_context(file_settings(pki, ssl_cipher_suites=suites))
    assert handshake(context, client_context(pki)).client.version() == "TLSv1.3"
    with pytest.raises(ssl.SSLError, match="UNSUPPORTED_PROTOCOL|NO_PROTOCOLS_AVAILABLE|VERSION"):
        handshake(context, tls12_only_client(pki))
