import subprocess, sys, re, os
F = 1999
GC = re.compile(r"gc_collect|visit_decref|visit_reachable|_traverse$|subtract_refs|move_unreachable|update_refs|deduce_unreachable|move_legacy|gc_list|untrack_dicts|handle_legacy|finalize_garbage|delete_garbage|validate_list")
for p in sys.argv[1:]:
    out = subprocess.run(["perf", "report", "-i", p, "--stdio", "--sort", "sym", "-F", "sample,sym", "--no-children"], capture_output=True, text=True).stdout
    tot = gcs = 0
    for line in out.splitlines():
        m = re.match(r"\s*(\d+)\s+\[.\]\s+(\S+)", line) or re.match(r"\s*(\d+)\s+\[k\]\s+(\S+)", line)
        if not m: continue
        n = int(m.group(1)); tot += n
        if GC.search(m.group(2)): gcs += n
    print(f"{os.path.basename(p):45} total {tot/F:6.3f} CPU-s  gc {gcs/F:6.3f} ({100*gcs/max(tot,1):4.1f} %)")
