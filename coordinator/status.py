"""``agent-scheduler status``: who leads, the shard map's epoch, and each worker's shard and load, read
straight from etcd (so it works from any machine that reaches etcd, leader or not)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any

from common.etcdkeys import KeyFamily, KeyLayout
from common.etcdkv import connect, get_prefix
from common.shardrecords import LoadReport, RecordError, ShardAssignment, ShardMapMeta, WorkerRecord
from coordinator.election import current_leader


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--etcd-endpoints", default=os.environ.get("AGENT_SCHEDULER_ETCD", "127.0.0.1:2379"))
    p.add_argument("--etcd-prefix", default="/agent-scheduler")
    p.add_argument("--json", action="store_true")


async def collect(endpoints: list[str], prefix: str) -> dict[str, Any]:
    keys = KeyLayout(prefix)
    etcd = await connect(endpoints)
    try:
        leader = await current_leader(etcd, keys)
        kvs, revision = await get_prefix(etcd, keys.root)
    finally:
        await etcd.close()
    workers: dict[str, dict[str, Any]] = {}
    epoch = 0
    for kv in kvs:
        parsed = keys.parse(kv.key)
        if parsed is None:
            continue
        family, name = parsed
        try:
            if family == KeyFamily.SHARDMAP:
                epoch = ShardMapMeta.decode(kv.value).epoch
            elif family == KeyFamily.MEMBER:
                rec = WorkerRecord.decode(kv.value)
                workers.setdefault(name, {}).update(address=rec.address, live=True, started_at=rec.started_at)
            elif family == KeyFamily.ASSIGNMENT:
                a = ShardAssignment.decode(kv.value)
                workers.setdefault(name, {}).update(
                    nodes=len(a.granted), revoking=len(a.revoking), epoch=a.epoch
                )
            elif family == KeyFamily.LOAD:
                load = LoadReport.decode(kv.value)
                workers.setdefault(name, {}).update(
                    free_cpu=load.free_milli_cpu,
                    free_memory=load.free_memory,
                    pending=load.pending_pods,
                    binds_per_s=load.binds_per_second,
                    cpu=load.process_cpu,
                    load_age=round(time.time() - load.reported_at, 1),
                )
        except RecordError as e:
            workers.setdefault(name, {}).setdefault("errors", []).append(str(e))
    return {
        "leader": leader.candidate_id if leader else None,
        "leader_address": leader.address if leader else None,
        "epoch": epoch,
        "revision": revision,
        "workers": workers,
    }


def render(status: dict[str, Any]) -> str:
    lines = [
        f"leader: {status['leader'] or '(none)'}   epoch: {status['epoch']}   etcd revision: {status['revision']}"
    ]
    lines.append(
        f"{'worker':<28} {'live':<5} {'nodes':>6} {'revoking':>8} {'free cpu':>10} {'free mem':>10} {'pending':>8} {'binds/s':>8} {'cpu':>5}"
    )
    for wid, w in sorted(status["workers"].items()):
        lines.append(
            f"{wid:<28} {'yes' if w.get('live') else 'no':<5} {w.get('nodes', 0):>6} {w.get('revoking', 0):>8} "
            f"{w.get('free_cpu', 0) / 1000:>9.1f}c {w.get('free_memory', 0) / 2**30:>8.1f}Gi {w.get('pending', 0):>8} "
            f"{w.get('binds_per_s', 0.0):>8.1f} {w.get('cpu', 0.0):>5.2f}"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    status = asyncio.run(
        collect([e.strip() for e in args.etcd_endpoints.split(",") if e.strip()], args.etcd_prefix)
    )
    print(json.dumps(status, indent=2) if args.json else render(status))
    return 0
