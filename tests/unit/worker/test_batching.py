"""Batched decisions (``worker.engine``): pods of one shape, interleaved with other shapes or not, reuse the
verdicts and kept node-local scores of the nodes that did not change, and must place exactly as deciding every
pod from scratch does.

The randomized test replays one scenario twice, batching on and off: runs of pods from a few templates, with
cluster events between decisions (pods deleted, nodes relabelled, cordoned, resized, their images changed, the
shard changed, a pod nominated). Every decision, not only the node, must be equal; also with the engine's limits
on runs made tiny, so that runs are dropped, started over and paused. The same comparison is run with the batch
broken on purpose (a node's change not seen, an image count change not seen, every pod taken for one shape) and
must then find a difference, so the test can tell.
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
from worker import engine as engine_module
from worker.cache import Cache
from worker.engine import Decision, Engine
from worker.nodeinfo import NodeInfo
from worker.plugins.images import ImageLocality
from worker.plugins.resources import NodeResourcesFit
from worker.plugins.taints import TaintFilter
from worker.scheduler import build_engine
from worker.settings import WorkerSettings

SESSION = WorkerSettings().scheduling.session_label
WARM = WorkerSettings().scheduling.warm_label.partition("=")[0]
IMAGES = ("sandbox:1", "sandbox:2", "tools:1")
MB = 1024 * 1024
GPU = "nvidia.com/gpu"


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
    b.extended("ephemeral-storage", spec["ephemeral"])
    if spec["gpus"]:
        b.extended(GPU, spec["gpus"])
    for image, size in sorted(spec["images"], key=lambda i: -i[1]):
        b.image(size, image)
    return b.record()


def _node_spec(rng: random.Random) -> dict[str, Any]:
    return {
        # uneven sizes too: allocation scores that are not short binary fractions, so a sum's order shows
        "cpu": rng.choice(["1", "2", "4", "3870m", "1500m"]),
        "memory": rng.choice(["2Gi", "4Gi", "8Gi", "7500Mi", "3000Mi"]),
        "ephemeral": rng.choice(["100Gi", "2Gi"]),
        "gpus": rng.choice([None, None, None, "1", "2"]),
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
        "memory": rng.choice(["128Mi", "512Mi", "200Mi", "333Mi"]),
        "ephemeral": rng.choice([None, None, "500Mi", "1Gi"]),
        "gpu": rng.choice([None] * 6 + ["1", "2"]),
        "session": rng.choice([None, "s1", "s2"]),
        "zone": rng.choice([None, None, "a"]),
        "tolerate": rng.random() < 0.3,
        "image": rng.choice(IMAGES),
        "port": rng.random() < 0.1,
    }


def _pod(name: str, t: dict[str, Any]) -> PodRecord:
    b = make_pod(name).req(cpu=t["cpu"], memory=t["memory"]).image(t["image"])
    if t["ephemeral"]:
        b.req(ephemeral_storage=t["ephemeral"])
    if t["gpu"]:
        b.req(nvidia_gpu=t["gpu"])
    if t["session"]:
        b.label(SESSION, t["session"])
    if t["zone"]:
        b.node_selector(zone=t["zone"])
    if t["tolerate"]:
        b.toleration("dedicated", "batch")
    if t["port"]:
        b.host_port(8080)
    return b.record()


def _record_totals(engine: Engine, into: list[list[float] | None]) -> None:
    """Every window's weighted sums ``engine`` computes from now on, appended to ``into``."""
    compute = engine._totals

    def recording(
        pod: PodRecord, feasible: list[NodeInfo], entries: list[list[Any]] | None = None
    ) -> list[float] | None:
        result = compute(pod, feasible, entries)
        into.append(result)
        return result

    setattr(engine, "_totals", recording)  # noqa: B010 (an instance's method, replaced for this engine only)


def replay(
    seed: int, *, batching: bool, steps: int = 300, totals: list[list[float] | None] | None = None
) -> tuple[list[Decision], int]:
    """The scenario of ``seed``: every decision in order, and how many reused a batch. ``totals``: gets every
    scored window's weighted sums, in order."""
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
    if totals is not None:
        _record_totals(engine, totals)
    templates = [_template(rng) for _ in range(4)]
    # templates that differ from another in one request only: their shapes must differ all the same
    templates.append(templates[0] | {"memory": "1Gi"})
    templates.append(templates[1] | {"ephemeral": "3Gi"})
    templates.append(templates[2] | {"gpu": "1" if templates[2]["gpu"] == "2" else "2"})
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
    kind = rng.choice([0, 0, 1, 2, 3, 4, 4, 4, 5, 6])  # image changes often: they move every holder's score
    name = rng.choice(sorted(specs))
    spec = specs[name]
    if kind == 0 and placed:
        pod = placed.pop(rng.randrange(len(placed)))
        cache.remove_pod(PodKey(pod.key))
        return
    if kind == 6 and name in cache.known:
        # deleted, then (at this node's next event) added again, maybe with other taints: a new life
        cache.remove_node(NodeName(name))
        spec["dedicated"] = rng.random() < 0.5
        return
    if kind == 6:
        cache.upsert_node(_node(name, spec))
        return
    if kind == 1:
        spec["warm"] = not spec["warm"]
    elif kind == 2:
        spec["cordoned"] = not spec["cordoned"]
    elif kind == 3:
        spec["cpu"] = rng.choice(["1", "2", "4", "3870m"])
    elif kind == 4:
        spec["images"] = [(i, rng.choice([30, 200, 600, 1500]) * MB) for i in IMAGES if rng.random() < 0.5]
    else:
        shard.set(n for n in specs if rng.random() < 0.9)
        return
    cache.upsert_node(_node(name, spec))


def first_difference(seeds: range) -> str | None:
    """The first decision, or the first window's score sums (bit for bit), that differ batched and not."""
    for seed in seeds:
        batched_totals: list[list[float] | None] = []
        alone_totals: list[list[float] | None] = []
        batched, _ = replay(seed, batching=True, totals=batched_totals)
        alone, _ = replay(seed, batching=False, totals=alone_totals)
        for i, (a, b) in enumerate(zip(batched, alone, strict=True)):
            if a != b:
                return f"seed {seed}, decision {i}: batched {a} != one by one {b}"
        for i, (x, y) in enumerate(zip(batched_totals, alone_totals, strict=True)):
            if x != y:
                return f"seed {seed}, scored window {i}: batched sums {x} != one by one {y}"
    return None


def test_batched_decisions_equal_one_by_one() -> None:
    assert first_difference(range(30)) is None


@pytest.mark.parametrize(
    "limits",
    [
        {"RUNS_KEPT": 1},  # every other template drops the run of the one before
        {"RUNS_KEPT": 2, "RUN_WINDOW": 4, "RUN_PAUSE": 1},  # batching paused and tried again
        {"RUN_NODES_KEPT": 3},  # runs start over as they grow
    ],
)
def test_batched_decisions_equal_one_by_one_at_the_runs_limits(
    monkeypatch: pytest.MonkeyPatch, limits: dict[str, int]
) -> None:
    for name, value in limits.items():
        monkeypatch.setattr(engine_module, name, value)
    assert first_difference(range(15)) is None


def _cluster(nodes: int = 12) -> tuple[Cache, Engine]:
    rng = random.Random(7)
    cache = Cache(session_label=SESSION)
    for i in range(nodes):
        spec = _node_spec(rng) | {"cpu": "4", "memory": "8Gi", "pods": 16, "dedicated": False}
        cache.upsert_node(_node(f"n{i:02d}", spec))
    return cache, build_engine(WorkerSettings(), cache)


def _decide(cache: Cache, engine: Engine, pods: list[PodRecord]) -> list[Decision]:
    decisions = []
    for pod in pods:
        d = engine.schedule(pod)
        decisions.append(d)
        if d.node is not None:
            cache.assume(pod, d.node)
    return decisions


def _both_ways(pods: list[PodRecord]) -> tuple[int, list[Decision], list[Decision]]:
    """How many decisions of ``pods`` reused a run; the decisions batched and one by one."""
    cache, engine = _cluster()
    batched = _decide(cache, engine, pods)
    cache_alone, alone = _cluster()
    alone.batching = False
    return engine.batched, batched, _decide(cache_alone, alone, pods)


def _template_pod(name: str, cpu: str, session: str | None = None) -> PodRecord:
    return _pod(
        name,
        {
            "cpu": cpu,
            "memory": "128Mi",
            "ephemeral": None,
            "gpu": None,
            "session": session,
            "zone": None,
            "tolerate": False,
            "image": IMAGES[0],
            "port": False,
        },
    )


def test_interleaved_templates_keep_their_runs() -> None:
    """Pods of two templates taken in turns, as a queue ordered by arrival hands out two bursts: each
    template's pods reuse the run its own earlier pods made."""
    pods = [_template_pod(f"p{i:03d}", ("100m", "250m")[i % 2]) for i in range(40)]
    reused, batched, alone = _both_ways(pods)
    assert reused == 38  # all but the first pod of each template
    assert batched == alone


def test_a_new_session_does_not_end_a_run() -> None:
    """Pods of one template, a new session every two pods: the session is scored for every decision
    (``batch_fresh``), not kept, so the run goes on, and the session's pods still go together."""
    pods = [_template_pod(f"p{i:03d}", "250m", session=f"s{i // 2}") for i in range(20)]
    reused, batched, alone = _both_ways(pods)
    assert reused == 19
    assert batched == alone
    for i in range(0, 20, 2):
        assert batched[i].node == batched[i + 1].node, f"session s{i // 2} split"


def test_batching_pauses_while_runs_are_made_more_than_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """More shapes taken in turns than runs are kept: every run is dropped before its shape comes back, so
    the walks make entries and use none. After such a window, batching pauses for ``RUN_PAUSE`` windows (no
    run made or used), then one window tries again."""
    monkeypatch.setattr(engine_module, "RUNS_KEPT", 1)
    monkeypatch.setattr(engine_module, "RUN_WINDOW", 8)
    monkeypatch.setattr(engine_module, "RUN_PAUSE", 2)
    cache, engine = _cluster()
    sizes = ("100m", "150m", "200m", "300m")  # four shapes in turns, one run kept
    pods = [_template_pod(f"p{i:03d}", sizes[i % 4]) for i in range(40)]
    made = []
    every_run: list[Any] = []  # held, so no new run can take a dropped one's id
    for pod in pods:
        _decide(cache, engine, [pod])
        new = [run for run in engine._runs.values() if all(run is not r for r in every_run)]
        every_run += new
        made.append(bool(new))
    assert made[:8] == [True] * 8  # a run made for every pod, none used
    assert made[8:24] == [False] * 16  # paused for two windows
    assert made[24:32] == [True] * 8  # tried again, and paused again
    assert made[32:] == [False] * 8
    assert engine.batched == 0


def test_batching_goes_on_while_runs_are_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shapes taken in turns that the runs kept can hold: every window uses ``RUN_REUSE`` times the entries it
    makes (the first window's included, which makes every shape's entries), so batching never pauses."""
    monkeypatch.setattr(engine_module, "RUN_WINDOW", 32)
    cache, engine = _cluster()
    sizes = ("100m", "150m", "200m", "300m")
    pods = [_template_pod(f"p{i:03d}", sizes[i % 4]) for i in range(80)]
    _decide(cache, engine, pods)
    assert engine.batched == 76  # every pod but the first of each shape


class _Kept:
    """Node-local and kept: a score of the node alone, not a short binary fraction."""

    name = "Kept"

    def batch_key(self, pod: PodRecord) -> tuple[()]:
        return ()

    def applies(self, pod: PodRecord) -> bool:
        return True

    def scores(self, pod: PodRecord, nodes: list[NodeInfo]) -> list[float]:
        return [0.1 + len(info.pods) / 3 for info in nodes]


class _Fresh(_Kept):
    """Node-local, scored for every decision."""

    name = "Fresh"
    batch_fresh = True

    def scores(self, pod: PodRecord, nodes: list[NodeInfo]) -> list[float]:
        return [0.3 * int(info.node.name[1:]) / 7 for info in nodes]


class _Window:
    """Not node-local: normalized over the window (by position)."""

    name = "Window"

    def applies(self, pod: PodRecord) -> bool:
        return True

    def scores(self, pod: PodRecord, nodes: list[NodeInfo]) -> list[float]:
        return [0.7 / (1 + j) for j in range(len(nodes))]


def test_score_sums_are_the_same_bit_for_bit_batched_or_not() -> None:
    """Every window's sums, in the fixed order (kept node-local, then ``batch_fresh``, then the others), with
    scores whose sums depend on their order: a batched sum that added them in another order would differ."""
    every: list[list[list[float] | None]] = []
    for batching in (True, False):
        cache = Cache()
        for i in range(12):
            cache.upsert_node(make_node(f"n{i}", cpu="2", memory="4Gi").record())
        engine = Engine(
            cache,
            [NodeResourcesFit(), TaintFilter()],
            [(_Window(), 3), (_Fresh(), 2), (_Kept(), 1)],  # profile order: the engine's groups reorder them
            feasible_nodes=6,
            batching=batching,
        )
        totals: list[list[float] | None] = []
        _record_totals(engine, totals)
        _decide(cache, engine, [_template_pod(f"p{i:02d}", "100m") for i in range(30)])
        assert engine.batched == (29 if batching else 0)
        every.append(totals)
    assert every[0] == every[1]


@pytest.mark.parametrize("resident", [False, True])
def test_a_node_added_again_is_not_taken_for_its_earlier_life_in_a_run(resident: bool) -> None:
    """A run's entry of a node deleted and added again, now with a taint the pods do not tolerate, is not
    used: the node is filtered again. Without pods the node comes back as a new ``NodeInfo`` (at the generation
    the entry was made at); with a pod the cache keeps its ``NodeInfo`` through the deletion, and its generation
    and static version tell the new life from the old."""
    cache = Cache()
    cache.upsert_node(make_node("n1", cpu="4", memory="8Gi").record())
    cache.upsert_node(make_node("n2", cpu="4", memory="8Gi").record())
    if resident:
        cache.assume(_template_pod("resident", "100m"), NodeName("n1"))
    engine = build_engine(WorkerSettings(), cache)
    cache.assume(_template_pod("first", "1"), NodeName("n2"))  # n2 the fuller: binpacking takes it
    pods = [_template_pod(f"p{i}", "1") for i in range(3)]
    assert [d.node for d in _decide(cache, engine, pods[:2])] == ["n2", "n2"]  # n1's entry kept, fits
    before = cache.nodes[NodeName("n1")]
    cache.remove_node(NodeName("n1"))
    tainted = make_node("n1", cpu="4", memory="8Gi")
    tainted.taint("dedicated", "batch")
    cache.upsert_node(tainted.record())
    assert (cache.nodes[NodeName("n1")] is before) == resident
    cache.assume(_template_pod("filler", "1"), NodeName("n2"))  # n2 full: only n1 is left to try
    d = engine.schedule(pods[2])
    assert engine.batched == 2
    assert d.node is None, "the tainted node was taken on the verdict of its earlier life"


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
