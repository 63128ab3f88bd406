"""The decision engine: one pod in, one node (or a kube-scheduler-shaped explanation) out.

How a decision is made, and why it is fast:
1. Candidates come from the capacity index (``worker.index``) in the order of the profile's allocation
   strategy, plus the nodes already hosting the pod's session; pods asking for an extended resource (a GPU)
   look only at nodes that have it. No per-cycle copy of the cache is made.
2. Static filters (labels, taints, readiness) are evaluated once per (pod signature, node) and cached until
   that node's record changes, so a burst of identical agent pods pays for them once per node.
3. Dynamic filters (resources, host ports) run on each candidate; the walk stops after
   ``feasible_nodes`` feasible nodes (like kube-scheduler's percentage of nodes to score). A dynamic filter
   with an ``applies(pod)`` method (the inter-pod rules) runs only for the pods it applies to, so plain pods
   do not pay for it, and one with ``passes_every_node(pod)`` (NodePorts) is left out of the walk of a pod it
   says that of (a pod without host ports); plugins with an ``attach(cache)`` method are given the cache
   once, here.
4. Score plugins that apply to the pod score those candidates; weighted sum (the plugins' lists chained and added in C,
   one list made at the end: ``_accumulate``); highest wins, ties by order.
   A score plugin with a ``widen(pod, window)`` method (ImageLocality) names images no node of the window
   holds; the engine then adds up to ``EXTRA_NODES`` feasible holders of them (the cache's ``ImageHolders``,
   in the index's order, from where the walk stopped on), evaluating at most ``feasible_nodes`` more nodes,
   so the score can pick a node that has the image. Extras come after the window, so ties still go to the
   walk's order; a decision stays O(window), never O(nodes).
5. Plugins with a ``prefilter(pod)`` method (the volume plugins: a missing claim, an unbound Immediate one)
   can refuse the pod before any node is looked at, as kube-scheduler's PreFilter does.
6. Only when no candidate is feasible does the engine scan every owned node, to count the reasons for the
   failure message. The explanation is memoized per pod shape while the cache does not change, so a burst of
   pods that cannot fit does not rescan the cluster per pod. When the cache did change (a stream of
   preemptors changes it with every nomination and every victim gone), the scan still reuses each node's
   verdict for the shape while that node is unchanged (same ``NodeInfo``, generation and static version, and
   no pod nominated to it): only the nodes that changed are filtered again. Not for pods with inter-pod rules
   or claims, whose verdicts depend on more than their node.

Batched decisions (kube-scheduler 1.35's opportunistic batching, done exactly, and across interleaved shapes):
pods of one shape reuse what the earlier decisions of their shape found, on every node that has not changed
since. A pod is batchable when no ``applies`` filter applies to it (no inter-pod rule, no claim), nothing is
nominated anywhere and it has no nomination of its own; its shape is its signature, its requests and the
``batch_key`` of each kept node-local score plugin (``worker.framework``). Each shape has a run: per node that
passes the static filters, the verdict of the dynamic filters and the kept node-local part of the score, each
valid while the node's ``NodeInfo`` (the same object, at the same ``generation``) and static version are the
same. Assuming a pod (``Cache.assume``) changes one node, so the next pod of the shape filters and scores only
that node again. (A node deleted and added again gets a static version it never had, and a new ``NodeInfo``
unless pods kept its old one through the deletion, whose generation then moved.)
- Interleaved shapes: up to ``RUNS_KEPT`` runs are kept (the one made first goes first), each of at most
  ``RUN_NODES_KEPT`` nodes (a full run that is to take another node starts over), so a burst that interleaves
  a few templates (a queue ordered by priority and arrival hands them out so) keeps every template's run,
  where kube-scheduler's batch ends at the first pod of another shape.
- Batching pays only while run entries are used several times for each one made. When more shapes interleave
  than are kept (runs dropped before they are used again), or placements change most window nodes between two
  pods of a shape (a spreading strategy with many shapes, pods with soft inter-pod rules), a window of
  ``RUN_WINDOW`` batchable decisions that used fewer than ``RUN_REUSE`` entries per entry it made pauses
  batching for ``RUN_PAUSE`` windows (every pod decided from scratch, with nothing recorded); then one window
  tries again (``_tally``).
- Node-local plugins marked ``batch_fresh`` (SessionLocality: its key, the session, changes every few pods
  and its score is one lookup) are left out of the shape and scored for every decision, so sessions do not
  split a template into shapes.
- The walk of the index, ``usable``, ``widen``, the ``batch_fresh`` plugins and the plugins without
  ``batch_key`` (window-normalized scores) run as for any pod.
- Scores are summed kept node-local plugins first, then the ``batch_fresh`` ones, then the others, for every
  decision, so a kept part and a fresh one add up to the same float: a batched decision equals the one made
  from scratch (``tests/unit/worker/test_batching.py`` compares them).

Nominated pods (kube-scheduler's RunFilterPluginsWithNominatedPods): on a node to which pending pods of equal
or higher priority are nominated (``Cache.nominated``), the dynamic filters run first with those pods counted
there, then, if that passes, without them (a nominated pod that is not bound yet must not satisfy an affinity
either). A pod with a nomination of its own is tried on that node first and goes there if it fits, as
kube-scheduler does. Nodes without nominations pay one dict lookup for this.

The engine never mutates the cache: assuming the result is the caller's job (``worker.scheduler``). A
successful ``Decision`` is immutable and one object serves every success with the same node, evaluated and
feasible counts (at most ``SUCCEEDED_KEPT`` kept).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import chain, repeat
from operator import add, mul
from typing import Any, cast

from common.protocol import Candidate
from common.records import NodeName, PodRecord
from common.reporting import unschedulable_message
from worker.cache import Cache
from worker.framework import Code, FilterPlugin, NodeLocalScore, ScorePlugin, Status
from worker.nodeinfo import NodeInfo
from worker.volumes import VolumePlan

DEFAULT_FEASIBLE_NODES = 16
SUCCEEDED_KEPT = 4096  # successful Decisions kept for reuse before the memo starts over
EXTRA_NODES = 4  # feasible holders of a pod's image added to a window that has none (step 4 above)
NODE_VERDICT_SHAPES = 16  # pod shapes whose per-node scan verdicts are kept (each holds one entry per node)
RUNS_KEPT = 128  # batch runs kept, one per pod shape (the oldest made goes first)
RUN_NODES_KEPT = 512  # nodes one run keeps: a full run that is to take another node starts over
RUN_WINDOW = 2048  # batchable decisions per window of ``Engine._tally``
RUN_REUSE = 3  # run entries a window must use per entry it makes for batching to go on (measured to pay)
RUN_PAUSE = 32  # windows with batching paused after one that used fewer
STATIC_SIGNATURES_KEPT = 4096  # pod signatures whose static verdicts are kept before the memo starts over
MEMO_SLACK = 64  # a per-node memo drops the nodes gone once it holds more than 2 x the cache's nodes + this
_SKIPPED = object()  # a node-local score plugin that does not apply to the pod, in a batch's shape

# A batch's memory, per node name: [NodeInfo, its generation, its static version, fits the shape, the kept
# node-local part of its score (None until the node is scored)]; an entry is used only while the first three
# are current.
_Run = dict[str, list[Any]]


def _drop_gone(memo: dict[str, Any], nodes: Mapping[NodeName, NodeInfo]) -> None:
    """Drop from a per-node memo the nodes the cache no longer has. Called when the memo holds more than
    twice the cache's nodes (plus ``MEMO_SLACK``), so a cluster whose node names change (autoscaling) does not
    grow it without bound, at O(1) amortized per entry."""
    for name in [name for name in memo if name not in nodes]:
        del memo[name]


@dataclass(frozen=True, slots=True)
class Decision:
    node: NodeName | None
    code: Code
    message: str
    evaluated: int = 0
    feasible: int = 0
    index_hit: bool = True  # False when the index walk found nothing and a full scan ran
    # For failures: how many nodes were considered and how many failed for each reason (a coordinator sums
    # these over shards into one cluster-wide message).
    nodes: int = 0
    reasons: tuple[tuple[str, int], ...] = ()
    # Under a coordinator: the shard's best preemption candidate, for the leader to choose among shards
    # (``worker.preemption.Preemption.propose``); nothing was nominated or evicted for it.
    preemption: Candidate | None = None

    @property
    def ok(self) -> bool:
        return self.node is not None


def _accumulate(totals: Iterable[float] | None, weight: int, scores: list[float], n: int) -> Iterator[float]:
    """``totals`` plus ``weight`` times ``scores``, element by element, lazily (None: no totals yet); the
    caller makes a list of the last one. The same float operations, in the same order, as ``[t + weight * s
    for t, s in zip(totals, scores)]`` one plugin after another: ``1 * s`` is ``s`` exactly, so a weight of 1
    skips the multiplication, and the chained ``map``s run in C without a list per plugin. A plugin's list is
    read only when the caller makes its list, so the caller does that before it calls that plugin again."""
    if len(scores) != n:
        raise ValueError(f"a score plugin gave {len(scores)} scores for {n} nodes")
    weighted: Iterable[float] = scores if weight == 1 else map(mul, repeat(weight), scores)
    return iter(weighted) if totals is None else map(add, totals, weighted)


class Engine:
    def __init__(
        self,
        cache: Cache,
        filters: list[FilterPlugin],
        scores: list[tuple[ScorePlugin, int]],
        *,
        feasible_nodes: int = DEFAULT_FEASIBLE_NODES,
        session_label: str = "",
        batching: bool = True,
    ) -> None:
        if feasible_nodes < 1:
            raise ValueError("feasible_nodes must be at least 1")
        self.cache = cache
        self.static_filters = [f for f in filters if f.static]
        self.dynamic_filters = [f for f in filters if not f.static]
        self._always = [f for f in self.dynamic_filters if not hasattr(f, "applies")]
        # the walk's per-node checks of ``_always``, bound once; a filter with ``passes_every_node(pod)`` is left
        # out of a decision for which it says so (NodePorts for a pod without host ports)
        self._always_checks: list[tuple[Callable[[PodRecord, NodeInfo], Status | None], Any]] = [
            (f.filter, getattr(f, "passes_every_node", None)) for f in self._always
        ]
        self._sometimes = [f for f in self.dynamic_filters if hasattr(f, "applies")]
        # kube's PreFilter verdicts (a verdict for the pod, before any node): only plugins with ``applies``
        self._prefilters: dict[FilterPlugin, Callable[[PodRecord], Status | None]] = {
            f: f.prefilter for f in self._sometimes if hasattr(f, "prefilter")
        }
        self._planners = [f for f in self._sometimes if hasattr(f, "plan")]
        for plugin in [*filters, *(p for p, _ in scores)]:
            attach = getattr(plugin, "attach", None)
            if attach is not None:
                attach(cache)
        self.scores = scores
        # node-local score plugins (``batch_key``): their part of a node's score is kept within a batch, except
        # for the ``batch_fresh`` ones, scored for every decision after the kept ones (the order of every sum)
        local = [(cast(NodeLocalScore, p), w) for p, w in scores if hasattr(p, "batch_key")]
        self._kept = [(p, w) for p, w in local if not getattr(p, "batch_fresh", False)]
        self._fresh = [(p, w) for p, w in local if getattr(p, "batch_fresh", False)]
        self._kept_plugins = [p for p, _ in self._kept]
        self._global = [(p, w) for p, w in scores if not hasattr(p, "batch_key")]
        # batched decisions (see the module docstring): shape -> (the shape's signature, its run), oldest first
        self._runs: dict[tuple[Any, ...], tuple[tuple[Any, ...], _Run]] = {}
        self._window_seen = 0  # batchable decisions in the current window (``_tally``)
        self._window_hits = 0  # nodes of their walks whose run entry was current
        self._window_made = 0  # run entries their walks made
        self._runs_paused = 0  # windows left with batching paused
        self.batched = 0  # decisions that reused what earlier decisions of their run found
        self.batching = batching  # False: every decision from scratch (what a batch must equal)
        self._wideners = [p for p, weight in scores if weight > 0 and hasattr(p, "widen")]
        self.feasible_nodes = feasible_nodes
        self.session_label = session_label
        # signature -> node -> (static version, verdict)
        self._static: dict[tuple[Any, ...], dict[str, tuple[int, Status | None]]] = {}
        # (signature, request shape) -> (cache generation, node count, decision)
        self._explained: dict[tuple[Any, ...], tuple[int, int, Decision]] = {}
        # the same shape -> node -> (its NodeInfo, generation, static version, verdict) from the latest scans
        self._node_verdicts: dict[tuple[Any, ...], dict[str, tuple[NodeInfo, int, int, Status | None]]] = {}
        self.full_scans = 0
        # (node, evaluated, feasible) -> the successful Decision with those values (see ``schedule``)
        self._succeeded: dict[tuple[str, int, int], Decision] = {}
        # the per-node verdicts of the latest full scan that found no node: (pod, cache generation, topology
        # version, [(node, verdict)] in the order of the cache's nodes); preemption's first step reads them
        # instead of scanning again when nothing changed in between (``scan_of``)
        self.last_scan: tuple[PodRecord, int, int, list[tuple[NodeInfo, Status]]] | None = None

    def _static_memo(self, signature: tuple[Any, ...]) -> dict[str, tuple[int, Status | None]]:
        """The static verdicts kept for pods of ``signature`` (the memo of all signatures starts over at
        ``STATIC_SIGNATURES_KEPT``)."""
        memo = self._static.get(signature)
        if memo is None:
            if len(self._static) >= STATIC_SIGNATURES_KEPT:
                self._static.clear()
            memo = self._static[signature] = {}
        return memo

    def _static_verdict(
        self, pod: PodRecord, info: NodeInfo, memo: dict[str, tuple[int, Status | None]]
    ) -> Status | None:
        name = info.node.name
        version = self.cache.static_versions.get(NodeName(name), 0)
        entry = memo.get(name)
        if entry is not None and entry[0] == version:
            return entry[1]
        if entry is None and len(memo) > 2 * len(self.cache.nodes) + MEMO_SLACK:
            _drop_gone(memo, self.cache.nodes)
        verdict: Status | None = None
        for f in self.static_filters:
            verdict = f.filter(pod, info)
            if verdict is not None:
                break
        if version:  # a node the cache has (a gone one's records would all share version 0)
            memo[name] = (version, verdict)
        return verdict

    def schedule(self, pod: PodRecord) -> Decision:
        if pod.parse_error is not None:
            return Decision(None, Code.UNRESOLVABLE, pod.parse_error, index_hit=False)
        dynamic = self._always
        checks = [check for check, skip in self._always_checks if skip is None or not skip(pod)]
        for f in self._sometimes:
            if f.applies(pod):
                # in ``_sometimes``' order, so the first refusal is the one kube's PreFilter gives
                prefilter = self._prefilters.get(f)
                if prefilter is not None:
                    refused = prefilter(pod)
                    if refused is not None:
                        return self._refused(pod, refused)
                dynamic = [*dynamic, f]
                checks.append(f.filter)
        memo = self._static_memo(pod.signature)
        # No await in a decision: the granted and syncing sets cannot change before it returns; the lease's health
        # is as at this line (the binder reads it again before each binding attempt)
        usable = self.cache.usable_now()
        want = self.feasible_nodes
        feasible: list[NodeInfo] = []
        evaluated = 0
        seen: set[str] | None = None
        candidates: Iterable[NodeInfo]
        if pod.requests.scalar:
            # Few nodes have extended resources (GPUs): walk only those instead of the CPU index.
            candidates = self.cache.scalar_candidates(min(pod.requests.scalar))
        else:
            candidates = self.cache.index.candidates(pod.requests.milli_cpu)
        # The session's nodes are walked first (``leading`` of them), then the index without them.
        leading = 0
        if self.session_label:
            session = pod.labels.get(self.session_label)
            if session:
                first = self.cache.session_nodes(session)
                if first:
                    seen = {i.node.name for i in first}
                    leading = len(first)
                    candidates = chain(first, candidates)
        nominated = self.cache.nominated
        mine = pod.nominated_node or self.cache.nominated_node.get(pod.key)
        if mine:
            info = self.cache.nodes.get(NodeName(mine))
            if info is not None and usable(info.node.name) and self.verdict(pod, info) is None:
                return Decision(NodeName(mine), Code.SUCCESS, "", 1, 1)
        run = (
            self._run_for(pod)
            if self.batching and dynamic is self._always and not nominated and not mine
            else None
        )
        static_versions = self.cache.static_versions
        # batched: the run's entry of each node of ``feasible`` made or checked by the walk, in its order
        entries: list[list[Any]] = []
        hits = made = 0  # batched: nodes whose entry was current, and entries made
        for info in candidates:
            name = info.node.name
            if leading:
                leading -= 1
            elif seen is not None and name in seen:
                continue
            evaluated += 1
            if run is not None:
                # batched: this node's verdict for the shape, unless the node changed since it was made
                known = run.get(name)
                if (
                    known is not None
                    and known[0] is info
                    and known[1] == info.generation
                    and known[2] == static_versions.get(name, 0)
                ):
                    hits += 1
                    if known[3] and usable(name):
                        feasible.append(info)
                        entries.append(known)
                        if len(feasible) >= want:
                            break
                    continue
            # ``_static_verdict``, its memo hit inlined: this loop is the hot path
            entry = memo.get(name)
            if entry is not None and entry[0] == static_versions.get(name, 0):
                if entry[1] is not None:
                    continue
            elif self._static_verdict(pod, info, memo) is not None:
                continue
            # a run keeps the nodes that pass the static filters only: the others are the memo's already
            if nominated and name in nominated:
                ok = self._dynamic_verdict(pod, info) is None
            else:
                for check in checks:
                    if check(pod, info) is not None:
                        ok = False
                        break
                else:
                    ok = True
            if run is not None:
                if len(run) >= RUN_NODES_KEPT and name not in run:
                    run.clear()  # a full run starts over with the nodes walked now
                made_entry = run[name] = [info, info.generation, static_versions.get(name, 0), ok, None]
                made += 1
            if ok and usable(name):
                feasible.append(info)
                if run is not None:
                    entries.append(made_entry)
                if len(feasible) >= want:
                    break
        if run is not None:
            self._tally(hits, made)
        if not feasible:
            return self._explain(pod, inter_pod=dynamic is not self._always)
        if len(feasible) >= want and self._wideners and not pod.requests.scalar:
            # The walk stopped early, so there may be nodes beyond it that hold the pod's images.
            evaluated += self._widen(pod, feasible, memo, dynamic, after=seen is None)
        best = (
            feasible[0]
            if len(feasible) == 1
            else self._best(pod, feasible, entries if run is not None else None)
        )
        # A Decision is immutable, and successes repeat (binpacking sends pod after pod to one node with the
        # same counts), so one object per (node, evaluated, feasible) serves them all: building one costs more
        # than the lookup.
        key = (best.node.name, evaluated, len(feasible))
        decision = self._succeeded.get(key)
        if decision is None:
            if len(self._succeeded) >= SUCCEEDED_KEPT:
                self._succeeded.clear()
            decision = self._succeeded[key] = Decision(
                NodeName(best.node.name), Code.SUCCESS, "", evaluated, len(feasible)
            )
        return decision

    def _widen(
        self,
        pod: PodRecord,
        feasible: list[NodeInfo],
        memo: dict[str, tuple[int, Status | None]],
        dynamic: list[FilterPlugin],
        *,
        after: bool,
    ) -> int:
        """Append feasible holders of the images the wideners name to ``feasible``; the nodes evaluated.
        ``after``: the window's last node is where the index walk stopped, so holders before it were seen."""
        cache = self.cache
        index = cache.index
        images: list[str] = []
        for p in self._wideners:
            if p.applies(pod):
                images += p.widen(pod, feasible)
        if not images:
            return 0
        start = index.bucket(feasible[-1].node.name) if after else None
        window = {i.node.name for i in feasible}
        nominated = cache.nominated
        usable = cache.usable_now()
        budget = self.feasible_nodes
        added = 0
        evaluated = 0
        for image in images:
            for info in cache.image_holders.candidates(
                image, pod.requests.milli_cpu, ascending=index.ascending, after=start
            ):
                name = info.node.name
                if name in window:
                    continue
                if evaluated >= budget:
                    return evaluated
                evaluated += 1
                if self._static_verdict(pod, info, memo) is not None:
                    continue
                if nominated and name in nominated:
                    if self._dynamic_verdict(pod, info) is not None:
                        continue
                elif any(f.filter(pod, info) is not None for f in dynamic):
                    continue
                if not usable(name):
                    continue
                feasible.append(info)
                window.add(name)
                added += 1
                if added >= EXTRA_NODES:
                    return evaluated
        return evaluated

    def _refused(self, pod: PodRecord, status: Status) -> Decision:
        """A PreFilter verdict: kube-scheduler's "0/N nodes are available: <reason>." for every node."""
        usable = self.cache.usable_now()
        n = sum(1 for name in self.cache.nodes if name in self.cache.known and usable(name))
        reason = "; ".join(status.reasons)
        return Decision(
            None,
            status.code,
            f"0/{n} nodes are available: {reason}.",
            n,
            0,
            index_hit=False,
            nodes=n,
            reasons=((reason, n),),
        )

    def volume_plan(self, pod: PodRecord, node: NodeName) -> VolumePlan | None:
        """What placing ``pod`` on ``node`` needs done to its claims first (None: nothing)."""
        for p in self._planners:
            plan: VolumePlan | None = p.plan(pod, node)
            if plan is not None:
                return plan
        return None

    def _run_for(self, pod: PodRecord) -> _Run | None:
        """The run of ``pod``'s shape: the one its earlier pods made, or a new one; None while batching is
        paused (see ``_tally``). Called only for pods no ``applies`` filter applies to, with no nomination
        anywhere in the cache."""
        if self._runs_paused:
            self._tally(0, 0)
            return None
        shape = self._shape(pod)
        runs = self._runs
        found = runs.get(shape)
        if found is not None:
            self.batched += 1
            return found[1]
        if len(runs) >= RUNS_KEPT:
            del runs[next(iter(runs))]  # the one made first
        found = runs[shape] = (pod.signature, {})
        return found[1]

    def _tally(self, hits: int, made: int) -> None:
        """Counts, over windows of ``RUN_WINDOW`` batchable decisions, the nodes whose run entry was current
        (``hits``) against the entries made. A window that used fewer than ``RUN_REUSE`` per entry it made
        (more shapes interleaved than ``RUNS_KEPT``, so runs are dropped before they are used again; or
        placements that change most window nodes between two pods of a shape, as spreading strategies do)
        pauses batching for ``RUN_PAUSE`` windows, in which every pod is decided from scratch, without
        recording; then one window tries again."""
        self._window_seen += 1
        self._window_hits += hits
        self._window_made += made
        if self._window_seen < RUN_WINDOW:
            return
        if self._runs_paused:
            self._runs_paused -= 1
        elif self._window_hits < RUN_REUSE * self._window_made:
            self._runs_paused = RUN_PAUSE
        self._window_seen = self._window_hits = self._window_made = 0

    def _shape(self, pod: PodRecord) -> tuple[Any, ...]:
        """What decides a batchable pod's verdicts and kept node-local scores on a node that has not changed:
        its signature and requests (the filters'), and each kept node-local score plugin's ``batch_key`` (see
        the module docstring). The signature is in it by identity (pods of one template share one signature
        object, ``common.records.shared``), so the key hashes in O(1): its run holds the signature, so no
        other object has that identity while the run is kept, and an equal signature that is another object
        only starts a run of its own."""
        r = pod.requests
        return (
            id(pod.signature),
            r.milli_cpu,
            r.memory,
            r.ephemeral_storage,
            tuple(sorted(r.scalar.items())) if r.scalar else (),
            tuple([p.batch_key(pod) if p.applies(pod) else _SKIPPED for p in self._kept_plugins]),
        )

    def _best(
        self, pod: PodRecord, feasible: list[NodeInfo], entries: list[list[Any]] | None = None
    ) -> NodeInfo:
        """The feasible node with the highest weighted score (the first of them); see ``_totals``."""
        totals = self._totals(pod, feasible, entries)
        return feasible[0] if totals is None else feasible[totals.index(max(totals))]

    def _totals(
        self, pod: PodRecord, feasible: list[NodeInfo], entries: list[list[Any]] | None = None
    ) -> list[float] | None:
        """Each feasible node's weighted score (None: no score plugin applies). ``entries``, batched: the run's
        entries of the first nodes of ``feasible``, checked current by the walk (nodes added by ``_widen`` have
        none)."""
        # The weighted sum per node: the kept node-local plugins first, then the ``batch_fresh`` ones, then the
        # others, each group in profile order. The order is fixed so the float sums are the same, bit for bit,
        # whether a node's kept part was computed now or kept from an earlier decision of its shape.
        kept = [(p, w) for p, w in self._kept if p.applies(pod)]
        totals: list[float] | None = None
        if entries is None:
            totals = self._local_totals(pod, feasible, kept)
        elif kept:
            known: list[float | None] = [entry[4] for entry in entries]
            known += [None] * (len(feasible) - len(entries))
            if None in known:
                missing = [j for j, total in enumerate(known) if total is None]
                computed = self._local_totals(pod, [feasible[j] for j in missing], kept)
                assert computed is not None
                for j, total in zip(missing, computed, strict=True):
                    known[j] = total
                    if j < len(entries):
                        entries[j][4] = total
            totals = cast(list[float], known)
        summed: Iterable[float] | None = totals
        for fresh, weight in self._fresh:
            if fresh.applies(pod):
                summed = _accumulate(summed, weight, fresh.scores(pod, feasible), len(feasible))
        for plugin, weight in self._global:
            if plugin.applies(pod):
                summed = _accumulate(summed, weight, plugin.scores(pod, feasible), len(feasible))
        return None if summed is None else list(summed)

    @staticmethod
    def _local_totals(
        pod: PodRecord, nodes: list[NodeInfo], local: list[tuple[NodeLocalScore, int]]
    ) -> list[float] | None:
        totals: Iterable[float] | None = None
        for plugin, weight in local:
            totals = _accumulate(totals, weight, plugin.scores(pod, nodes), len(nodes))
        return None if totals is None else list(totals)

    def filter_all(self, pod: PodRecord, info: NodeInfo) -> Status | None:
        """Every filter, in profile order (static first); used for explanations and audits."""
        for f in self.static_filters:
            st = f.filter(pod, info)
            if st is not None:
                return st
        for f in self.dynamic_filters:
            st = f.filter(pod, info)
            if st is not None:
                return st
        return None

    def scan_of(self, pod: PodRecord) -> list[tuple[NodeInfo, Status]] | None:
        """Every usable node's verdict for ``pod`` (this very record) from the full scan that just found no node
        for it, if the cache has not changed since; else None."""
        scan = self.last_scan
        if (
            scan is None
            or scan[0] is not pod
            or scan[1] != self.cache.generation
            or scan[2] != self.cache.topology.version
        ):
            return None
        return scan[3]

    def static_verdict(self, pod: PodRecord, info: NodeInfo) -> Status | None:
        """The static filters alone for ``pod`` on ``info`` (memoized per signature), as ``verdict`` runs them."""
        memo = self._static_memo(pod.signature)
        return self._static_verdict(pod, info, memo)

    def verdict(self, pod: PodRecord, info: NodeInfo) -> Status | None:
        """Every filter for ``pod`` on ``info`` as the decision runs them: static (memoized per signature),
        then dynamic with the node's nominated pods (see the module docstring). None when it fits."""
        memo = self._static_memo(pod.signature)
        st = self._static_verdict(pod, info, memo)
        return st if st is not None else self._dynamic_verdict(pod, info)

    def _dynamic_verdict(self, pod: PodRecord, info: NodeInfo) -> Status | None:
        cache = self.cache
        nominated = cache.nominated_for(pod, NodeName(info.node.name)) if cache.nominated else []
        if nominated:
            for p in nominated:
                cache.put_back(info, p)
            try:
                st = self._dynamic_only(pod, info)
            finally:
                for p in nominated:
                    cache.set_aside(info, p)
            if st is not None:
                return st
        return self._dynamic_only(pod, info)

    def _dynamic_only(self, pod: PodRecord, info: NodeInfo) -> Status | None:
        # Every dynamic filter, ``applies`` or not: a filter that does not apply passes anyway, and what it
        # applies to may differ while pods are counted or set aside (nominated pods, preemption dry runs).
        for f in self.dynamic_filters:
            st = f.filter(pod, info)
            if st is not None:
                return st
        return None

    def _explain(self, pod: PodRecord, *, inter_pod: bool = False) -> Decision:
        r = pod.requests
        shape: tuple[Any, ...] = (
            pod.signature,
            r.milli_cpu,
            r.memory,
            r.ephemeral_storage,
            tuple(sorted(r.scalar.items())),
        )
        if inter_pod:
            # the verdicts also depend on the pod's labels and on every placed pod
            shape += (
                pod.namespace,
                tuple(sorted(pod.labels.items())),
                pod.inter_pod,
                self.cache.topology.version,
                self.cache.workloads.version,  # default spread constraints: their selector may change
            )
        # a node's verdict depends on the nominated pods only where they are: the per-node memo keys on the
        # shape without them, and never keeps a verdict for a node with a nominated pod
        node_shape = shape
        if self.cache.nominated:
            # verdicts then depend on which nominated pods this pod must leave room for
            shape += (pod.priority, pod.key if pod.key in self.cache.nominated_node else None)
        if pod.claims:
            # the volume filters' verdicts depend on the pod's claims and the storage objects
            shape += (pod.namespace, pod.name, pod.claims, self.cache.volumes.version)
        usable = self.cache.usable_now()
        owned = [info for name, info in self.cache.nodes.items() if name in self.cache.known and usable(name)]
        cached = self._explained.get(shape)
        if cached is not None and cached[0] == self.cache.generation and cached[1] == len(owned):
            return cached[2]
        self.full_scans += 1
        reasons: Counter[str] = Counter()
        resolvable = False
        placeable: NodeInfo | None = None
        verdicts: list[tuple[NodeInfo, Status]] = []
        # pods whose verdicts depend on more than their node get a memo of their own scan only (all misses)
        kept: dict[str, tuple[NodeInfo, int, int, Status | None]] = {}
        if not inter_pod and not pod.claims:
            if node_shape not in self._node_verdicts and len(self._node_verdicts) >= NODE_VERDICT_SHAPES:
                self._node_verdicts.clear()
            kept = self._node_verdicts.setdefault(node_shape, kept)
            if len(kept) > 2 * len(self.cache.nodes) + MEMO_SLACK:
                _drop_gone(kept, self.cache.nodes)
        static_versions = self.cache.static_versions
        nominated = self.cache.nominated
        for info in owned:
            name = info.node.name
            known = kept.get(name)
            version = static_versions.get(name, 0)
            if (
                known is not None
                and known[0] is info
                and known[1] == info.generation
                and known[2] == version
                and not (nominated and name in nominated)
            ):
                st = known[3]
            else:
                st = self.verdict(pod, info)
                kept[name] = (info, info.generation, version, st)
            if st is None:
                placeable = info  # the index missed it (should not happen); use it rather than fail
                break
            verdicts.append((info, st))
            if st.code != Code.UNRESOLVABLE:
                resolvable = True
            for reason in st.reasons:
                reasons[reason] += 1
        if placeable is not None:
            return Decision(NodeName(placeable.node.name), Code.SUCCESS, "", len(owned), 1, index_hit=False)
        message = unschedulable_message(len(owned), dict(reasons))
        code = Code.UNSCHEDULABLE if resolvable else Code.UNRESOLVABLE
        decision = Decision(
            None,
            code,
            message,
            len(owned),
            0,
            index_hit=False,
            nodes=len(owned),
            reasons=tuple(sorted(reasons.items())),
        )
        self._explained[shape] = (self.cache.generation, len(owned), decision)
        self.last_scan = (pod, self.cache.generation, self.cache.topology.version, verdicts)
        if len(self._explained) > 4096:
            self._explained.clear()
        return decision
