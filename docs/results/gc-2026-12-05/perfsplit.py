"""Split perf samples of each data file by shared object category; print CPU-s (samples / F) per category."""
import subprocess, sys, collections, re, os
F = 1999
CATS = [
    ("kernel", lambda d: d.startswith("[kernel") or d == "[unknown]" and False),
    ("python interpreter", lambda d: "libpython" in d or d == "python3.11" or d.endswith("/python")),
    ("TLS (libssl/libcrypto)", lambda d: "libssl" in d or "libcrypto" in d),
    ("uvloop/libuv", lambda d: "uvloop" in d or "loop.cpython" in d),
    ("aiohttp C", lambda d: "aiohttp" in d or "_http_parser" in d or "_websocket" in d or "multidict" in d or "yarl" in d or "propcache" in d or "frozenlist" in d),
    ("json (orjson/_json)", lambda d: "orjson" in d or "_json" in d),
    ("msgpack", lambda d: "msgpack" in d or "_cmsgpack" in d),
    ("libc", lambda d: "libc.so" in d or "libc-" in d or "libm" in d),
    ("grpc", lambda d: "grpc" in d or "cygrpc" in d),
    ("hashlib/_hashlib", lambda d: "_hashlib" in d or "hmac" in d),
]
def cat(d):
    for name, f in CATS:
        if f(d): return name
    return "other: " + os.path.basename(d)
def split(path):
    out = subprocess.run(["perf", "report", "-i", path, "--stdio", "--sort", "dso", "-F", "sample,dso", "--no-children"],
                         capture_output=True, text=True).stdout
    c = collections.Counter()
    for line in out.splitlines():
        line = line.strip()
        if not line or line.startswith("#"): continue
        m = re.match(r"(\d+)\s+(.*)$", line)
        if m: c[cat(m.group(2).strip())] += int(m.group(1))
    return c
def syms(path, n=25):
    out = subprocess.run(["perf", "report", "-i", path, "--stdio", "--sort", "dso,sym", "-F", "overhead,sample,dso,sym", "--no-children"],
                         capture_output=True, text=True).stdout
    return "\n".join(l for l in out.splitlines() if l.strip() and not l.startswith("#"))[:4000]
if __name__ == "__main__":
    paths = sys.argv[1:]
    data = {p: split(p) for p in paths}
    keys = collections.Counter()
    for c in data.values():
        for k, v in c.items(): keys[k] += v
    names = [os.path.basename(p).replace(".data", "") for p in paths]
    print(f"{'CPU-s in the window':28}" + "".join(f"{n:>16}" for n in names))
    print(f"{'total':28}" + "".join(f"{sum(data[p].values())/F:16.3f}" for p in paths))
    for k, _ in keys.most_common():
        print(f"{k[:28]:28}" + "".join(f"{data[p][k]/F:16.3f}" for p in paths))
