"""The etcd connection flags shared by every command (worker, coordinator, status), and the settings they
make. Environment variables give the defaults, so a Deployment can set them once for all containers."""

from __future__ import annotations

import argparse
import os

from common.etcd.kv import EtcdSecurity


def add_security_arguments(p: argparse.ArgumentParser) -> None:
    """``--etcd-cafile --etcd-certfile --etcd-keyfile --etcd-user --etcd-password-file --etcd-server-name``."""
    env = os.environ.get
    p.add_argument(
        "--etcd-cafile",
        default=env("AGENT_SCHEDULER_ETCD_CAFILE", ""),
        help="CA bundle that signed etcd's certificate; enables TLS (needed for https:// endpoints)",
    )
    p.add_argument("--etcd-certfile", default=env("AGENT_SCHEDULER_ETCD_CERTFILE", ""), help="client cert")
    p.add_argument("--etcd-keyfile", default=env("AGENT_SCHEDULER_ETCD_KEYFILE", ""), help="client key")
    p.add_argument("--etcd-user", default=env("AGENT_SCHEDULER_ETCD_USER", ""), help="etcd auth user")
    p.add_argument(
        "--etcd-password-file",
        default=env("AGENT_SCHEDULER_ETCD_PASSWORD_FILE", ""),
        help="file holding the etcd user's password",
    )
    p.add_argument("--etcd-server-name", default="", help="TLS name to verify, if not the endpoint host")


def security_from(args: argparse.Namespace) -> EtcdSecurity:
    return EtcdSecurity(
        ca_file=args.etcd_cafile,
        cert_file=args.etcd_certfile,
        key_file=args.etcd_keyfile,
        user=args.etcd_user,
        password_file=args.etcd_password_file,
        server_name=args.etcd_server_name,
    )


def endpoints_from(args: argparse.Namespace) -> list[str]:
    return [e.strip() for e in args.etcd_endpoints.split(",") if e.strip()]
