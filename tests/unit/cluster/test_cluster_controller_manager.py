"""kube-controller-manager in the local cluster: its command line, its user, and that it can be left out."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from scale.cluster import command, components
from scale.cluster.config import CONTROLLER_MANAGER_USER, ClusterOptions, Layout, token_file_document
from scale.cluster.errors import ToolMissing
from scale.cluster.lifecycle import start_cluster
from scale.cluster.pki import Pki


def _fake_bin(tmp_path: Path, *names: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in names:
        (bin_dir / name).write_text("#!/bin/sh\n")
    return bin_dir


def test_command_line(tmp_path: Path) -> None:
    options = ClusterOptions(bin_dir=_fake_bin(tmp_path, components.CONTROLLER_MANAGER))
    layout = Layout(tmp_path / "c")
    pki = Pki(
        *(
            tmp_path / "pki" / n
            for n in ("ca.crt", "ca.key", "apiserver.crt", "apiserver.key", "sa.key", "sa.pub")
        )
    )
    comp = components.controller_manager(options, layout, pki)
    args = comp.command({"kube_controller_manager": 12345})
    assert args[0] == str(options.bin_dir / components.CONTROLLER_MANAGER)
    assert f"--kubeconfig={layout.component_kubeconfig(components.CONTROLLER_MANAGER)}" in args
    assert "--leader-elect=false" in args
    assert "--secure-port=12345" in args and "--bind-address=127.0.0.1" in args
    assert f"--service-account-private-key-file={pki.sa_key}" in args
    assert f"--root-ca-file={pki.ca_cert}" in args
    controllers = next(a for a in args if a.startswith("--controllers="))
    assert controllers.split("=", 1)[1].split(",") == [
        "*",
        "-node-lifecycle-controller",
        "-taint-eviction-controller",
        "-ttl-controller",
    ]
    assert comp.port_names == ("kube_controller_manager",)


def test_its_user_is_a_master() -> None:
    lines = token_file_document({CONTROLLER_MANAGER_USER: "t"}).splitlines()
    assert lines == [f't,{CONTROLLER_MANAGER_USER},{CONTROLLER_MANAGER_USER},"system:masters"']


def test_a_missing_binary_is_explained_unless_left_out(tmp_path: Path) -> None:
    bin_dir = _fake_bin(tmp_path, components.ETCD, components.APISERVER, components.KWOK)
    with pytest.raises(ToolMissing, match="kube-controller-manager"):
        start_cluster(tmp_path / "c", options=ClusterOptions(bin_dir=bin_dir))
    assert not (tmp_path / "c").exists()


def test_the_flag_leaves_it_out() -> None:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    assert parser.parse_args(["up"]).without_controller_manager is False
    assert parser.parse_args(["up", "--without-controller-manager"]).without_controller_manager is True
