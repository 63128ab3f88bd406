"""Summarize bench cluster runs side by side: one row per scheduler and workload, one value per run."""
import json
import sys

runs = [json.load(open(f"{d}/results.json")) for d in sys.argv[1:]]
order = ["agent-standalone", "agent-coord-1", "agent-coord-2", "kube-scheduler-qps5000", "no-decision",
         "volcano-agent-1w", "volcano-agent-4w"]
fields = [("pods/s", "pods_per_s", "{:.0f}"), ("offered/s", "offered_per_s", "{:.0f}"),
          ("p50 ms", "p50_ms", "{:,.0f}"), ("p99 ms", "p99_ms", "{:,.0f}"),
          ("visible mean ms", "visible_mean_ms", "{:,.0f}"), ("CPU-s/1k", "cpu_s_per_1k_pods", "{:.2f}"),
          ("other host CPU-s", "host_other_cpu_s", "{:.1f}")]
for workload in ("backlog", "burst"):
    print(f"\n### {workload}\n")
    print("| scheduler | " + " | ".join(f[0] for f in fields) + " |")
    print("|---|" + "---:|" * len(fields))
    for name in order:
        cells = []
        for label, key, fmt in fields:
            vals = [next((r[key] for r in run if r["scheduler"] == name and r["workload"] == workload), None) for run in runs]
            cells.append(" / ".join("–" if v is None else fmt.format(v) for v in vals))
        print(f"| {name} | " + " | ".join(cells) + " |")
