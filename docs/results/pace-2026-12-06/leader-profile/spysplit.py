"""Split py-spy raw (collapsed) samples by thread and by the outermost project function under the event loop."""
import collections, re, sys
PROJ = ("common/", "coordinator/", "worker/", "agent_scheduler/")
for path in sys.argv[1:]:
    threads = collections.Counter(); top = collections.Counter(); leafmod = collections.Counter(); total = 0
    for line in open(path):
        line = line.rstrip("\n")
        if not line: continue
        stack, _, n = line.rpartition(" ")
        n = int(n); total += n
        frames = stack.split(";")
        thread = frames[1] if frames[0].startswith("thread (") and len(frames) > 1 else frames[0]
        is_main = any("uvloop" in f or "asyncio" in f or "run (agent_scheduler" in f or "main (" in f for f in frames[:6])
        threads["main" if is_main else re.sub(r"0x[0-9a-f]+", "", thread)] += n
        if not is_main: continue
        proj = [f for f in frames if any(p in f for p in PROJ)]
        # outermost project frame below the command's own coroutine: skip agent_scheduler/cli and *command.py frames
        inner = [f for f in proj if "cli.py" not in f and "command.py" not in f and "aiotools.py" not in f]
        if inner:
            key = inner[0] + (" > " + inner[1] if len(inner) > 1 and "watching.py" in inner[0] else "")
        else:
            below = frames[frames.index(next(f for f in frames if "Runner.run" in f)) + 1:] if any("Runner.run" in f for f in frames) else []
            key = "(no project frame) " + (below[0] if below else "the loop itself")
        top[re.sub(r":\d+\)", ")", key)] += n
        if inner:
            leafmod[re.sub(r":\d+\)", ")", inner[-1])] += n
    print(f"== {path}: {total} samples")
    for k, v in threads.most_common(8): print(f"  thread {k[:60]:60s} {v:6d} {100*v/total:5.1f} %")
    main = threads.get("main", 0) or 1
    print("  main thread, outermost project frame:")
    for k, v in top.most_common(14): print(f"    {k[:100]:100s} {v:6d} {100*v/main:5.1f} %")
    print("  main thread, innermost project frame:")
    for k, v in leafmod.most_common(14): print(f"    {k[:100]:100s} {v:6d} {100*v/main:5.1f} %")
