"""Progress signals of a leader term, the coordinator's probes built on them, and the health server's answers."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import aiohttp

from common import metrics
from coordinator.command import Probes
from coordinator.leadership.progress import WATCH_RETRY_WINDOW, Progress, advancing, reflector_healthy


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_counter_that_stops_moving_stalls_after_its_bound() -> None:
    clock, rounds = Clock(), [0]
    progress = Progress(clock)
    progress.add("rounds", advancing(lambda: rounds[0]), bound=10)
    for _ in range(20):  # a round a second: never stalled
        clock.now += 1
        rounds[0] += 1
        assert progress.stalled() is None
    clock.now += 10
    assert progress.stalled() is None  # exactly the bound: not yet
    clock.now += 1
    assert progress.stalled() == "rounds made no progress for 11 s"
    rounds[0] += 1
    assert progress.stalled() is None


def test_a_signal_gets_a_full_bound_to_come_up() -> None:
    clock = Clock()
    progress = Progress(clock)
    clock.now = 100
    progress.add("late", lambda: False, bound=5)
    clock.now = 105
    assert progress.stalled() is None
    clock.now = 106
    assert progress.stalled() is not None


def reflector(**kw: Any) -> Any:
    r = SimpleNamespace(reconnects=0, events=0, resource_version="1", synced=asyncio.Event())
    r.__dict__.update(kw)
    return r


def test_a_quiet_connected_watch_is_idle_not_stuck() -> None:
    r, clock = reflector(), Clock()
    probe = reflector_healthy(r, clock=clock)
    assert not probe()  # not listed yet
    r.synced.set()
    assert probe() and probe()  # nothing happens, nothing fails: fine


def test_a_watch_failing_again_and_again_is_stuck_even_between_attempts() -> None:
    r, clock = reflector(), Clock()
    r.synced.set()
    probe = reflector_healthy(r, clock=clock)
    for _ in range(5):  # a failure every 10 s (the reflector's longest backoff), asked every second
        r.reconnects += 1
        for _ in range(10):
            assert not probe()
            clock.now += 1
    r.events += 1  # the stream works again
    assert probe()


def test_one_blip_on_a_quiet_watch_heals_after_the_retry_window() -> None:
    r, clock = reflector(), Clock()
    r.synced.set()
    probe = reflector_healthy(r, clock=clock)
    r.reconnects += 1
    assert not probe()
    clock.now += WATCH_RETRY_WINDOW + 1
    assert probe()


class Election:
    def __init__(self) -> None:
        self.term: Any = None
        self.standing_by = False


def test_readiness_is_leading_with_progress_or_a_healthy_standby() -> None:
    election = Election()
    client = SimpleNamespace(auth=SimpleNamespace(healthy=lambda: True))
    probes = Probes(election, client, progress_bound=10)  # type: ignore[arg-type]
    assert isinstance(probes.ready(), str)  # neither
    election.standing_by = True
    assert probes.ready() is True
    clock = Clock()
    election.term = SimpleNamespace(progress=Progress(clock))
    election.term.progress.add("rounds", lambda: False, bound=10)
    assert probes.ready() is True and probes.healthy() is True
    clock.now = 11
    assert "rounds made no progress" in str(probes.ready())
    assert probes.healthy() is True  # it will step down; not yet a reason to restart
    clock.now = 31
    assert "without progress" in str(probes.healthy())


def test_health_fails_when_the_campaign_ended_or_credentials_are_refused() -> None:
    election = Election()
    refused: list[bool | str] = [True]
    client = SimpleNamespace(auth=SimpleNamespace(healthy=lambda: refused[0]))
    probes = Probes(election, client, progress_bound=10)  # type: ignore[arg-type]
    assert probes.healthy() is True
    refused[0] = "API credentials refused (HTTP 401) for 31 s"
    assert probes.healthy() == refused[0]
    refused[0] = True
    probes.campaign = SimpleNamespace(done=lambda: True)  # type: ignore[assignment]
    assert probes.healthy() == "the campaign has ended"


async def test_the_health_server_answers_503_with_the_reason() -> None:
    state: dict[str, bool | str] = {"ready": True, "healthy": "wedged"}
    runner = await metrics.serve("127.0.0.1", 0, lambda: state["ready"], lambda: state["healthy"])
    try:
        base = f"http://{metrics.addresses(runner)[0]}"
        async with aiohttp.ClientSession() as session:
            async with session.get(base + "/readyz") as resp:
                assert (resp.status, await resp.text()) == (200, "ok")
            async with session.get(base + "/healthz") as resp:
                assert (resp.status, await resp.text()) == (503, "wedged")
            state["ready"] = False
            async with session.get(base + "/readyz") as resp:
                assert (resp.status, await resp.text()) == (503, "not ready")
    finally:
        await runner.cleanup()
