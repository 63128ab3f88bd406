"""The protocol-cost replay: it carries real captured pods through every step of one dispatch, checks that each
message opened is the one sealed, and prints a row per step plus the sum of the steps extra over the
standalone worker."""

from __future__ import annotations

import pytest

from common import protocol
from scale.bench import protocolcost
from scale.bench.protocolcost import STEPS, WORKER_PARSE, Replay, measure, pending_pods, table


def test_the_pods_are_one_template_renamed_without_managed_fields() -> None:
    pods = pending_pods(3)
    assert [p["metadata"]["name"] for p in pods] == ["agent-000000", "agent-000001", "agent-000002"]
    assert len({p["metadata"]["uid"] for p in pods}) == 3
    assert all("managedFields" not in p["metadata"] for p in pods)
    assert pods[0]["spec"] == pods[2]["spec"] and pods[0]["spec"] is not pods[2]["spec"]
    assert all(p["spec"].get("nodeName") is None and p["status"]["phase"] == "Pending" for p in pods)


def test_every_step_is_timed_and_the_table_sums_the_extra_ones() -> None:
    costs = measure(pods=20, rounds=1)
    assert list(costs) == list(STEPS)
    assert all(plain > 0 and profiled > 0 for plain, profiled in costs.values())
    text = table(costs)
    rows = text.splitlines()[2:]
    assert [r.split(" | ")[0].lstrip("| ") for r in rows[:-1]] == list(STEPS)
    assert rows[STEPS.index(WORKER_PARSE)].endswith("| no |")
    extra = sum(plain for name, (plain, _) in costs.items() if name != WORKER_PARSE)
    assert f"**{extra:.1f}**" in rows[-1]


def test_a_frame_that_does_not_open_as_sealed_fails_the_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    sealed = protocol.Session.seal

    def tampered(self: protocol.Session, message: protocol.Message) -> bytes:
        if isinstance(message, protocol.Ack):
            message = protocol.Ack(message.id + 1)
        return sealed(self, message)

    monkeypatch.setattr(protocol.Session, "seal", tampered)
    with pytest.raises(AssertionError, match="ACK"):
        Replay(pending_pods(2)).run()


def test_main_refuses_no_pods(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        protocolcost.main(["--pods", "0"])
    assert "at least 1" in capsys.readouterr().err


def test_a_step_too_quick_for_the_clock_has_no_ratio() -> None:
    costs = dict.fromkeys(STEPS, (0.0, 0.0))
    assert all(row.split(" | ")[3] == "–" for row in table(costs).splitlines()[2:-1])
