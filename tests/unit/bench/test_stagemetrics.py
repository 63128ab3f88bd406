"""Reading the schedulers' stage histograms (``scale.bench.stagemetrics``): parse, add, subtract, summarise,
and one scrape of a real ``/metrics`` server."""

from __future__ import annotations

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from common.metrics import STAGE_METRIC
from scale.bench import stagemetrics


def exposition(observations: dict[str, list[float]]) -> str:
    registry = CollectorRegistry()
    h = Histogram(STAGE_METRIC, "stages", ["stage"], buckets=(0.001, 0.01, 0.1, 1.0), registry=registry)
    for stage, values in observations.items():
        for v in values:
            h.labels(stage).observe(v)
    return generate_latest(registry).decode()


def test_parse_difference_and_summary() -> None:
    before = stagemetrics.parse(exposition({"decided": [0.005]}))
    after = stagemetrics.parse(exposition({"decided": [0.005, 0.05, 0.05, 0.05], "bound": [0.5]}))
    run = stagemetrics.difference(after, before)
    assert run["decided"].count == 3 and run["decided"].total == pytest.approx(0.15)
    out = stagemetrics.summary(run)
    assert list(out) == ["decided", "bound"]  # path order
    assert out["decided"]["count"] == 3 and out["decided"]["mean_ms"] == pytest.approx(50.0)
    # all three in the (0.01, 0.1] bucket: the median interpolates to its middle, p99 near its top
    assert out["decided"]["p50_ms"] == pytest.approx(55.0)
    assert 90 < out["decided"]["p99_ms"] <= 100
    assert out["bound"] == {
        "count": 1,
        "mean_ms": 500.0,
        "p50_ms": 550.0,
        "p99_ms": 991.0,
    }  # 100 + 900 x 0.99


def test_processes_add_up_and_the_top_bucket_reports_its_floor() -> None:
    a = stagemetrics.parse(exposition({"bound": [0.002]}))
    b = stagemetrics.parse(exposition({"bound": [5.0]}))
    both = stagemetrics.combine([a, b])
    assert both["bound"].count == 2
    assert both["bound"].quantile(0.99) == 1.0  # in +Inf: the highest finite bound
    assert stagemetrics.summary({}) == {}
    assert stagemetrics.parse("# nothing here\n") == {}


async def test_scrape_reads_every_address_and_notes_the_silent_ones() -> None:
    text = exposition({"queued": [0.0001, 0.0002]})

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=text)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        stages, problems = await stagemetrics.scrape(
            [f"127.0.0.1:{port}", f"127.0.0.1:{port}", "127.0.0.1:9"]
        )
    finally:
        await runner.cleanup()
    assert stages["queued"].count == 4  # two processes' worth
    assert len(problems) == 1 and "127.0.0.1:9" in problems[0]
