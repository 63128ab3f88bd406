"""The coordinator's command line: worker claims are off unless turned on (experimental); the sole worker is on
unless turned off, and never with claims (both asked for: refused)."""

from __future__ import annotations

import argparse

import pytest

from coordinator.command import add_arguments, run, sole_worker


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


def test_worker_claims_are_off_by_default_and_can_be_turned_on() -> None:
    assert parse().worker_claims is False
    assert parse("--worker-claims").worker_claims is True


def test_the_sole_worker_is_on_by_default_off_with_its_flag_and_never_with_claims() -> None:
    assert sole_worker(parse()) is True
    assert sole_worker(parse("--sole-worker")) is True
    assert sole_worker(parse("--no-sole-worker")) is False
    # a claim set splits the pods among the workers by hash: no worker is ever offered the whole path
    assert sole_worker(parse("--worker-claims")) is False
    assert sole_worker(parse("--worker-claims", "--no-sole-worker")) is False
    with pytest.raises(ValueError, match="exclude each other"):
        sole_worker(parse("--worker-claims", "--sole-worker"))
    assert run(parse("--worker-claims", "--sole-worker")) == 2  # refused before anything starts
