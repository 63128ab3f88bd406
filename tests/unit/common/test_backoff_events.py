"""The shared backoff and the one Event builder."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from common.backoff import Backoff, api_retry, etcd_retry
from common.events import WARNING, ObjectRef, event_body, parse_rfc3339, rfc3339


def test_backoff_doubles_to_the_cap_and_resets() -> None:
    b = Backoff(0.5, 3.0)
    assert b.fresh
    assert [b.next() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert not b.fresh
    b.reset()
    assert b.fresh and b.next() == 0.5


def test_backoff_presets_and_bad_arguments() -> None:
    assert (api_retry().initial, api_retry().maximum) == (0.2, 10.0)
    assert (etcd_retry().initial, etcd_retry().maximum) == (0.2, 2.0)
    with pytest.raises(ValueError):
        Backoff(0, 1)
    with pytest.raises(ValueError):
        Backoff(2, 1)
    with pytest.raises(ValueError):
        Backoff(1, 2, factor=0.5)


def test_rfc3339_round_trip_in_utc() -> None:
    moment = datetime(2026, 1, 15, 17, 0, 0, tzinfo=timezone(timedelta(hours=1)))
    assert rfc3339(moment) == "2026-01-15T16:00:00Z"
    assert parse_rfc3339("2026-01-15T16:00:00Z") == datetime(2026, 1, 15, 16, tzinfo=UTC)
    with pytest.raises(ValueError):
        rfc3339(datetime(2026, 1, 1))  # naive
    with pytest.raises(ValueError):
        parse_rfc3339("2026-01-15T16:00:00")


def test_event_body_names_the_object_and_cuts_long_messages() -> None:
    ref = ObjectRef.pod("ns", "p", "uid-1")
    body = event_body(
        ref, type_=WARNING, reason="FailedScheduling", message="x" * 5000, component="c", instance="i"
    )
    assert body["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "ns",
        "name": "p",
        "uid": "uid-1",
    }
    assert body["metadata"]["name"].startswith("p.") and body["metadata"]["namespace"] == "ns"
    assert len(body["message"]) == 1024 and body["type"] == "Warning"
    assert body["firstTimestamp"] == body["lastTimestamp"]
    other = event_body(ref, type_=WARNING, reason="r", message="m", component="c", instance="i")
    assert other["metadata"]["name"] != body["metadata"]["name"]
