"""etcd connection settings: endpoint schemes, TLS material and auth flags checked up front, one line each."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.etcd.kv import EtcdConfigError, EtcdSecurity, connect, split_endpoints


def test_plain_endpoints_with_or_without_a_scheme() -> None:
    assert split_endpoints(["127.0.0.1:2379", "http://h:2379/"], EtcdSecurity()) == (
        ["127.0.0.1:2379", "h:2379"],
        False,
    )


def test_https_endpoints_use_tls_and_need_a_ca() -> None:
    assert split_endpoints(["https://h:2379"], EtcdSecurity(ca_file="ca.crt")) == (["h:2379"], True)
    with pytest.raises(EtcdConfigError, match="--etcd-cafile"):
        split_endpoints(["https://h:2379"], EtcdSecurity())
    assert split_endpoints(["h:2379"], EtcdSecurity(ca_file="ca.crt"))[1]  # a CA alone turns TLS on


@pytest.mark.parametrize(
    ("endpoints", "security", "message"),
    [
        (["http://a:1", "https://b:1"], EtcdSecurity(ca_file="c"), "mix"),
        (["https://a:1"], EtcdSecurity(ca_file="c", cert_file="x"), "go together"),
        (["a:1"], EtcdSecurity(cert_file="x", key_file="y"), "needs TLS"),
        (["a:1"], EtcdSecurity(user="u"), "go together"),
    ],
)
def test_inconsistent_settings_are_one_line_errors(
    endpoints: list[str], security: EtcdSecurity, message: str
) -> None:
    with pytest.raises(EtcdConfigError, match=message) as e:
        split_endpoints(endpoints, security)
    assert "\n" not in str(e.value)


async def test_an_unreadable_ca_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(EtcdConfigError, match=r"CA file .*missing\.crt"):
        await connect(["https://127.0.0.1:1"], EtcdSecurity(ca_file=str(tmp_path / "missing.crt")))
