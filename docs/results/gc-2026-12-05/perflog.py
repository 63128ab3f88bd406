"""Attach perf to every scheduler process for DURATION s when the bench log announces a burst."""
import os, sys, time, subprocess
log = sys.argv[1]; outdir = sys.argv[2]; duration = sys.argv[3] if len(sys.argv) > 3 else "10"
os.makedirs(outdir, exist_ok=True)
def procs():
    r = {}
    for p in os.listdir("/proc"):
        if not p.isdigit(): continue
        try: s = b" ".join(open(f"/proc/{p}/cmdline", "rb").read().split(b"\0"))
        except OSError: continue
        if b"agent_scheduler.cli" in s and (b" worker" in s or b" coordinator" in s):
            tag = "coord" if b"coordinator" in s else ("sa" if b"--standalone" in s else "worker")
            try:
                tag += "-" + os.path.basename(os.readlink(f"/proc/{p}/cwd"))
            except OSError: pass
            r[int(p)] = tag
    return r
seen = 0; trial = 0
while True:
    try: lines = open(log).read().splitlines()
    except OSError: lines = []
    new = lines[seen:]; seen = len(lines)
    for line in new:
        if " × burst × " in line and "pods" in line:
            trial += 1
            label = line.split(" INFO scale.bench.cluster ")[-1].split(" × ")[0]
            for pid, role in procs().items():
                subprocess.Popen(["perf", "record", "-F", "1999", "-p", str(pid), "-o", f"{outdir}/t{trial}-{label}-{role}-{pid}.data",
                                  "--", "sleep", duration], stdout=subprocess.DEVNULL, stderr=open(f"{outdir}/{pid}.log", "w"))
            print(time.time(), "trial", trial, label, procs(), flush=True)
        if "trials in" in line and "summary in" in line:
            sys.exit(0)
    time.sleep(0.2)
