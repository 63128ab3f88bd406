"""The ``free-capacity`` selector: an agent shard sized by the free CPU it keeps, not by a node count."""

from __future__ import annotations

from typing import Any

import pytest

from coordinator.nodeshards.policy import PolicyConfigError
from tests.unit.nodeshards.policy._policy_builders import band, node, policy, scheduler


def free(cores: float) -> dict[str, Any]:
    return {"name": "free-capacity", "arguments": {"minFreeCPU": cores}}


def test_keeps_the_fewest_busiest_nodes_whose_free_cpu_reaches_the_target() -> None:
    # 10-core nodes; busiest first: a (90 %, 1 core free), b (60 %, 4), c (30 %, 7), d (0 %, 10)
    p = policy(
        scheduler("agent", "agent", band(0.0, 0.95), free(6)),
        scheduler("batch", "volcano", band(0.0, 1.0)),
    )
    nodes = [node("a", 0.9), node("b", 0.6), node("c", 0.3), node("d", 0.0), node("full", 1.0)]
    result = p.evaluate(nodes)
    assert result.desired["agent"] == ("a", "b", "c")  # 1 + 4 < 6, so c too (1 + 4 + 7 >= 6)
    assert result.desired["batch"] == ("d", "full")


def test_a_target_the_nodes_cannot_reach_keeps_every_eligible_node() -> None:
    p = policy(scheduler("agent", "agent", band(0.0, 0.95), free(100)))
    assert p.evaluate([node("a", 0.5), node("b", 0.2), node("full", 1.0)]).desired["agent"] == ("a", "b")


def test_idle_incumbents_beyond_the_target_go_back_to_batch() -> None:
    # the agent held all three; agents left b and c idle: the target is met by a and b, c is released
    p = policy(
        scheduler("agent", "agent", band(0.0, 0.95), free(6)),
        scheduler("batch", "volcano", band(0.0, 1.0)),
        rank_hysteresis=0.3,
    )
    nodes = [node("a", 0.5, holder="agent"), node("b", 0.0, holder="agent"), node("c", 0.0, holder="agent")]
    result = p.evaluate(nodes)
    assert result.desired["agent"] == ("a", "b")
    assert [(m.node, m.target) for m in result.moves] == [("c", "batch")]


@pytest.mark.parametrize("args", [{}, {"minFreeCPU": 0}, {"minFreeCPU": -1}, {"minFreeCPU": 2, "x": 1}])
def test_bad_arguments_are_refused(args: dict[str, Any]) -> None:
    with pytest.raises(PolicyConfigError):
        policy(scheduler("agent", "agent", {"name": "free-capacity", "arguments": args}))


def test_arguments_round_trip_in_cores() -> None:
    p = policy(scheduler("agent", "agent", free(2.5)))
    entry = p.sharding.schedulers[0].policies[0]
    assert entry.to_dict()["arguments"] == {"minFreeCPU": 2.5}
    assert "free CPU >= 2.5" in p.summary()


def _split(name: str, agent_milli: int, batch_milli: int, holder: str) -> Any:
    from dataclasses import replace

    n = node(name, (agent_milli + batch_milli) / 10_000, holder=holder)
    return replace(n, requested_by={k: v for k, v in (("agent", agent_milli), ("batch", batch_milli)) if v})


def test_reclaim_counts_other_schedulers_pods_as_capacity_that_comes_back() -> None:
    # every node full under a batch backlog: without reclaim no free CPU is ever found; with it the agent
    # keeps its own busy node and takes just enough full batch nodes for the target
    def reclaiming(on: bool) -> Any:
        args: dict[str, Any] = {"minFreeCPU": 12, "reclaim": True} if on else {"minFreeCPU": 12}
        return policy(
            scheduler("agent", "agent", band(0.0, 1.0), {"name": "free-capacity", "arguments": args}),
            scheduler("batch", "volcano", band(0.0, 1.0)),
            rank_hysteresis=1.0,
        )

    nodes = [
        _split("a", 6000, 4000, "agent"),  # the agent's own pods use 6 of 10 cores; batch pods still draining
        _split("b", 0, 10_000, "batch"),
        _split("c", 0, 10_000, "batch"),
        _split("d", 0, 10_000, "batch"),
    ]
    assert reclaiming(True).evaluate(nodes).desired["agent"] == ("a", "b")  # 4 + 10 >= 12
    assert reclaiming(False).evaluate(nodes).desired["agent"] == ("a", "b", "c", "d")  # 0 free: never reached
    assert "reclaiming" in reclaiming(True).summary()


def test_reclaim_must_be_a_boolean() -> None:
    with pytest.raises(PolicyConfigError):
        policy(
            scheduler(
                "agent", "agent", {"name": "free-capacity", "arguments": {"minFreeCPU": 1, "reclaim": 2}}
            )
        )


def test_reclaim_keeps_drained_nodes_before_draining_ones() -> None:
    # the agent holds b (its batch pods drained) and a, c (batch pods still draining, so busier and ranked
    # first): the target needs two nodes; the drained b is kept, never handed back for a draining one
    p = policy(
        scheduler(
            "agent",
            "agent",
            band(0.0, 1.0),
            {"name": "free-capacity", "arguments": {"minFreeCPU": 14, "reclaim": True}},
        ),
        scheduler("batch", "volcano", band(0.0, 1.0)),
        rank_hysteresis=1.0,
    )
    nodes = [
        _split("a", 2000, 8000, "agent"),
        _split("b", 2000, 0, "agent"),
        _split("c", 0, 9000, "agent"),
    ]
    result = p.evaluate(nodes)
    assert result.desired["agent"] == ("a", "b")  # b (8 free now) then a (8 once drained): 16 >= 14
    assert [(m.node, m.target) for m in result.moves] == [("c", "batch")]
