"""Config files written into a cluster directory, the state file, and the kwok stages."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml

from scale.cluster.config import (
    ADMIN_USER,
    KWOK_USER,
    SCHEDULER_USER,
    Layout,
    kubeconfig_document,
    scheduler_config_document,
    token_file_document,
)
from scale.cluster.processes import ProcessRecord
from scale.cluster.stages import kwok_config
from scale.cluster.state import RUNNING, ClusterState, load, save


def test_kubeconfig_embeds_ca_and_token() -> None:
    doc = yaml.safe_load(
        kubeconfig_document(server="https://127.0.0.1:1", ca_pem=b"PEM", token="tok", user="me")
    )
    cluster = doc["clusters"][0]["cluster"]
    assert cluster["server"] == "https://127.0.0.1:1"
    assert base64.b64decode(cluster["certificate-authority-data"]) == b"PEM"
    assert doc["users"][0] == {"name": "me", "user": {"token": "tok"}}
    assert doc["current-context"] == doc["contexts"][0]["name"]


def test_token_file_groups() -> None:
    lines = token_file_document({ADMIN_USER: "a", SCHEDULER_USER: "s", KWOK_USER: "k"}).splitlines()
    assert lines[0] == f'a,{ADMIN_USER},{ADMIN_USER},"system:masters"'
    assert lines[1] == f"s,{SCHEDULER_USER},{SCHEDULER_USER}", (
        "kube-scheduler gets its bootstrap RBAC role only"
    )
    assert lines[2].endswith('"system:masters"')


def test_scheduler_config() -> None:
    doc = yaml.safe_load(scheduler_config_document(kubeconfig=Path("/k"), qps=500, burst=900))
    assert doc["kind"] == "KubeSchedulerConfiguration"
    assert doc["clientConnection"] == {"kubeconfig": "/k", "qps": 500.0, "burst": 900}
    assert doc["leaderElection"] == {"leaderElect": False}
    assert doc["profiles"] == [{"schedulerName": "default-scheduler"}]


def test_kwok_config_has_options_and_every_stage() -> None:
    docs = list(yaml.safe_load_all(kwok_config(pod_parallelism=8)))
    assert docs[0]["kind"] == "KwokConfiguration"
    assert docs[0]["options"]["podPlayStageParallelism"] == 8
    # kwok's defaults, which a config file would otherwise zero (see KWOK_CONFIGURATION)
    assert docs[0]["options"]["podsOnNodeSyncParallelism"] == 1
    assert docs[0]["options"]["enablePodsOnNodeSyncListPager"] is True
    stages = {d["metadata"]["name"]: d for d in docs[1:]}
    assert set(stages) == {"node-initialize", "node-heartbeat", "pod-ready", "pod-complete", "pod-delete"}
    assert all(d["kind"] == "Stage" for d in stages.values())
    assert stages["node-heartbeat"]["spec"]["delay"]["durationMilliseconds"] == 0
    assert stages["node-heartbeat"]["spec"]["delay"]["jitterDurationMilliseconds"] == 600_000
    assert "{{ $now := Now }}" in stages["node-heartbeat"]["spec"]["next"]["statusTemplate"]
    assert stages["pod-delete"]["spec"]["next"] == {"delete": True}


def test_state_round_trip(tmp_path: Path) -> None:
    state = ClusterState(
        dir=str(tmp_path),
        phase=RUNNING,
        server="https://127.0.0.1:2",
        ports={"apiserver": 2},
        processes=[ProcessRecord("etcd", 1, 2.0, ("etcd",), "/l")],
        nodes=5,
    )
    save(state, tmp_path / "state.json")
    assert load(tmp_path / "state.json") == state
    assert not (tmp_path / "state.json.tmp").exists()


def test_layout_knows_what_is_ours(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "c")
    assert layout.is_ours()  # missing
    layout.root.mkdir()
    assert layout.is_ours()  # empty
    (layout.root / "logs").mkdir()
    layout.state.write_text("{}")
    assert layout.is_ours()
    (layout.root / "notes.txt").write_text("mine")
    assert not layout.is_ours()
