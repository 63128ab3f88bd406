"""``PolicyRecord``: the policy report the leader publishes in etcd for ``agent-scheduler status``."""

from __future__ import annotations

import pytest

from coordinator.nodeshards import PolicyRecord, PolicyRecordError


def test_policy_record_round_trip() -> None:
    rec = PolicyRecord(mode="policy", version="abc", desired={"agent": 2})
    assert PolicyRecord.decode(rec.encode()) == rec
    with pytest.raises(PolicyRecordError):
        PolicyRecord.decode(b"[1]")


# ---- the handoff, against a fake API server ----
