"""Locating and building Volcano's agent-scheduler, and the process meter (``scale.bench.volcano``, ``scale.bench.meter``)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from scale.bench import meter as meter_module
from scale.bench.meter import ProcessMeter, own_pid, with_children
from scale.bench.volcano import (
    BINARY_ENV,
    build_checkout,
    given,
    locate,
    newest_supported,
    replace_directives,
)

GOMOD = """module volcano.sh/volcano

go 1.24.0

require (
\tk8s.io/api v0.34.1
)

replace (
\tk8s.io/api => k8s.io/api v0.34.1 // pinned
\tk8s.io/kubernetes => k8s.io/kubernetes v1.34.1
)

replace github.com/x/y v1.0.0 => ../y
"""


def test_replace_directives_block_and_single_line() -> None:
    assert replace_directives(GOMOD) == [
        "replace k8s.io/api => k8s.io/api v0.34.1",
        "replace k8s.io/kubernetes => k8s.io/kubernetes v1.34.1",
        "replace github.com/x/y v1.0.0 => ../y",
    ]


def test_newest_supported_release() -> None:
    assert newest_supported(["v1.12.0", "v1.14.0", "v1.14.2", "v1.15.0-rc.1", "v1.9.9"]) == "v1.14.2"
    assert newest_supported(["v1.13.1"]) is None


async def test_meter_charges_cpu_to_the_group() -> None:
    meter = ProcessMeter({"me": own_pid, "nobody": list}, period=0.05)
    meter.start()
    end = time.process_time() + 0.2
    while time.process_time() < end:
        pass
    usage = await meter.stop()
    assert usage["me"].cpu_s >= 0.15
    # the busy loop ran on the main thread: all but a sliver of the process's CPU is the main thread's
    main = usage["me"].main_by_pid[os.getpid()]
    assert 0.15 <= main <= usage["me"].by_pid[os.getpid()] + 0.02
    assert usage["me"].peak_rss_bytes > 0 and usage["me"].processes == 1
    assert usage["nobody"].cpu_s == 0 and usage["nobody"].processes == 0
    assert meter.host_cpu_s >= 0.15
    assert with_children([os.getpid()])[0] == os.getpid()


async def test_a_stepped_clock_does_not_count_a_process_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    # psutil's create_time() adds the boot time, which /proc/stat derives from the wall clock: step it at every
    # read. Identified by that, this process looked new at each sample and was charged its whole life's CPU.
    import psutil._pslinux as pslinux

    boot = pslinux.boot_time()
    steps = iter(range(1, 1_000_000))
    monkeypatch.setattr(pslinux, "boot_time", lambda: boot + next(steps))
    end = time.process_time() + 0.5  # CPU used before the window must not be charged to it
    while time.process_time() < end:
        pass
    meter = ProcessMeter({"me": own_pid}, period=0.02)
    meter.start()
    await asyncio.sleep(0.1)
    usage = await meter.stop()
    assert usage["me"].processes == 1
    assert usage["me"].cpu_s < 0.4


def test_a_given_binary_is_used_when_it_answers_version(tmp_path: Path) -> None:
    binary = tmp_path / "vc-agent"
    binary.write_text("#!/bin/sh\necho 'API Version: v1alpha1'\necho 'Version: v1.14.0-dev'\n")
    binary.chmod(0o755)
    found = locate(tmp_path / "out", binary=str(binary))
    assert found.built and found.binary == str(binary.resolve())
    assert found.version == "v1.14.0-dev"
    assert "given binary" in found.reason


def test_a_missing_binary_or_a_directory_without_the_command_is_refused_with_the_reason(
    tmp_path: Path,
) -> None:
    missing = given(str(tmp_path / "nothing"))
    assert not missing.built and "not an executable file" in missing.reason
    not_volcano = build_checkout(tmp_path, tmp_path / "out")
    assert not not_volcano.built
    assert "cmd/agent-scheduler" in not_volcano.reason or "Go toolchain" in not_volcano.reason


def test_the_environment_names_the_binary_when_no_flag_does(tmp_path: Path, monkeypatch: Any) -> None:
    binary = tmp_path / "vc"
    binary.write_text("#!/bin/sh\necho v9\n")
    binary.chmod(0o755)
    monkeypatch.setenv(BINARY_ENV, str(binary))
    assert locate(tmp_path / "out").binary == str(binary.resolve())


def test_a_plain_go_build_reads_as_unversioned(tmp_path: Path) -> None:
    binary = tmp_path / "vc"
    binary.write_text("#!/bin/sh\necho 'API Version: v1alpha1'\necho 'Version: Not provided.'\n")
    binary.chmod(0o755)
    assert given(str(binary)).version == "unversioned build"


async def test_cpu_of_other_threads_is_not_the_main_threads() -> None:
    meter = ProcessMeter({"me": own_pid}, period=0.05)
    meter.start()

    def burn() -> None:
        end = time.thread_time() + 0.3
        while time.thread_time() < end:
            pass

    await asyncio.to_thread(burn)
    usage = await meter.stop()
    whole, main = usage["me"].by_pid[os.getpid()], usage["me"].main_by_pid[os.getpid()]
    assert whole >= 0.25 and main < whole - 0.2


async def test_meter_counts_each_time_the_main_thread_blocked() -> None:
    meter = ProcessMeter({"me": own_pid}, period=10.0)  # one reading at the start and one at the end
    meter.start()
    for _ in range(50):
        await asyncio.sleep(0.001)  # the event loop waits in epoll: the main thread blocks each time
    usage = await meter.stop()
    # each sleep blocks unless the thread was held up past its timer (a busy machine): a little slack below
    assert 40 <= usage["me"].main_sleeps_by_pid[os.getpid()] < 200


async def test_a_sleep_count_that_cannot_be_read_leaves_the_cpu_figures_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(meter_module, "_main_thread_sleeps", lambda pid: None)
    meter = ProcessMeter({"me": own_pid}, period=10.0)
    began = time.process_time()
    meter.start()
    end = time.process_time() + 0.1
    while time.process_time() < end:
        pass
    usage = await meter.stop()
    used = time.process_time() - began
    assert began > 0.1  # the process had run before (imports): from its birth would be more than the window
    # counted from the baseline (psutil reads whole clock ticks: a tick of slack each way)
    assert used - 0.03 <= usage["me"].by_pid[os.getpid()] <= used + 0.03
    assert usage["me"].main_sleeps_by_pid == {}


async def test_the_window_runs_on_while_the_scheduler_works_and_ends_once_it_is_idle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from scale.bench import cluster

    monkeypatch.setattr(cluster, "IDLE_WINDOW_S", 0.2)
    meter = ProcessMeter({"scheduler": own_pid}, period=10.0)
    meter.start()

    def burn(seconds: float) -> None:
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    busy = asyncio.create_task(asyncio.to_thread(burn, 0.6))  # the scheduler's work after the last bind
    waited, idle = await cluster._until_idle(meter, 10.0, rest={"scheduler": 0.0})
    await busy
    assert idle and 0.5 <= waited < 5.0  # not before the work ended, and soon after it
    assert (await meter.stop())["scheduler"].cpu_s >= 0.5  # counted in the window

    meter = ProcessMeter({"scheduler": own_pid}, period=10.0)
    meter.start()
    busy = asyncio.create_task(asyncio.to_thread(burn, 1.0))
    waited, idle = await cluster._until_idle(meter, 0.3, rest={"scheduler": 0.0})
    assert not idle and waited < 0.9  # never a window past its limit
    await busy
    await meter.stop()


async def test_a_scheduler_busy_at_rest_is_idle_at_its_rest_level(monkeypatch: pytest.MonkeyPatch) -> None:
    from scale.bench import cluster

    monkeypatch.setattr(cluster, "IDLE_WINDOW_S", 0.2)
    meter = ProcessMeter({"scheduler": own_pid}, period=10.0)
    meter.start()
    # a thread using about half a core throughout: the scheduler's timers, say
    stop = False

    def timers() -> None:
        while not stop:
            end = time.thread_time() + 0.005
            while time.thread_time() < end:
                pass
            time.sleep(0.005)

    task = asyncio.create_task(asyncio.to_thread(timers))
    try:
        waited, idle = await cluster._until_idle(meter, 2.0, rest={"scheduler": 0.6})
        assert idle and waited < 1.0
    finally:
        stop = True
        await task
        await meter.stop()


async def test_the_window_runs_on_while_the_api_server_still_serves_a_quiet_scheduler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A paced worker whose Scheduled events wait on the API server uses little CPU while the API server
    still serves them: the window must not end on the scheduler's rest alone."""
    from scale.bench import cluster

    monkeypatch.setattr(cluster, "IDLE_WINDOW_S", 0.2)
    quiet = await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(30)")
    try:
        meter = ProcessMeter({"scheduler": lambda: [quiet.pid], "apiserver": own_pid}, period=10.0)
        meter.start()

        def serve(seconds: float) -> None:  # the API server's work on the scheduler's last events
            end = time.thread_time() + seconds
            while time.thread_time() < end:
                pass

        busy = asyncio.create_task(asyncio.to_thread(serve, 0.8))
        waited, idle = await cluster._until_idle(meter, 10.0, rest={"scheduler": 0.0, "apiserver": 0.0})
        await busy
        assert idle and 0.7 <= waited < 5.0  # not while the API server worked, and soon after
        usage = await meter.stop()
        assert usage["apiserver"].cpu_s >= 0.7 and usage["scheduler"].cpu_s < 0.1
    finally:
        quiet.kill()
        await quiet.wait()
