"""Batched decisions (``worker.engine``): consecutive pods of one shape reuse the verdicts and node-local scores
of the nodes that did not change, and must place exactly as deciding every pod from scratch does.

The randomized test replays one scenario twice, batching on and off: runs of pods from a few templates, with
cluster events between decisions (pods deleted, nodes relabelled, cordoned, resized, their images changed, the
shard changed, a pod nominated). Every decision, not only the node, must be equal. The same comparison is run
with the batch broken on purpose (a node's change not seen, an image count change not seen, every pod taken
for one shape) and must then find a difference, so the test can tell.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from common.records import NodeName, NodeRecord, PodKey, PodRecord
from tests.builders import make_node, make_pod
from tests.unit.worker.helpers import FixedShard
from worker.cache import Cache
from worker.engine import Decision, Engine
from worker.nodeinfo import NodeInfo
from worker.plugins.images import ImageLocality
from worker.scheduler import build_engine
from worker.settings import WorkerSettings

SESSION = WorkerSettings().scheduling.session_label
WARM = WorkerSettings().scheduling.warm_label.partition("=")[0]
IMAGES = ("sandbox:1", "sandbox:2", "tools:1")
MB = 1024 * 1024


def _node(name: str, spec: dict[str, Any]) -> NodeRecord:
    b = make_node(name, cpu=spec["cpu"], memory=spec["memory"], pods=str(spec["pods"]))
    b.label("zone", spec["zone"])
    if spec["warm"]:
        b.label(WARM, "true")
    if spec["prefer_no"]:
        b.taint("soft", "x", effect="PreferNoSchedule")
    if spec["dedicated"]:
        b.taint("dedicated", "batch")
    if spec["cordoned"]:
        b.cordon()
    for image, size in sorted(spec["images"], key=lambda i: -i[1]):
        b.image(size, image)
    return b.record()


def _node_spec(rng: random.Random) -> dict[str, Any]:
    return {
        "cpu": rng.choice(["1", "2", "4"]),
        "memory": rng.choice(["2Gi", "4Gi", "8Gi"]),
        "pods": rng.randint(2, 8),
        "zone": rng.choice(["a", "b"]),
        "warm": rng.random() < 0.3,
        "prefer_no": rng.random() < 0.2,
        "dedicated": rng.random() < 0.1,
        "cordoned": False,
        "images": [(i, rng.choice([30, 200, 600, 1500]) * MB) for i in IMAGES if rng.random() < 0.4],
    }


def _template(rng: random.Random) -> dict[str, Any]:
    return {
        "cpu": rng.choice(["100m", "250m", "500m"]),
        "memory": rng.choice(["128Mi", "512Mi"]),
        "session": rng.choice([None, "s1", "s2"]),
        "zone": rng.choice([None, None, "a"]),
        "tolerate": rng.random() < 0.3,
        "image": rng.choice(IMAGES),
        "port": rng.random() < 0.1,
    }


def _pod(name: str, t: dict[str, Any]) -> PodRecord:
    b = make_pod(name).req(cpu=t["cpu"], memory=t["memory"]).image(t["image"])
    if t["session"]:
        b.label(SESSION, t["session"])
    if t["zone"]:
        b.node_selector(zone=t["zone"])
    if t["tolerate"]:
        b.toleration("dedicated", "batch")
    if t["port"]:
        b.host_port(8080)
    return b.record()


def replay(seed: int, *, batching: bool, steps: int = 300) -> tuple[list[Decision], int]:
    """The scenario of ``seed``: every decision in order, and how many reused a batch."""
    rng = random.Random(seed)
    specs = {f"n{i:02d}": _node_spec(rng) for i in range(rng.randint(8, 24))}
    shard = FixedShard(specs)
    cache = Cache(shard=shard, session_label=SESSION)
    for name, spec in specs.items():
        cache.upsert_node(_node(name, spec))
    settings = WorkerSettings()
    settings.scheduling.feasible_nodes = rng.choice([2, 4, 16])
    engine: Engine = build_engine(settings, cache)
    engine.batching = batching
    templates = [_template(rng) for _ in range(4)]
    placed: list[PodRecord] = []
    decisions: list[Decision] = []
    template = templates[0]
    for step in range(steps):
        if rng.random() < 0.25:
            template = rng.choice(templates)  # runs of one template, as a burst from a pool would queue
        if rng.random() < 0.15:
            _event(rng, cache, shard, specs, placed)
        pod = _pod(f"p{step:04d}", template)
        if rng.random() < 0.03:
            cache.nominate(pod, NodeName(rng.choice(sorted(specs))))
        d = engine.schedule(pod)
        decisions.append(d)
        cache.unnominate(pod.key)
        if d.node is not None:
            cache.assume(pod, d.node)
            placed.append(pod)
    return decisions, engine.batched


def _event(
    rng: random.Random,
    cache: Cache,
    shard: FixedShard,
    specs: dict[str, dict[str, Any]],
    placed: list[PodRecord],
) -> None:
    kind = rng.choice([0, 0, 1, 2, 3, 4, 4, 4, 5])  # image changes often: they move every holder's score
    name = rng.choice(sorted(specs))
    spec = specs[name]
    if kind == 0 and placed:
        pod = placed.pop(rng.randrange(len(placed)))
        cache.remove_pod(PodKey(pod.key))
        return
    if kind == 1:
        spec["warm"] = not spec["warm"]
    elif kind == 2:
        spec["cordoned"] = not spec["cordoned"]
    elif kind == 3:
        spec["cpu"] = rng.choice(["1", "2", "4"])
    elif kind == 4:
        spec["images"] = [(i, rng.choice([30, 200, 600, 1500]) * MB) for i in IMAGES if rng.random() < 0.5]
    else:
        shard.set(n for n in specs if rng.random() < 0.9)
        return
    cache.upsert_node(_node(name, spec))


def first_difference(seeds: range) -> str | None:
    for seed in seeds:
        batched, _ = replay(seed, batching=True)
        alone, _ = replay(seed, batching=False)
        for i, (a, b) in enumerate(zip(batched, alone, strict=True)):
            if a != b:
                return f"seed {seed}, decision {i}: batched {a} != one by one {b}"
    return None


def test_batched_decisions_equal_one_by_one() -> None:
    assert first_difference(range(30)) is None


def test_batches_are_used() -> None:
    reused = sum(replay(seed, batching=True)[1] for seed in range(10))
    decided = 10 * 300
    assert reused > decided // 4, f"only {reused} of {decided} decisions reused a batch"


@contextmanager
def _generation_not_bumped_by_assume(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A node whose new pod a batch would not notice."""
    add_pod = NodeInfo.add_pod

    def stale_add(self: NodeInfo, pod: PodRecord) -> None:
        generation = self.generation
        add_pod(self, pod)
        self.generation = generation

    monkeypatch.setattr(NodeInfo, "add_pod", stale_add)
    yield


@contextmanager
def _image_counts_not_in_key(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """ImageLocality's batch key without the cluster-wide counts its scores derive from."""
    monkeypatch.setattr(ImageLocality, "batch_key", lambda self, pod: pod.images)
    yield


@contextmanager
def _one_shape_for_all(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every batchable pod taken for the shape of the run before it."""
    monkeypatch.setattr(Engine, "_shape", lambda self, pod: ())
    yield


@pytest.mark.parametrize(
    "breakage", [_generation_not_bumped_by_assume, _image_counts_not_in_key, _one_shape_for_all]
)
def test_the_comparison_finds_a_broken_batch(monkeypatch: pytest.MonkeyPatch, breakage: Any) -> None:
    with breakage(monkeypatch):
        assert first_difference(range(30)) is not None
