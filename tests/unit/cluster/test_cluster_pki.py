"""Key material: a CA, a serving certificate it signed for 127.0.0.1, and a service-account key pair."""

from __future__ import annotations

import shutil
import ssl
import stat
import subprocess
from pathlib import Path

import pytest

from scale.cluster.pki import generate_pki, new_token

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


def test_serving_certificate_verifies_against_ca(tmp_path: Path) -> None:
    pki = generate_pki(tmp_path / "pki")
    verify = subprocess.run(
        ["openssl", "verify", "-CAfile", str(pki.ca_cert), str(pki.serving_cert)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert verify.returncode == 0, verify.stderr
    text = subprocess.run(
        [
            "openssl",
            "x509",
            "-in",
            str(pki.serving_cert),
            "-noout",
            "-ext",
            "subjectAltName,extendedKeyUsage",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "IP Address:127.0.0.1" in text
    assert "DNS:localhost" in text
    assert "TLS Web Server Authentication" in text


def test_python_tls_accepts_the_files(tmp_path: Path) -> None:
    pki = generate_pki(tmp_path)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(pki.serving_cert, pki.serving_key)
    client = ssl.create_default_context(cafile=str(pki.ca_cert))
    assert client.cert_store_stats()["x509_ca"] == 1


def test_keys_are_private_and_sa_pair_matches(tmp_path: Path) -> None:
    pki = generate_pki(tmp_path)
    for key in (pki.ca_key, pki.serving_key, pki.sa_key):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    derived = subprocess.run(
        ["openssl", "pkey", "-in", str(pki.sa_key), "-pubout"], capture_output=True, text=True, check=True
    ).stdout
    assert derived == pki.sa_pub.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["ca.crt", "ca.key", "apiserver.crt", "apiserver.key", "sa.key", "sa.pub"]
    )


def test_tokens_are_random() -> None:
    tokens = {new_token() for _ in range(100)}
    assert len(tokens) == 100
    assert all(len(t) >= 40 and "," not in t for t in tokens)
