"""``agent-scheduler status`` rendering: the shard policy and the worker rebalancing actually in force."""

from __future__ import annotations

import dataclasses
from typing import Any

from coordinator.nodeshards import PolicyRecord
from coordinator.nodeshards.policy import default_policy
from coordinator.status import render
from coordinator.workershards.assignment import AssignmentConfig


def status(policy: PolicyRecord | None) -> dict[str, Any]:
    return {
        "leader": "c1",
        "epoch": 3,
        "revision": 42,
        "workers": {},
        "policy": dataclasses.asdict(policy) if policy is not None else None,
    }


def test_policy_mode_shows_the_summary_with_the_rebalancing_and_no_process_settings() -> None:
    policy = default_policy()
    text = render(
        status(
            PolicyRecord(
                mode="policy",
                version=policy.version,
                summary=policy.summary(),
                origin="built-in default",
                configmap="volcano-system/volcano-sharding-configmap",
                agent_shard="agent-scheduler",
                desired={"volcano": 2, "agent-scheduler": 3},
                rebalance=AssignmentConfig().describe(),
            )
        )
    )
    assert f"policy {policy.version}" in text
    assert (
        text.count(
            "workers: rebalance when skew > 0.25 until <= 0.1, at most max(32, 10% of the pool) nodes in transit"
        )
        == 1
    )
    assert "lease" not in text and "capacity report" not in text and "candidates" not in text


def test_label_pool_mode_shows_the_rebalancing_in_force() -> None:
    config = AssignmentConfig(skew_threshold=0.5, settle_skew=0.2, max_moves_per_round=4)
    text = render(status(PolicyRecord(mode="label-pool", origin="none", rebalance=config.describe())))
    assert "shard policy: label-pool" in text
    assert (
        "  workers: rebalance when skew > 0.5 until <= 0.2, at most max(4, 10% of the pool) nodes in transit"
        in text
    )
    assert render(status(None)).endswith("shard policy: (not published)")


def test_a_worker_row_shows_its_granted_and_usable_nodes() -> None:
    """A worker catching up on granted nodes shows fewer usable than granted (here 40 of 275)."""
    s = status(None)
    s["workers"] = {"w1": {"live": True, "nodes": 275, "usable": 40, "revoking": 0, "free_cpu": 8000}}
    header, row = render(s).splitlines()[1:3]
    assert header.split()[:5] == ["worker", "live", "nodes", "usable", "revoking"]
    assert row.split()[:5] == ["w1", "yes", "275", "40", "0"]
