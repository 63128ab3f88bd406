"""Follow a bench paired log; at each burst start scrape python_gc_collections_total from every scheduler
process's /metrics, and again WINDOW s later; print the differences per generation."""
import os, sys, time, re, urllib.request
log = sys.argv[1]; window = float(sys.argv[2]) if len(sys.argv) > 2 else 8
def procs():
    r = {}
    for p in os.listdir("/proc"):
        if not p.isdigit(): continue
        try: args = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
        except OSError: continue
        s = b" ".join(args)
        if b"agent_scheduler.cli" in s and (b" worker" in s or b" coordinator" in s):
            addr = next((a.split(b"=", 1)[1].decode() for a in args if a.startswith(b"--metrics-address=")), None)
            role = "coord" if b"coordinator" in s else ("sa" if b"--standalone" in s else "worker")
            if addr: r[int(p)] = (role, addr)
    return r
def scrape(addr):
    try:
        text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=2).read().decode()
    except Exception as e:
        return None
    return {m.group(1): float(m.group(2)) for m in re.finditer(r'python_gc_collections_total\{generation="(\d)"\} ([\d.e+]+)', text)}
seen = 0; trial = 0
while True:
    try: lines = open(log).read().splitlines()
    except OSError: lines = []
    new = lines[seen:]; seen = len(lines)
    for line in new:
        if " × burst × " in line and "pods" in line:
            trial += 1
            ps = procs(); before = {p: scrape(a) for p, (r, a) in ps.items()}
            time.sleep(window)
            for p, (r, a) in ps.items():
                after = scrape(a); b = before[p]
                if after and b:
                    print(f"trial {trial} {r} {p}: gen0 {after['0']-b['0']:.0f} gen1 {after['1']-b['1']:.0f} gen2 {after['2']-b['2']:.0f} (totals {after})", flush=True)
        if "trials in" in line and "summary in" in line:
            sys.exit(0)
    time.sleep(0.2)
