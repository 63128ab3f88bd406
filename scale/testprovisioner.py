"""A tiny volume provisioner for the local cluster, test infrastructure like kwok: it makes PersistentVolumes
for claims of StorageClasses naming it, so ``WaitForFirstConsumer`` dynamic provisioning can be exercised
without a storage system. Nothing is stored anywhere.

What it does, as an external CSI provisioner does (only the parts a scheduler can observe): for every claim
without a volume whose StorageClass's ``provisioner`` is this one's name and that is either annotated
``volume.kubernetes.io/selected-node`` (WaitForFirstConsumer, after a scheduler chose the node) or of an
Immediate class, it creates the PV ``pvc-<claim uid>``: the claim's size and access modes, a ``csi`` source of
this driver, ``claimRef`` to the claim (the PV controller then binds both), reclaim policy Retain, and node
affinity to the selected node's ``topology.kubernetes.io/zone`` (or to the node itself when it has no zone);
labelled ``agent-scheduler.io/test-provisioner=true`` so tests can delete what it made. The name must be a DNS
subdomain (it is also the CSI driver's name). A PV that exists
already is left as it is (409), so running it twice does no harm.

Run: ``python -m scale.testprovisioner --kubeconfig K --name NAME``; started and stopped by PID like the other
processes of the local cluster (``scale.cluster.processes``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from typing import Any

from common.kube import ApiError, Conflict, Gone, KubeClient, NotFound, load_credentials

log = logging.getLogger("testprovisioner")

SELECTED_NODE = "volume.kubernetes.io/selected-node"
ZONE = "topology.kubernetes.io/zone"
HOSTNAME = "kubernetes.io/hostname"
LABEL = "agent-scheduler.io/test-provisioner"


def volume_for(claim: dict[str, Any], name: str, node: dict[str, Any] | None) -> dict[str, Any]:
    meta, spec = claim["metadata"], claim.get("spec") or {}
    size = ((spec.get("resources") or {}).get("requests") or {}).get("storage", "1Gi")
    pv: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": f"pvc-{meta['uid']}",
            "labels": {LABEL: "true"},
            "annotations": {"pv.kubernetes.io/provisioned-by": name},
        },
        "spec": {
            "capacity": {"storage": size},
            "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
            "storageClassName": spec.get("storageClassName") or "",
            "persistentVolumeReclaimPolicy": "Retain",
            "volumeMode": spec.get("volumeMode") or "Filesystem",
            "csi": {"driver": name, "volumeHandle": meta["uid"]},
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": meta["uid"],
            },
        },
    }
    if node is not None:
        labels = node["metadata"].get("labels") or {}
        key, value = (ZONE, labels[ZONE]) if ZONE in labels else (HOSTNAME, node["metadata"]["name"])
        pv["spec"]["nodeAffinity"] = {
            "required": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}
                ]
            }
        }
    return pv


class Provisioner:
    def __init__(self, client: KubeClient, name: str) -> None:
        self.client = client
        self.name = name
        self.done: set[str] = set()  # claim uids provisioned

    async def _class(self, claim: dict[str, Any]) -> dict[str, Any] | None:
        cls = (claim.get("spec") or {}).get("storageClassName")
        if not cls:
            return None
        try:
            obj: dict[str, Any] = await self.client.get(f"/apis/storage.k8s.io/v1/storageclasses/{cls}")
        except NotFound:
            return None
        return obj

    async def handle(self, claim: dict[str, Any]) -> None:
        meta = claim["metadata"]
        if (
            (claim.get("spec") or {}).get("volumeName")
            or meta.get("deletionTimestamp")
            or meta["uid"] in self.done
        ):
            return
        cls = await self._class(claim)
        if cls is None or cls.get("provisioner") != self.name:
            return
        selected = (meta.get("annotations") or {}).get(SELECTED_NODE)
        node: dict[str, Any] | None = None
        if selected:
            try:
                node = await self.client.get(f"/api/v1/nodes/{selected}")
            except NotFound:
                log.warning(
                    "claim %s/%s: selected node %s does not exist", meta["namespace"], meta["name"], selected
                )
                return
        elif cls.get("volumeBindingMode") == "WaitForFirstConsumer":
            return  # waits for a scheduler to choose the node
        try:
            await self.client.post("/api/v1/persistentvolumes", volume_for(claim, self.name, node))
            log.info(
                "provisioned pvc-%s for %s/%s on %s", meta["uid"], meta["namespace"], meta["name"], selected
            )
        except Conflict:  # 409 AlreadyExists: made before (a replayed event)
            pass
        self.done.add(meta["uid"])

    async def run(self) -> None:
        path = "/api/v1/persistentvolumeclaims"
        rv = ""
        while True:
            try:
                if not rv:
                    listing = await self.client.get(path)
                    rv = listing["metadata"]["resourceVersion"]
                    for obj in listing.get("items") or ():
                        await self.handle(obj)
                async for kind, obj in self.client.watch(path, resource_version=rv, timeout_seconds=60):
                    rv = obj.get("metadata", {}).get("resourceVersion") or rv
                    if kind in ("ADDED", "MODIFIED"):
                        await self.handle(obj)
            except Gone:
                rv = ""
            except (ApiError, OSError, TimeoutError) as e:
                log.warning("watch failed (%s); retrying", e)
                await asyncio.sleep(0.5)


async def main(kubeconfig: str, name: str) -> None:
    async with KubeClient(load_credentials(kubeconfig)) as client:
        await Provisioner(client, name).run()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--name", required=True, help="the provisioner name StorageClasses refer to")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    asyncio.run(main(args.kubeconfig, args.name))
