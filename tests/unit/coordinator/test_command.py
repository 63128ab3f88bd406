"""The coordinator's command line: worker claims are off unless turned on (experimental)."""

from __future__ import annotations

import argparse

from coordinator.command import add_arguments


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


def test_worker_claims_are_off_by_default_and_can_be_turned_on() -> None:
    assert parse().worker_claims is False
    assert parse("--worker-claims").worker_claims is True
