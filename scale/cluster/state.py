"""``state.json``: what a cluster directory runs, so that any later process can find and stop it.

The file is rewritten (atomically: temporary file, then rename) after every process start, so that a run that
crashes half-way still records every PID it started and ``--force`` can stop them. ``phase`` says how far the
run got: ``starting``, ``running``, or ``failed`` (the processes were stopped, the logs kept for reading).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scale.cluster.errors import ClusterError, NoCluster
from scale.cluster.processes import ProcessRecord

STATE_VERSION = 1
STARTING = "starting"
RUNNING = "running"
FAILED = "failed"


@dataclass(slots=True)
class ClusterState:
    """Everything ``down`` and ``status`` need to know about a cluster directory."""

    dir: str
    phase: str = STARTING
    created: float = 0.0
    server: str = ""
    etcd_endpoint: str = ""
    kubeconfig: str = ""
    ports: dict[str, int] = field(default_factory=dict)
    processes: list[ProcessRecord] = field(default_factory=list)
    nodes: int = 0
    node_seed: int = 0
    with_kube_scheduler: bool = False

    def process(self, name: str) -> ProcessRecord | None:
        return next((p for p in self.processes if p.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "dir": self.dir,
            "phase": self.phase,
            "created": self.created,
            "server": self.server,
            "etcd_endpoint": self.etcd_endpoint,
            "kubeconfig": self.kubeconfig,
            "ports": dict(self.ports),
            "processes": [p.to_json() for p in self.processes],
            "nodes": self.nodes,
            "node_seed": self.node_seed,
            "with_kube_scheduler": self.with_kube_scheduler,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClusterState:
        if data.get("version") != STATE_VERSION:
            raise ClusterError(
                f"unsupported state version {data.get('version')!r} (expected {STATE_VERSION})"
            )
        return cls(
            dir=str(data["dir"]),
            phase=str(data.get("phase") or STARTING),
            created=float(data.get("created") or 0.0),
            server=str(data.get("server") or ""),
            etcd_endpoint=str(data.get("etcd_endpoint") or ""),
            kubeconfig=str(data.get("kubeconfig") or ""),
            ports={str(k): int(v) for k, v in (data.get("ports") or {}).items()},
            processes=[ProcessRecord.from_json(p) for p in data.get("processes") or ()],
            nodes=int(data.get("nodes") or 0),
            node_seed=int(data.get("node_seed") or 0),
            with_kube_scheduler=bool(data.get("with_kube_scheduler")),
        )


def save(state: ClusterState, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state.to_json(), indent=2) + "\n")
    os.replace(tmp, path)


def load(path: Path) -> ClusterState:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as e:
        raise NoCluster(f"no cluster state at {path}") from e
    except (OSError, ValueError) as e:
        raise ClusterError(f"cannot read cluster state {path}: {e}") from e
    try:
        return ClusterState.from_json(data)
    except (KeyError, TypeError, ValueError) as e:
        raise ClusterError(f"malformed cluster state {path}: {e}") from e
