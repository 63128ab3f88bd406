"""The pod feed's shortcuts (``PodFeed(shortcuts=True)``: no parse of events nothing reads, the placed record
kept when only unread fields change, the generation instead of the spec digest, spec parts shared by digest)
against the full path (``shortcuts=False``: every event parsed in full and applied): after every event of
random pod lives, built from a real pod's watch events (captured from kube-apiserver 1.36 with kwok), the two
workers' caches, queues, nominations and pending records must agree in everything a worker reads."""

from __future__ import annotations

import copy
import json
import random
import time
from pathlib import Path
from typing import Any, cast

import pytest

from common.records import UNREAD_WHEN_PLACED, NodeName, PodRecord, node_from_json, pod_from_json, pod_key
from common.reporting import Reporter
from tests.builders import make_node, make_pod
from tests.unit.worker.helpers import FixedShard
from worker.cache import Cache
from worker.feeds import PodFeed
from worker.queue import SchedulingQueue
from worker.topology import incoming

Obj = dict[str, Any]
OURS = "agent-scheduler"
NODES = [f"n{i}" for i in range(6)]
ZONES = ["za", "zb"]
# pod name: its watch events, each {"type": ..., "object": ...}
CAPTURED: dict[str, list[Obj]] = json.loads((Path(__file__).parent / "data" / "pod_events.json").read_text())
_COMPARED = [f for f in PodRecord.__slots__ if f not in UNREAD_WHEN_PLACED]


class NoReports:
    def forget(self, key: str) -> None:
        pass


class Worker:
    def __init__(self, *, shortcuts: bool, watch_pending: bool) -> None:
        self.cache = Cache(shard=FixedShard(NODES[::2]))
        for i, name in enumerate(NODES):
            self.cache.upsert_node(
                node_from_json(
                    make_node(name, cpu="8").label("topology.kubernetes.io/zone", ZONES[i % 2]).json()
                )
            )
        # counts some pods' labels as an inter-pod rule of a pod being decided would (live pods only, and all)
        sel = pod_from_json(make_pod("s").spread("topology.kubernetes.io/zone", {"app": "web"}).json())
        assert sel.inter_pod is not None
        match = (incoming(None, sel.inter_pod.spread[0].selector, None),)
        self.trackers = [self.cache.topology.tracker(match, live_only=live) for live in (True, False)]
        self.queue = SchedulingQueue(time.monotonic)
        self.gone: list[tuple[str, str]] = []  # (key, uid)
        self.feed = PodFeed(
            self.cache,
            self.queue,
            # PodFeed takes the concrete Reporter (no protocol); the feed only calls its forget()
            cast(Reporter, NoReports()),
            scheduler_name=OURS,
            watch_pending=watch_pending,
            gone=lambda key, uid: self.gone.append((key, uid)),
            shortcuts=shortcuts,
        )

    def dispatch(self, obj: Obj) -> PodRecord:
        """The record a DISPATCH of ``obj`` gets (``worker.intake``: parsed with the feed's ``previous``)."""
        return pod_from_json(obj, self.feed.previous(pod_key(obj)))


def _view(record: PodRecord | None) -> Any:
    """What a worker reads of a record: every field but the unread ones, and of the phase whether terminal."""
    if record is None:
        return None
    return [getattr(record, f) for f in _COMPARED] + [record.terminal]


def _state(w: Worker) -> Any:
    c = w.cache
    topology = c.topology
    return {
        "pod_node": dict(c.pod_node),
        "records": {k: _view(c.placed(k)) for k in c.pod_node},
        "assumed": {k: (a.node, _view(a.pod)) for k, a in c.assumed.items()},
        "nodes": {
            n: (info.requested, sorted(info.pods), info.nonzero_cpu, info.ports)
            for n, info in c.nodes.items()
        },
        "index": c.index.summary(),
        "nominated": {n: {k: _view(p) for k, p in pods.items()} for n, pods in c.nominated.items()},
        "sessions": c.sessions,
        "claims": c.claim_users,
        "generation": c.generation,
        "trackers": [(t.nodes, t.domains) for t in w.trackers],
        "anti": {k: (g.nodes, g.domains) for k, g in topology.anti_groups.items()},
        "score": {k: (g.nodes, g.domains) for k, g in topology.score_groups.items()},
        "queue": sorted(w.queue._where.items()),
        "gone": w.gone,
    }


def _template(rng: random.Random) -> Obj:
    """A real pod's first event (pending), with rules that read its labels now and then."""
    obj: Obj = copy.deepcopy(rng.choice(list(CAPTURED.values()))[0]["object"])
    spec = obj["spec"]
    spec["schedulerName"] = rng.choice([OURS, OURS, OURS, "default-scheduler"])
    obj["metadata"]["labels"]["app"] = rng.choice(["web", "db"])
    if rng.random() < 0.3:
        spec["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": "web"}},
                "matchLabelKeys": ["tier"],
            }
        ]
    if rng.random() < 0.2:
        spec["affinity"] = {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}
                ]
            }
        }
    if rng.random() < 0.1:
        spec["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "c"}}]
    return obj


class Cluster:
    """An API server stand-in: pod objects changed as kube-apiserver 1.36 changes them (measured: the
    generation is bumped by every spec update and a graceful delete, not by the binding, labels, annotations,
    owner references or status), and the watch events it would send."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.pods: dict[str, Obj] = {}
        self.rv = 100
        self.serial = 0

    def _emit(self, kind: str, obj: Obj) -> tuple[str, Obj]:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        return kind, copy.deepcopy(obj)

    def create(self) -> tuple[str, Obj]:
        self.serial += 1
        obj = _template(self.rng)
        meta = obj["metadata"]
        meta["name"] = f"p{self.rng.randint(0, 11)}"  # names come back after a deletion, with a new uid
        if meta["name"] in self.pods:
            return self.change(meta["name"])
        meta.update(uid=f"uid-{self.serial}", generation=1)
        meta.pop("deletionTimestamp", None)
        self.pods[meta["name"]] = obj
        return self._emit("ADDED", obj)

    def change(self, name: str) -> tuple[str, Obj]:
        rng = self.rng
        obj = self.pods[name]
        meta, spec = obj["metadata"], obj["spec"]
        status = obj.setdefault("status", {})
        placed = bool(spec.get("nodeName"))
        what = rng.choice(
            ["status", "status", "status", "annotate", "relabel", "owner", "spec", "delete", "finish"]
            + (["nominate", "bind", "bind", "bind"] if not placed else ["running", "running", "preempted"])
        )
        if what == "bind":
            node = rng.choice(NODES)
            spec["nodeName"] = node
            meta["labels"]["topology.kubernetes.io/zone"] = ZONES[NODES.index(node) % 2]  # set at binding
            status["conditions"] = [{"type": "PodScheduled", "status": "True"}]
        elif what == "running":
            status.update(phase="Running", startTime=f"2026-12-01T14:{rng.randint(10, 59)}:00Z")
            status["podIP"] = f"10.0.0.{rng.randint(1, 9)}"
        elif what == "status":
            status["conditions"] = [{"type": "Ready", "status": rng.choice(["True", "False"])}]
            status["podIP"] = f"10.0.0.{rng.randint(1, 9)}"
        elif what == "annotate":
            meta.setdefault("annotations", {})[f"a{rng.randint(0, 2)}"] = str(rng.random())
        elif what == "relabel":
            meta["labels"][rng.choice(["app", "tier"])] = rng.choice(["web", "db", "x"])
        elif what == "owner":
            meta["ownerReferences"] = rng.choice(
                [
                    [],
                    [
                        {
                            "apiVersion": "apps/v1",
                            "kind": "ReplicaSet",
                            "name": "rs",
                            "uid": "u",
                            "controller": True,
                        }
                    ],
                ]
            )
        elif what == "spec":
            if rng.random() < 0.5:
                spec.setdefault("tolerations", []).append(
                    {"key": f"t{rng.randint(0, 9)}", "operator": "Exists"}
                )
            else:  # an in-place resize
                spec["containers"][0]["resources"] = {"requests": {"cpu": f"{rng.randint(1, 9)}00m"}}
            meta["generation"] += 1
        elif what == "nominate":
            status["nominatedNodeName"] = rng.choice(["", *NODES])
        elif what == "preempted":
            status["conditions"] = [
                {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
            ]
        elif what == "delete":
            if not meta.get("deletionTimestamp"):
                meta["deletionTimestamp"] = "2026-12-01T15:00:00Z"
                meta["generation"] += 1
            if rng.random() < 0.5:
                del self.pods[name]
                return self._emit("DELETED", obj)
        elif what == "finish":
            status["phase"] = rng.choice(["Succeeded", "Failed"])
            del self.pods[name]
            return self._emit(rng.choice(["MODIFIED", "DELETED"]), obj)
        return self._emit("MODIFIED", obj)

    def step(self) -> tuple[str, Obj]:
        if not self.pods or self.rng.random() < 0.25:
            return self.create()
        return self.change(self.rng.choice(sorted(self.pods)))


@pytest.mark.parametrize("watch_pending", [False, True], ids=["coordinated", "standalone"])
def test_the_shortcuts_leave_what_a_worker_reads_as_the_full_path_does(watch_pending: bool) -> None:
    rng = random.Random(14)
    kept = 0
    for _ in range(40):
        cluster = Cluster(rng)
        fast = Worker(shortcuts=True, watch_pending=watch_pending)
        full = Worker(shortcuts=False, watch_pending=watch_pending)
        for _ in range(150):
            kind, obj = cluster.step()
            key = pod_key(obj)
            node = obj["spec"].get("nodeName")
            if (
                node
                and kind == "MODIFIED"
                and obj["spec"]["schedulerName"] == OURS
                and key not in full.cache.pod_node
                and rng.random() < 0.5
            ):
                # this worker decided the pod: it was assumed (from a DISPATCH or the queue) before the binding
                pending = copy.deepcopy(obj)
                del pending["spec"]["nodeName"]
                for w in (fast, full):
                    w.cache.assume(
                        w.dispatch(pending) if w is fast else pod_from_json(pending), NodeName(node)
                    )
            before = fast.cache.placed(key)
            fast.feed.event(kind, copy.deepcopy(obj))
            full.feed.event(kind, copy.deepcopy(obj))
            kept += before is not None and fast.cache.placed(key) is before
            assert _state(fast) == _state(full), (kind, obj)
            # a DISPATCH of a pending pod of ours gets the record a full parse gives
            for p in cluster.pods.values():
                if not p["spec"].get("nodeName") and p["spec"]["schedulerName"] == OURS:
                    assert fast.dispatch(p) == pod_from_json(p)
    assert kept > 100  # the placed record was kept for events that change nothing read, not only rebuilt


def test_a_status_event_of_a_placed_pod_keeps_its_record_and_a_start_rebuilds_it() -> None:
    events = [e["object"] for e in CAPTURED["agent-000000"]]
    added, bound, running = events[0], events[1], events[2]
    w = Worker(shortcuts=True, watch_pending=False)
    w.feed.event("ADDED", added)
    assert w.feed.pending == {}  # a pending pod of ours is parsed only when a DISPATCH brings it
    w.feed.event("MODIFIED", bound)
    record = w.cache.placed(pod_key(bound))
    assert record is not None and record.start_time is None
    w.feed.event("MODIFIED", running)  # kwok's Running: the start time is read (preemption)
    started = w.cache.placed(pod_key(bound))
    assert started is not record and started is not None and started.start_time is not None
    later = copy.deepcopy(running)
    later["metadata"]["resourceVersion"] = "999999"
    later["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    w.feed.event("MODIFIED", later)
    assert w.cache.placed(pod_key(bound)) is started
