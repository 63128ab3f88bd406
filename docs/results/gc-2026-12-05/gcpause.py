"""How long the cyclic GC's collections take in a worker-sized heap: 5,000 nodes, N bound pods in the cache
(the real Cache, records parsed from the workload generator's pods), plus the imports a worker makes."""
import gc, sys, time, copy
import worker.command, coordinator.command  # the imports a process makes  # noqa
from common.records import node_from_json, pod_from_json
from scale.cluster.nodes import generate_nodes
from scale.workload import agent_pod
from worker.cache import Cache
nodes = int(sys.argv[1]); pods = int(sys.argv[2])
if len(sys.argv) > 3:
    print("objects after the imports", len(gc.get_objects())); gc.freeze()
gc.disable()
cache = Cache(session_label="agents.x-k8s.io/session")
names = []
for obj in generate_nodes(nodes, seed=0):
    r = node_from_json(obj); cache.upsert_node(r); names.append(r.name)
objs = []
for i in range(pods):
    o = agent_pod(i, mix=False, seed=0)
    o["spec"]["nodeName"] = names[i % len(names)]
    o.setdefault("status", {})["phase"] = "Running"
    objs.append(o)  # the raw objects are dropped below: a worker keeps records, not objects
for o in objs:
    cache.upsert_pod(pod_from_json(o))
del objs
gc.enable()
def t(gen):
    best = 1e9
    for _ in range(3):
        s = time.perf_counter(); gc.collect(gen); best = min(best, time.perf_counter() - s)
    return best * 1000
print(f"nodes {nodes} pods {pods} gc-tracked objects {len(gc.get_objects())}")
print(f"  full collection (gen 2): {t(2):.1f} ms; gen 1: {t(1):.2f} ms; gen 0: {t(0):.3f} ms")
gc.freeze()
print(f"  after gc.freeze(): full collection {t(2):.2f} ms (frozen {gc.get_freeze_count()})")
