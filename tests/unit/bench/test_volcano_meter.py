"""The Volcano build probe's parsing and the process meter (``scale.bench.volcano``, ``scale.bench.meter``)."""

from __future__ import annotations

import os
import time

from scale.bench.meter import ProcessMeter, own_pid, with_children
from scale.bench.volcano import newest_supported, replace_directives

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
    assert usage["me"].peak_rss_bytes > 0 and usage["me"].processes == 1
    assert usage["nobody"].cpu_s == 0 and usage["nobody"].processes == 0
    assert meter.host_cpu_s >= 0.15
    assert with_children([os.getpid()])[0] == os.getpid()
