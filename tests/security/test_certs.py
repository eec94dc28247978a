"""`kbroker certs`: the files it writes load into server_context and verify a client; what it prints is usable."""

from __future__ import annotations

import ipaddress
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509

from kbroker.cli import main
from kbroker.security.principal import principal_of_certificate
from kbroker.security.tls import server_context


def run_certs(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["certs", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def memory_handshake(server: ssl.SSLContext, client: ssl.SSLContext, hostname: str) -> ssl.SSLObject:
    """Handshake plus one record each way over memory BIOs; the server's SSLObject."""
    server_in, server_out, client_in, client_out = (ssl.MemoryBIO() for _ in range(4))
    server_side = server.wrap_bio(server_in, server_out, server_side=True)
    client_side = client.wrap_bio(client_in, client_out, server_hostname=hostname)
    for _ in range(10):
        for side in (client_side, server_side):
            try:
                side.do_handshake()
            except ssl.SSLWantReadError:
                pass
            server_in.write(client_out.read())
            client_in.write(server_out.read())
    client_side.write(b"hello")
    server_in.write(client_out.read())
    assert server_side.read() == b"hello"
    return server_side


def test_certs_output_serves_and_verifies_a_client(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    directory = tmp_path / "certs"
    code, out, err = run_certs(capsys, "--dir", str(directory), "--client", "alice")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    server_block = lines[lines.index("listeners=SSL://localhost:9093") : lines.index("ssl.client.auth=required") + 1]
    assert server_block == [
        "listeners=SSL://localhost:9093",
        "advertised.listeners=SSL://localhost:9093",
        "ssl.keystore.type=PEM",
        f"ssl.keystore.location={directory / 'broker.pem'}",
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={directory / 'ca.pem'}",
        "ssl.client.auth=required",
    ]
    assert f"ssl.ca.location={directory / 'ca.pem'}" in lines
    assert f"ssl.certificate.location={directory / 'client-alice.crt'}" in lines
    assert f"ssl.keystore.location={directory / 'client-alice.pem'}" in lines
    for private in ("ca-key.pem", "broker.pem", "client-alice.pem", "client-alice.key"):
        assert stat.S_IMODE((directory / private).stat().st_mode) == 0o600

    settings = dict(line.split("=", 1) for line in server_block if line.startswith("ssl."))
    context = server_context(settings)
    client = ssl.create_default_context(cafile=str(directory / "ca.pem"))  # verifies the host name too
    client.load_cert_chain(str(directory / "client-alice.crt"), str(directory / "client-alice.key"))
    for hostname in ("localhost", "127.0.0.1"):
        server = memory_handshake(context, client, hostname)
        assert principal_of_certificate(server.getpeercert(binary_form=True), "DEFAULT") == "User:CN=alice"


def test_certs_hosts_become_subject_alternative_names(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run_certs(capsys, "--dir", str(tmp_path), "--host", "kafka.test", "--host", "10.0.0.7")
    assert code == 0
    assert "listeners=SSL://kafka.test:9093" in out.splitlines()
    assert "ssl.client.auth=none" in out.splitlines()  # no client certificates: no mutual TLS
    broker = x509.load_pem_x509_certificates((tmp_path / "broker.pem").read_bytes())[0]
    names = broker.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["kafka.test"]
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.7")]
    assert broker.subject.rfc4514_string() == "CN=kafka.test,O=kbroker"
    assert not list(tmp_path.glob("client-*"))


def test_certs_unwritable_directory_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    code, out, err = run_certs(capsys, "--dir", str(blocker / "certs"))
    assert (code, out) == (1, "")
    assert err == f"kbroker: cannot write to {blocker / 'certs'}: Not a directory\n"


def test_certs_client_name_must_be_a_file_name(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run_certs(capsys, "--dir", str(tmp_path), "--client", "../evil")
    assert code == 1
    assert err == "kbroker: --client '../evil': a client name is used in file names: no '/', no leading '.'\n"
