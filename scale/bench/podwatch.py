"""A micro benchmark of one worker's pod watch: captured watch events replayed through ``worker.feeds.PodFeed``,
CPU per event by kind.

``python -m scale.bench.podwatch EVENTS NODES [--replays N]``: ``EVENTS`` is a raw watch stream of
``/api/v1/pods`` (one JSON event per line, as the API server sends it; ``.gz`` allowed), ``NODES`` a JSON list of
the Node objects the pods were placed on. The stream is replayed twice per round: as a standalone worker (every
node usable, pending pods of the scheduler queued) and as one of two coordinated workers (every other node
usable, pending pods brought by DISPATCH). Before the binding of a pod on a usable node, the pod is assumed as
the scheduler would: standalone from the feed's pending record, coordinated from a DISPATCH of the pending
object parsed as ``worker.intake`` parses it (its cost is shown as "dispatch parse": the watch's parse moved
there). After each status event of a placed pod the same object is applied once more under a new
resourceVersion ("status again": derived from the capture, a later status update that changes nothing a
worker reads, as a kubelet's after the start). Each event's CPU is measured with the thread's CPU clock (``time.thread_time``), so time spent by
other processes does not count; ``orjson.loads`` of the lines (the reflector's share) is shown apart. The
garbage collector is off during a replay (what it costs depends on the whole process's heap, not on the feed).

docs/results/podwatch-2026-12-01/ holds a capture (a standalone worker placing 1,000 agent pods of the
``burst`` shape on 20 kwok nodes, kwok making them Running, then each deleted with grace period 0:
ADDED, binding, Running, deletionTimestamp, DELETED per pod) and its results before and after the feed's
shortcuts.
"""

from __future__ import annotations

import argparse
import collections
import gc
import gzip
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

from common.records import NodeName, NodeRecord, PodKey, PodRecord, node_from_json, pod_from_json
from worker.cache import Cache
from worker.feeds import PodFeed
from worker.queue import SchedulingQueue
from worker.shard import Listener

SCHEDULER = "agent-capture"  # the scheduler name of the captured pods


class _Nodes:
    """A ``worker.shard.ShardView`` of a fixed set of usable nodes."""

    def __init__(self, nodes: set[str]) -> None:
        self.nodes = nodes

    def usable(self, node: NodeName) -> bool:
        return node in self.nodes

    def usable_now(self) -> Callable[[NodeName], bool]:
        return self.nodes.__contains__

    def subscribe(self, callback: Listener) -> Callable[[], None]:
        return lambda: None

    def syncing(self) -> int:
        return 0

    def bind_deadline(self, node: NodeName) -> float | None:
        return None


class _Reporter:
    def forget(self, key: str) -> None:
        pass


def _read(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if path.suffix == ".gz" else data


def load(events: Path, nodes: Path) -> tuple[list[tuple[str, bytes]], list[NodeRecord]]:
    """The pod events (kind, the object's JSON) and the node records."""
    out = []
    for line in _read(events).splitlines():
        if line.strip():
            event = orjson.loads(line)
            if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                out.append((str(event["type"]), orjson.dumps(event["object"])))
    return out, [node_from_json(n) for n in orjson.loads(_read(nodes))]


def _kind(kind: str, obj: dict[str, Any], before: str, usable: set[str]) -> str:
    node = obj["spec"].get("nodeName") or ""
    if kind in ("ADDED", "DELETED"):
        name = kind.lower()
    elif obj["metadata"].get("deletionTimestamp"):
        name = "deleting"
    elif node and not before:
        name = "binding"
    else:
        name = "status" if node else "pending update"
    return name if not node else f"{name}, {'own' if node in usable else 'foreign'} node"


def replay(
    mode: str, events: Sequence[tuple[str, bytes]], nodes: Sequence[NodeRecord]
) -> dict[str, list[float]]:
    """CPU seconds of every event, by kind, for a worker of ``mode`` (standalone or coordinated)."""
    names = sorted(n.name for n in nodes)
    usable: set[str] = set(names) if mode == "standalone" else set(names[::2])
    cache = Cache(shard=_Nodes(usable))
    for n in nodes:
        cache.upsert_node(n)
    feed = PodFeed(
        cache,
        SchedulingQueue(time.monotonic),
        _Reporter(),  # type: ignore[arg-type]
        scheduler_name=SCHEDULER,
        watch_pending=mode == "standalone",
    )
    objects = [(kind, orjson.loads(raw)) for kind, raw in events]
    pending: dict[str, bytes] = {}
    node_of: dict[str, str] = {}
    spent: dict[str, list[float]] = collections.defaultdict(list)
    gc.disable()
    try:
        for kind, obj in objects:
            meta = obj["metadata"]
            key = f"{meta.get('namespace')}/{meta.get('name')}"
            node = obj["spec"].get("nodeName") or ""
            what = _kind(kind, obj, node_of.get(key, ""), usable)
            if kind == "ADDED" and not node:
                pending[key] = orjson.dumps(obj)
            if (
                what == "binding, own node"
                and key in pending
                and obj["spec"].get("schedulerName") == SCHEDULER
            ):
                started = time.thread_time()
                record: PodRecord | None
                if mode == "standalone":
                    record = feed.pending.get(PodKey(key))
                else:
                    record = pod_from_json(orjson.loads(pending[key]), feed.previous(PodKey(key)))
                    spent["dispatch parse"].append(time.thread_time() - started)
                if record is not None:
                    cache.assume(record, NodeName(node))
            node_of[key] = node
            started = time.thread_time()
            feed.event(kind, obj)
            spent[what].append(time.thread_time() - started)
            if what.startswith("status"):
                # derived: the same status once more under a new resourceVersion (a later kubelet update that
                # changes nothing a worker reads)
                again = {**obj, "metadata": {**meta, "resourceVersion": f"{meta.get('resourceVersion')}0"}}
                started = time.thread_time()
                feed.event(kind, again)
                spent[what.replace("status", "status again")].append(time.thread_time() - started)
    finally:
        gc.enable()
    return spent


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m scale.bench.podwatch", description=__doc__.split("\n")[0]
    )
    parser.add_argument("events", type=Path)
    parser.add_argument("nodes", type=Path)
    parser.add_argument("--replays", type=int, default=5)
    args = parser.parse_args(argv)
    events, nodes = load(args.events, args.nodes)
    pods = sum(1 for kind, _ in events if kind == "ADDED")
    started = time.thread_time()
    for _, raw in events:
        orjson.loads(raw)
    loads = (time.thread_time() - started) / len(events)
    print(
        f"{len(events)} events of {pods} pods; orjson.loads {loads * 1e6:.1f} µs per event (not counted below)"
    )
    for mode in ("standalone", "coordinated"):
        rounds = [replay(mode, events, nodes) for _ in range(args.replays)]
        per_pod = statistics.median(sum(sum(v) for v in r.values()) for r in rounds) / pods
        print(f"{mode}: {per_pod * 1e6:.1f} µs per pod (median of {args.replays} replays)")
        for what in sorted(rounds[0]):
            median = statistics.median(statistics.median(r[what]) for r in rounds)
            mean = statistics.median(statistics.fmean(r[what]) for r in rounds)
            print(
                f"  {what:28s} {len(rounds[0][what]):6d} events  median {median * 1e6:6.1f} µs  mean {mean * 1e6:6.1f} µs"
            )


if __name__ == "__main__":
    main(sys.argv[1:])
