"""The coordinator's command line: worker claims are on unless turned off."""

from __future__ import annotations

import argparse

from coordinator.command import add_arguments


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


def test_worker_claims_are_on_by_default_and_can_be_turned_off() -> None:
    assert parse().worker_claims is True
    assert parse("--no-worker-claims").worker_claims is False
