"""Benchmarks: ``engine`` (the decision engine in-process), ``cluster`` (scale runs on the local cluster) and
``simulate`` (shard assignment and engine at sizes beyond this machine)."""
