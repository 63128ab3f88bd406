"""Simulated image pulls on kwok nodes, so ``bench cluster`` can time create -> running, not only -> bound.

kwok has no kubelet and no images; its Stages only see the pod they act on, not the node's
``status.images``. So this module plays the kubelet's image manager, in the load generator:

- Pods that take part carry ``PULL_ANNOTATION`` (the workload sets it); the cluster's ``pod-ready`` Stage
  leaves them alone (``scale.cluster.stages.pod_ready(unless_annotation=...)``).
- ``ImagePuller`` watches the workload's pods (it is a ``common.watching.Reflector`` handler). The first time
  it sees such a pod bound to a node, it works out which of the pod's images (normalized as kube-scheduler's
  ImageLocality does) the node does not list, and writes the time until they are all there into
  ``PULL_DELAY_ANNOTATION`` (a Go duration). The bench's ``bench-pod-pull`` Stage (``scale.bench.stages``)
  makes the pod Running that long after.
- Pulls are serialized per node (kubelet's default ``serializeImagePulls``), each taking ``pull_delay_s``;
  a pod needing an image already being pulled there waits for that pull. When a pull ends, the node lists the
  image: in this module at once, and in the API server (``status.images``, largest first, at most 50 as a
  kubelet reports them) when ``update_nodes`` is on, so schedulers see the node warm from then on.

Invariants: each pod gets its delay once (relists and later events do not move it); a node's images only
grow during a run; nothing here decides placement.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from common.kube import ApiError, KubeClient, NotFound
from common.records import MAX_NODE_IMAGES, normalized_image

log = logging.getLogger(__name__)

PULL_ANNOTATION = "bench.agent-scheduler.io/pull"
PULL_DELAY_ANNOTATION = "bench.agent-scheduler.io/pull-delay"
DEFAULT_IMAGE_SIZE = 1024**3  # for an image no node listed yet (the node status needs a size)


def pod_images(obj: dict[str, Any]) -> list[str]:
    spec = obj.get("spec") or {}
    out: list[str] = []
    for part in ("initContainers", "containers"):
        for c in spec.get(part) or ():
            image = normalized_image(str(c.get("image") or ""))
            if image not in out:
                out.append(image)
    return out


class ImagePuller:
    def __init__(
        self,
        client: KubeClient,
        *,
        pull_delay_s: float,
        update_nodes: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.pull_delay_s = pull_delay_s
        self.update_nodes = update_nodes
        self.clock = clock
        # node -> its status.images entries as listed ([names, size], largest first)
        self.listed: dict[str, list[tuple[list[str], int]]] = {}
        self.present: dict[str, set[str]] = {}  # node -> every image name it lists
        self.sizes: dict[str, int] = {}  # image name -> size, from any node that lists it
        self.pulling: dict[tuple[str, str], float] = {}  # (node, image) -> when its pull ends
        self.busy_until: dict[str, float] = {}  # node -> when its last queued pull ends
        self.handled: set[str] = set()
        self.pods_waiting = 0  # pods that waited for at least one pull
        self.pulls = 0
        self.errors = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def load_nodes(self) -> None:
        """Read every node's ``status.images`` (call before the workload starts)."""
        cont = ""
        while True:
            params = {"limit": "1000", **({"continue": cont} if cont else {})}
            page = await self.client.get("/api/v1/nodes", params)
            for node in page.get("items") or ():
                self._learn(node)
            cont = (page.get("metadata") or {}).get("continue") or ""
            if not cont:
                return

    def _learn(self, node: dict[str, Any]) -> None:
        name = node["metadata"]["name"]
        entries: list[tuple[list[str], int]] = []
        for image in (node.get("status") or {}).get("images") or ():
            names = [str(n) for n in image.get("names") or ()]
            size = int(image.get("sizeBytes") or 0)
            entries.append((names, size))
            for n in names:
                self.sizes.setdefault(n, size)
        self.listed[name] = entries
        self.present[name] = {n for names, _ in entries for n in names}

    def delay(self, node: str, images: list[str]) -> float:
        """Seconds until ``node`` has all of ``images``, queueing the pulls it does not have or pull yet."""
        now = self.clock()
        have = self.present.setdefault(node, set())
        ready = now
        for image in images:
            if image in have:
                continue
            ends = self.pulling.get((node, image))
            if ends is None:
                ends = max(now, self.busy_until.get(node, now)) + self.pull_delay_s
                self.pulling[(node, image)] = ends
                self.busy_until[node] = ends
                self.pulls += 1
                self._spawn(self._finish(node, image, ends))
            ready = max(ready, ends)
        return ready - now

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _finish(self, node: str, image: str, ends: float) -> None:
        await asyncio.sleep(max(0.0, ends - self.clock()))
        self.present.setdefault(node, set()).add(image)
        self.pulling.pop((node, image), None)
        entries = self.listed.setdefault(node, [])
        entries.append(([image], self.sizes.get(image, DEFAULT_IMAGE_SIZE)))
        entries.sort(key=lambda e: -e[1])
        if not self.update_nodes:
            return
        body = {"status": {"images": [{"names": n, "sizeBytes": s} for n, s in entries[:MAX_NODE_IMAGES]]}}
        try:
            await self.client.patch(f"/api/v1/nodes/{node}/status", body)
        except NotFound:
            pass
        except ApiError as e:
            self.errors += 1
            log.warning("recording the pull of %s on %s failed: %s", image, node, e)

    def _see(self, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        node = (obj.get("spec") or {}).get("nodeName")
        name = meta.get("name") or ""
        if (
            not node
            or PULL_ANNOTATION not in annotations
            or PULL_DELAY_ANNOTATION in annotations
            or name in self.handled
        ):
            return
        self.handled.add(name)
        wait = self.delay(str(node), pod_images(obj))
        if wait > 0:
            self.pods_waiting += 1
        self._spawn(self._annotate(meta.get("namespace") or "", name, wait))

    async def _annotate(self, namespace: str, name: str, wait: float) -> None:
        body = {"metadata": {"annotations": {PULL_DELAY_ANNOTATION: f"{round(wait * 1000)}ms"}}}
        try:
            await self.client.patch(f"/api/v1/namespaces/{namespace}/pods/{name}", body)
        except NotFound:
            pass
        except ApiError as e:
            self.errors += 1
            log.warning("annotating %s/%s with its pull delay failed: %s", namespace, name, e)

    # ----- common.watching.WatchHandler ------------------------------------------------------------------

    def replace(self, objects: list[dict[str, Any]]) -> None:
        for obj in objects:
            self._see(obj)

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind != "DELETED":
            self._see(obj)

    async def close(self) -> None:
        """Cancel what is still pending (pulls that would end after the run)."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
