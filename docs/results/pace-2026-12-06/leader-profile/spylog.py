"""Attach py-spy to the coordinator for DURATION s when the bench log announces a burst.

The process finder and the log follower are gc-2026-12-05/perflog.py's (ad hoc scripts kept as they ran);
run with the interpreter whose environment has py-spy (`pip install py-spy`)."""
import os, sys, time, subprocess
log, outdir, duration = sys.argv[1], sys.argv[2], sys.argv[3]
spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
os.makedirs(outdir, exist_ok=True)
def procs():
    r = {}
    for p in os.listdir("/proc"):
        if not p.isdigit(): continue
        try: s = b" ".join(open(f"/proc/{p}/cmdline", "rb").read().split(b"\0"))
        except OSError: continue
        if b"agent_scheduler.cli" in s and (b" worker" in s or b" coordinator" in s):
            tag = "coord" if b"coordinator" in s else ("sa" if b"--standalone" in s else "worker")
            try: tag += "-" + os.path.basename(os.readlink(f"/proc/{p}/cwd"))
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
            for pid, role in procs().items():
                if not role.startswith("coord"): continue
                subprocess.Popen([spy, "record", "--pid", str(pid), "--duration", duration, "--rate", "250", "--nonblocking",
                                  "--threads", "--format", "raw", "-o", f"{outdir}/t{trial}-{role}-{pid}.txt"],
                                 stdout=subprocess.DEVNULL, stderr=open(f"{outdir}/{pid}.log", "w"))
            print(time.time(), "trial", trial, procs(), flush=True)
        if "trials in" in line and "summary in" in line:
            sys.exit(0)
    time.sleep(0.2)
