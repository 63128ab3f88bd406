"""Storage for integration tests: this run's StorageClasses and the test provisioner (fixtures), and builders
of the claims, PVs and pod volumes the volume tests create (``test_volumes``, ``test_sharded_interpod``).

The fixtures clean up after themselves: the provisioner process is stopped by its PID, the classes and the PVs
made for them are deleted when the test ends."""

from __future__ import annotations

import contextlib
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from common.kube import KubeClient, NotFound
from scale.cluster import Cluster
from scale.cluster.processes import spawn, stop, tail
from tests.integration.support import ROOT

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"


@pytest.fixture
def run() -> str:
    return uuid.uuid4().hex[:6]


@pytest.fixture
def provisioner(cluster: Cluster, tmp_path: Path, run: str) -> Iterator[str]:
    name = f"p-{run}.test.agent-scheduler.io"
    log = tmp_path / "testprovisioner.log"
    record = spawn(
        "testprovisioner",
        [
            sys.executable,
            "-m",
            "scale.testprovisioner",
            f"--kubeconfig={cluster.kubeconfig}",
            f"--name={name}",
        ],
        log,
        cwd=ROOT,
    )
    yield name
    stopped = stop([record])[0]
    assert stopped.code in (0, -15, 143, None), tail(log)


@pytest.fixture
async def storage(kube: KubeClient, run: str, provisioner: str) -> AsyncIterator[dict[str, str]]:
    """This run's StorageClasses (cluster-scoped) by kind, and the provisioner's (CSI driver's) name under
    ``driver``; the classes are deleted again with the PVs the test made."""
    classes = {
        "immediate": {"provisioner": "kubernetes.io/no-provisioner", "volumeBindingMode": "Immediate"},
        "local": {"provisioner": "kubernetes.io/no-provisioner", "volumeBindingMode": "WaitForFirstConsumer"},
        "dynamic": {"provisioner": provisioner, "volumeBindingMode": "WaitForFirstConsumer"},
    }
    names = {k: f"vol-{k}-{run}" for k in classes}
    for kind, body in classes.items():
        await kube.post(
            "/apis/storage.k8s.io/v1/storageclasses",
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "StorageClass",
                "metadata": {"name": names[kind]},
                **body,
            },
        )
    try:
        yield {**names, "driver": provisioner}
    finally:
        for name in names.values():
            with contextlib.suppress(NotFound):
                await kube.delete(f"/apis/storage.k8s.io/v1/storageclasses/{name}")
        for pv in (await kube.get("/api/v1/persistentvolumes"))["items"]:
            if run in pv["metadata"]["name"] or pv["spec"].get("storageClassName") in names.values():
                with contextlib.suppress(NotFound):
                    await kube.delete(f"/api/v1/persistentvolumes/{pv['metadata']['name']}")


def claim(
    name: str, cls: str, *, modes: tuple[str, ...] = ("ReadWriteOnce",), size: str = "1Gi"
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {
            "storageClassName": cls,
            "accessModes": list(modes),
            "resources": {"requests": {"storage": size}},
        },
    }


def local_pv(
    name: str,
    cls: str,
    *,
    key: str,
    value: str,
    modes: tuple[str, ...] = ("ReadWriteOnce",),
    size: str = "5Gi",
) -> dict[str, Any]:
    """A pre-created (static) PV that only the nodes labelled ``key=value`` can reach (one node by hostname,
    or a zone)."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "storageClassName": cls,
            "capacity": {"storage": size},
            "accessModes": list(modes),
            "persistentVolumeReclaimPolicy": "Retain",
            "local": {"path": "/mnt/data"},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}
                    ]
                }
            },
        },
    }


def mount(pod: dict[str, Any], *claims: str) -> dict[str, Any]:
    """``pod`` with a volume per claim (``v0``, ``v1``, ... after those it has)."""
    volumes = pod["spec"].setdefault("volumes", [])
    for c in claims:
        volumes.append({"name": f"v{len(volumes)}", "persistentVolumeClaim": {"claimName": c}})
    return pod
