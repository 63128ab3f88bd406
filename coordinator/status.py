"""``agent-scheduler status``: who leads, the shard map's epoch, each worker's shard and load, and the shard
policy in force, read straight from etcd (so it works from any machine that reaches etcd, leader or not)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import time
from typing import Any

from common.etcd.flags import add_security_arguments, endpoints_from, security_from
from common.etcd.keys import KeyFamily, KeyLayout
from common.etcd.kv import (
    ETCD_FAILURES,
    EtcdConfigError,
    EtcdSecurity,
    connect,
    describe,
    get_prefix,
    wait_ready,
)
from common.etcd.schema import LoadReport, RecordError, ShardAssignment, ShardMapMeta, WorkerRecord
from common.wellknown import DEFAULT_ETCD_PREFIX
from coordinator.leadership.election import current_leader
from coordinator.nodeshards import PolicyRecord, PolicyRecordError, policy_key


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--etcd-endpoints", default=os.environ.get("AGENT_SCHEDULER_ETCD", "127.0.0.1:2379"))
    p.add_argument("--etcd-prefix", default=DEFAULT_ETCD_PREFIX)
    p.add_argument("--json", action="store_true")
    add_security_arguments(p)


async def collect(endpoints: list[str], prefix: str, security: EtcdSecurity | None = None) -> dict[str, Any]:
    keys = KeyLayout(prefix)
    etcd = await connect(endpoints, security, probe_key=keys.root)
    try:
        await wait_ready(etcd, security, probe_key=keys.root, attempts=1)
        leader = await current_leader(etcd, keys)
        kvs, revision = await get_prefix(etcd, keys.root)
    finally:
        await etcd.close()
    workers: dict[str, dict[str, Any]] = {}
    epoch = 0
    policy: dict[str, Any] | None = None
    for kv in kvs:
        if kv.key == policy_key(keys):
            try:
                policy = dataclasses.asdict(PolicyRecord.decode(kv.value))
            except PolicyRecordError as e:
                policy = {"error": str(e)}
            continue
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
                    usable=load.usable_nodes,
                )
        except RecordError as e:
            workers.setdefault(name, {}).setdefault("errors", []).append(str(e))
    return {
        "leader": leader.candidate_id if leader else None,
        "leader_address": leader.address if leader else None,
        "epoch": epoch,
        "revision": revision,
        "workers": workers,
        "policy": policy,
    }


def render(status: dict[str, Any]) -> str:
    lines = [
        f"leader: {status['leader'] or '(none)'}   epoch: {status['epoch']}   etcd revision: {status['revision']}"
    ]
    lines.append(
        f"{'worker':<28} {'live':<5} {'nodes':>6} {'usable':>6} {'revoking':>8} {'free cpu':>10} {'free mem':>10} {'pending':>8} {'binds/s':>8} {'cpu':>5}"
    )
    for wid, w in sorted(status["workers"].items()):
        lines.append(
            f"{wid:<28} {'yes' if w.get('live') else 'no':<5} {w.get('nodes', 0):>6} {w.get('usable', 0):>6} {w.get('revoking', 0):>8} "
            f"{w.get('free_cpu', 0) / 1000:>9.1f}c {w.get('free_memory', 0) / 2**30:>8.1f}Gi {w.get('pending', 0):>8} "
            f"{w.get('binds_per_s', 0.0):>8.1f} {w.get('cpu', 0.0):>5.2f}"
        )
    lines += _render_policy(status.get("policy"))
    return "\n".join(lines)


def _render_policy(p: dict[str, Any] | None) -> list[str]:
    if p is None:
        return ["shard policy: (not published)"]
    if "error" in p:
        return [f"shard policy: {p['error']}"]
    present = "present" if p["configmap_present"] else "absent"
    head = f"shard policy: {p['mode']} (configmap {p['configmap']} {present}; from {p['origin']})"
    lines = [head]
    if p["mode"] != "policy" and p.get("rebalance"):
        lines.append(f"  workers: {p['rebalance']}")  # in policy mode the summary says it
    if p["mode"] == "policy":
        lines += p["summary"].splitlines()
        sizes = ", ".join(f"{name} {n}" for name, n in p["desired"].items())
        lines.append(
            f"  shards: {sizes}; {p['agent_shard']}: {p['in_use']} in use, {p['pool']} in pool, "
            f"{p['waiting']} waiting for another shard, {p['deferred']} moves deferred"
            + ("" if p["nodeshards"] else " (NodeShard CRD not installed)")
        )
    if p["last_rejected"]:
        lines.append(f"  last edit rejected: {p['last_rejected']}")
    return lines


def run(args: argparse.Namespace) -> int:
    try:
        status = asyncio.run(collect(endpoints_from(args), args.etcd_prefix, security_from(args)))
    except EtcdConfigError as e:
        print(f"agent-scheduler status: {e}", file=sys.stderr)
        return 2
    except ETCD_FAILURES as e:
        print(f"agent-scheduler status: etcd: {describe(e)}", file=sys.stderr)
        return 1
    print(json.dumps(status, indent=2) if args.json else render(status))
    return 0
