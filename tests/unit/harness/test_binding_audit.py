"""The integration harness's binding audit (``tests.integration.test_coordinator``) on hand-made trails: an
overlap hidden behind a neighbour is found, and a proxy's answer lowers only its own worker's binding end."""

from __future__ import annotations

from typing import Any

from tests.integration.test_coordinator import applied_bounds, overlapping


def trail(pod: str, node: str, worker: str, assumed_at: float, bound_at: float) -> dict[str, Any]:
    return {"pod": pod, "node": node, "worker": worker, "assumed_at": assumed_at, "bound_at": bound_at}


def test_a_span_covering_its_neighbours_is_compared_with_every_later_one() -> None:
    # w2's long span [0, 10] covers w1's [5, 6]; w2's short [1, 2] sits between them in start order
    trails = [trail("a", "n1", "w2", 0, 10), trail("b", "n1", "w2", 1, 2), trail("c", "n1", "w1", 5, 6)]
    assert overlapping(trails) == ["n1: w2 bound until 10, w1 assumed at 5"]


def test_spans_that_touch_or_are_on_other_nodes_do_not_overlap() -> None:
    trails = [
        trail("a", "n1", "w2", 0, 2),
        trail("b", "n1", "w1", 2, 3),  # starts as the other ends
        trail("c", "n2", "w2", 0, 9),
        trail("d", "n3", "w1", 1, 2),
    ]
    assert overlapping(trails) == []


def test_a_proxied_answer_lowers_only_its_workers_binding_on_its_node() -> None:
    trails = [
        trail("ns/a", "n1", "w2", 0, 8),
        trail("ns/b", "n1", "w1", 5, 6),
        trail("ns/c", "n2", "w2", 0, 8),
    ]
    answered = {("ns/a", "n1"): 1.0, ("ns/b", "n1"): 0.5, ("ns/c", "n9"): 0.5, ("ns/x", "n1"): 0.1}
    lowered = applied_bounds(trails, "w2", answered)
    assert [t["bound_at"] for t in lowered] == [1.0, 6, 8]  # w1's and the other node's stay as read
    assert overlapping(lowered) == [] and overlapping(trails) == ["n1: w2 bound until 8, w1 assumed at 5"]
    assert applied_bounds(trails, "w2", {("ns/a", "n1"): 9.0})[0]["bound_at"] == 8  # never raised
