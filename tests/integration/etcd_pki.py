"""Certificates for a TLS etcd in tests: the local cluster's CA and serving certificate
(``scale.cluster.pki.generate_pki``, valid for 127.0.0.1), plus client certificates signed by that CA, made
with the ``openssl`` command line as the cluster's own key material is."""

from __future__ import annotations

import secrets
import shutil
import subprocess
from pathlib import Path

from scale.cluster.pki import generate_pki
from tests.integration.etcd_server import EtcdTls


def _openssl(*args: str, cwd: Path) -> None:
    exe = shutil.which("openssl")
    assert exe is not None, "openssl is needed to make the test certificates"
    subprocess.run([exe, *args], cwd=cwd, check=True, capture_output=True)


def client_certificate(directory: Path, ca_cert: Path, ca_key: Path, name: str) -> tuple[Path, Path]:
    """A client certificate with CN ``name`` (etcd's user under ``--client-cert-auth``) and its key."""
    key, csr, cert, ext = (directory / f"{name}{s}" for s in (".key", ".csr", ".crt", ".ext"))
    _openssl(
        "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", key.name, "-out", csr.name, "-subj", f"/CN={name}",
        cwd=directory,
    )  # fmt: skip
    ext.write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n"
    )
    _openssl(
        "x509", "-req", "-in", csr.name, "-CA", str(ca_cert), "-CAkey", str(ca_key),
        "-set_serial", str(secrets.randbits(63)), "-days", "2", "-extfile", ext.name, "-out", cert.name,
        cwd=directory,
    )  # fmt: skip
    csr.unlink()
    ext.unlink()
    key.chmod(0o600)
    return cert, key


def etcd_tls(directory: Path, *, client: str = "root") -> EtcdTls:
    """A fresh CA, etcd's serving certificate, and one client certificate (CN ``client``)."""
    pki = generate_pki(directory)
    cert, key = client_certificate(directory, pki.ca_cert, pki.ca_key, client)
    return EtcdTls(pki.ca_cert, pki.serving_cert, pki.serving_key, cert, key)
