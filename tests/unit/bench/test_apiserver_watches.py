"""Reading the API server's count of watchers it ended (``scale.bench.apiserver_watches``) from its exposition."""

from __future__ import annotations

from scale.bench.apiserver_watches import ended_pod_watches

# as kube-apiserver 1.36 writes it (families it has not incremented yet are absent)
EXPOSITION = """\
# HELP apiserver_terminated_watchers_total [STABLE] Counter of watchers closed due to unresponsiveness broken by resource type.
# TYPE apiserver_terminated_watchers_total counter
apiserver_terminated_watchers_total{group="",resource="pods"} 4
apiserver_terminated_watchers_total{group="",resource="nodes"} 2
apiserver_terminated_watchers_total{group="example.io",resource="pods"} 1
# HELP apiserver_watch_events_total [STABLE] Number of events sent in watch clients
# TYPE apiserver_watch_events_total counter
apiserver_watch_events_total{component="apiserver",group="",resource="pods",version="v1"} 9000
"""


def test_only_core_pods_count() -> None:
    assert ended_pod_watches(EXPOSITION) == 4  # not nodes, not another group's "pods", not events


def test_a_server_that_ended_none_yet_has_no_family() -> None:
    others = EXPOSITION.split("# HELP apiserver_watch_events_total", maxsplit=1)[1]
    assert ended_pod_watches("# HELP apiserver_watch_events_total" + others) == 0
    assert ended_pod_watches("") == 0
