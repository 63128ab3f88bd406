"""When a coordinated worker writes its load report (``worker.coordinated.load_changed``)."""

from __future__ import annotations

from dataclasses import replace

from common.etcd.schema import LoadReport
from worker.coordinated import LOAD_CPU_STEP, load_changed

WRITTEN = LoadReport(pending_pods=2, free_milli_cpu=8000, free_memory=2**30, process_cpu=0.10, usable_nodes=5)


def test_the_first_report_is_written() -> None:
    assert load_changed(WRITTEN, None)


def test_a_report_that_differs_only_in_its_time_or_in_cpu_jitter_is_not_written() -> None:
    later = replace(WRITTEN, reported_at=99.0, process_cpu=0.10 + LOAD_CPU_STEP / 2)
    assert not load_changed(later, WRITTEN)


def test_cpu_moving_by_the_step_is_written() -> None:
    assert load_changed(replace(WRITTEN, process_cpu=0.10 + LOAD_CPU_STEP), WRITTEN)
    assert load_changed(replace(WRITTEN, process_cpu=0.10 - LOAD_CPU_STEP), WRITTEN)


def test_any_other_field_changing_is_written() -> None:
    for changed in (
        replace(WRITTEN, pending_pods=3),
        replace(WRITTEN, free_milli_cpu=7999),
        replace(WRITTEN, free_memory=2**30 - 1),
        replace(WRITTEN, binds_per_second=0.5),
        replace(WRITTEN, usable_nodes=4),
    ):
        assert load_changed(changed, WRITTEN), changed
