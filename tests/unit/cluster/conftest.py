"""Every test here gets SIGTERM's handler back as it was: starting a cluster (even one that fails to start, as
some tests do on purpose) makes SIGTERM a KeyboardInterrupt for the whole interpreter
(``scale.cluster.processes.stop_on_sigterm``), and that must not depend on which tests ran first."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _sigterm_restored() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)
