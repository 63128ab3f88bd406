"""Pod watches the API server itself ended during a run, from its own ``/metrics``.

kube-apiserver's watch cache hands each event to every watcher through a small buffer (10 events for a watch
whose field selector it indexes, such as ``spec.nodeName=``; up to 100 or 1,000 for others, scaled by the cache's
size). When a watcher's buffer stays full for longer than the cache's dispatch budget (at most 100 ms, refilled
at 50 ms per second), the server ends that watch and counts it in ``apiserver_terminated_watchers_total``. Its
delivery of further events to *every* watcher of the resource waits for that budget first (one goroutine
dispatches them all). The count is the server's view
of which clients could not keep up, including the load generator's and kube-scheduler's watches, not only ours.

The bench scrapes the counter just before a workload and after it (``run_workload``) and keeps the difference
for ``resource="pods"`` in ``RunResult.apiserver_ended_pod_watches`` (-1: not measured).
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from common.kube import ApiError, KubeClient

COUNTER = "apiserver_terminated_watchers"  # the family's name as the parser reports it (without ``_total``)


def ended_pod_watches(text: str) -> int:
    """The counter's value for core ``pods`` in one ``/metrics`` answer; 0 when the server has ended none yet
    (the family is absent until its first increment)."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != COUNTER:
            continue
        for sample in family.samples:
            labels = sample.labels
            if (
                sample.name.endswith("_total")
                and labels.get("resource") == "pods"
                and not labels.get("group")
            ):
                total += sample.value
    return round(total)


async def scrape(client: KubeClient) -> tuple[int, str]:
    """The counter now, or (-1, why) when the server did not answer."""
    try:
        return ended_pod_watches(await client.get_text("/metrics")), ""
    except (ApiError, ValueError) as e:
        return -1, f"API server metrics did not answer ({e or type(e).__name__})"
