"""Engine decisions with the coordinated shard (ShardState, lease health behind a lambda and a property) against
the standalone's WholeCluster: CPU µs per pod, alternating. Usage: python usablecost.py NODES PODS ROUNDS"""
import gc, sys, time
from scale.bench import engine as eb
from worker import cache as wc
from worker.shard import ShardState, WholeCluster
from common.records import NodeName

class Keeper:  # LeaseKeeper.healthy's shape: a property on the keeper's state and clock
    def __init__(self):
        self._state = 1; self._clock = time.monotonic; self._last_ok = time.monotonic(); self._fence_after = 1e9
    @property
    def healthy(self):
        return self._state == 1 and self._clock() - self._last_ok < self._fence_after

orig = wc.Cache.__init__
MODE = {"shard": "whole"}
def init(self, *a, **k):
    if MODE["shard"] == "state":
        keeper = Keeper()
        st = ShardState(name="w", healthy=lambda: keeper.healthy, ack=None)
        k["shard"] = st
        self._bench_state = st
    orig(self, *a, **k)
wc.Cache.__init__ = init
eb.Cache = wc.Cache
orig_upsert = wc.Cache.upsert_node
def upsert(self, node):
    st = getattr(self, "_bench_state", None)
    if st is not None and node.name not in st._granted:
        st._granted = st._granted | {node.name}
        st._published = st._granted
        for cb in list(st._listeners):
            from worker.shard import ShardChange
            cb(ShardChange(frozenset({node.name}), frozenset(), 0))
    return orig_upsert(self, node)
wc.Cache.upsert_node = upsert

nodes, pods, rounds = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
for r in range(rounds):
    for mode in (("whole", "state") if r % 2 == 0 else ("state", "whole")):
        MODE["shard"] = mode
        res = eb.run_engine_bench(nodes, pods, mix="plain")
        print(mode, res.placed, res.pods_per_s, res.cpu_us_per_pod, res.nodes_evaluated_mean, flush=True)
