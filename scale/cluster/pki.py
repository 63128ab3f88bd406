"""Key material for a throwaway local cluster, made with the ``openssl`` command line.

What it makes, in ``DIR/pki``:
- ``ca.crt``/``ca.key``: a self-signed CA (the kubeconfig trusts it; nothing else is signed by it but the
  serving certificate).
- ``apiserver.crt``/``apiserver.key``: kube-apiserver's serving certificate, valid for 127.0.0.1, ::1,
  localhost and the in-cluster service names.
- ``sa.key``/``sa.pub``: the service-account token signing key pair.
- static bearer tokens (random, URL-safe) for the admin, kube-scheduler and kwok users.

All keys are ECDSA P-256: fast to generate (the whole set takes a few tens of milliseconds) and accepted by
every component. The ``cryptography`` package is not a dependency of this project, so ``openssl`` (present on
any machine that builds Kubernetes) does the work; a missing or failing ``openssl`` raises ``PkiError`` with its
output. Nothing here is meant to be secure beyond the local machine: private keys are 0600, that is all.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

VALID_DAYS = 3650
SERVING_SANS = (
    "IP:127.0.0.1",
    "IP:0:0:0:0:0:0:0:1",
    "IP:10.96.0.1",
    "DNS:localhost",
    "DNS:kubernetes",
    "DNS:kubernetes.default",
    "DNS:kubernetes.default.svc",
    "DNS:kubernetes.default.svc.cluster.local",
)
_EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")


class PkiError(RuntimeError):
    """Raised when ``openssl`` is missing or one of its commands fails; the message carries its output."""


@dataclass(frozen=True, slots=True)
class Pki:
    """Paths of the generated files."""

    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    sa_key: Path
    sa_pub: Path


def new_token() -> str:
    """A random static bearer token (32 bytes of entropy)."""
    return secrets.token_urlsafe(32)


def _openssl(*args: str, cwd: Path) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        raise PkiError("openssl not found on PATH; it is needed to generate the cluster's certificates")
    result = subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise PkiError(f"openssl {' '.join(args[:2])} failed ({result.returncode}): {result.stderr.strip()}")


def generate_pki(directory: Path) -> Pki:
    """Create the CA, the serving certificate and the service-account keys in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(
        ca_cert=directory / "ca.crt",
        ca_key=directory / "ca.key",
        serving_cert=directory / "apiserver.crt",
        serving_key=directory / "apiserver.key",
        sa_key=directory / "sa.key",
        sa_pub=directory / "sa.pub",
    )
    days = str(VALID_DAYS)
    _openssl(
        "req", "-x509", *_EC_KEY, "-keyout", pki.ca_key.name, "-out", pki.ca_cert.name, "-days", days,
        "-subj", "/CN=agent-scheduler-local-ca",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        cwd=directory,
    )  # fmt: skip
    _openssl(
        "req", "-new", *_EC_KEY, "-keyout", pki.serving_key.name, "-out", "apiserver.csr",
        "-subj", "/CN=kube-apiserver",
        cwd=directory,
    )  # fmt: skip
    extensions = directory / "apiserver.ext"
    extensions.write_text(
        "basicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        f"subjectAltName={','.join(SERVING_SANS)}\n"
    )
    _openssl(
        "x509", "-req", "-in", "apiserver.csr", "-CA", pki.ca_cert.name, "-CAkey", pki.ca_key.name,
        "-set_serial", str(secrets.randbits(63)), "-days", days, "-extfile", extensions.name,
        "-out", pki.serving_cert.name,
        cwd=directory,
    )  # fmt: skip
    _openssl(
        "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", pki.sa_key.name,
        cwd=directory,
    )  # fmt: skip
    _openssl("pkey", "-in", pki.sa_key.name, "-pubout", "-out", pki.sa_pub.name, cwd=directory)
    (directory / "apiserver.csr").unlink()
    extensions.unlink()
    for key in (pki.ca_key, pki.serving_key, pki.sa_key):
        key.chmod(0o600)
    return pki
