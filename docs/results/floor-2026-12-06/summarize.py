"""Means per label of a floor.py run's trials.json: CPU-s per 1,000 pods (min-max), × the standalone's mean,
per process, sleeps per pod, p50/p99 ms.  Usage: python summarize.py TRIALS_JSON"""
import json, sys, statistics as st
trials = [t for t in json.load(open(sys.argv[1])) if t["label"] != "warm-up"]
labels = list(dict.fromkeys(t["label"] for t in trials))
by = {l: [t["result"] for t in trials if t["label"] == l] for l in labels}
sa = st.mean(r["cpu_s_per_1k_pods"] for r in by["sa"]) if "sa" in by else None
print("| label | trials | CPU-s/1k pods mean (min-max) | × sa | by process (means) | sleeps/pod | p50 / p99 ms | bound |")
print("|---|---|---|---|---|---|---|---|")
for l, rs in by.items():
    c = [r["cpu_s_per_1k_pods"] for r in rs]
    procs = {}
    for r in rs:
        for k, v in r["cpu_s_per_1k_pods_by_process"].items():
            procs.setdefault(k, []).append(v)
    sl = {}
    for r in rs:
        for k, v in (r.get("main_sleeps_per_pod_by_process") or {}).items():
            sl.setdefault(k, []).append(v)
    print(f"| {l} | {len(rs)} | {st.mean(c):.3f} ({min(c):.3f}-{max(c):.3f}) | {st.mean(c)/sa:.2f} | "
          + ", ".join(f"{k} {st.mean(v):.3f}" for k, v in procs.items()) + " | "
          + ", ".join(f"{st.mean(v):.2f}" for v in sl.values()) + f" | {st.mean(r['p50_ms'] for r in rs):.0f} / {st.mean(r['p99_ms'] for r in rs):.0f} | "
          + ", ".join(str(r["bound"]) for r in rs) + " |")
