"""Simulated image pulls (``scale.bench.pulls``): what a pod waits for, serialized per node, learned once
pulled; create -> running in the tracking and the results."""

from __future__ import annotations

import asyncio
import math
from typing import cast

from common.kube import KubeClient
from scale.bench.pulls import PULL_ANNOTATION, ImagePuller, pod_images
from scale.bench.results import Usage, summarize
from scale.cluster.nodes import AGENT_IMAGE, generate_nodes
from scale.tracking import BindWatch, PodTimes


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def node(name: str, *images: str) -> dict[str, object]:
    return {
        "metadata": {"name": name},
        "status": {"images": [{"names": [i], "sizeBytes": 10**9} for i in images]},
    }


def pod(name: str, node_name: str, *images: str) -> dict[str, object]:
    return {
        "metadata": {"name": name, "namespace": "ns", "annotations": {PULL_ANNOTATION: "true"}},
        "spec": {"nodeName": node_name, "containers": [{"name": "c", "image": i} for i in images]},
    }


def test_pod_images_are_normalized_and_unique() -> None:
    obj = pod("p", "n", "a", "a:latest", "b:1")
    assert pod_images(obj) == ["a:latest", "b:1"]


async def test_missing_images_are_pulled_one_after_the_other_per_node() -> None:
    clock = Clock()
    # no client call happens: nodes are not updated and pods are only annotated by spawned tasks we cancel
    puller = ImagePuller(cast(KubeClient, None), pull_delay_s=2.0, update_nodes=False, clock=clock)
    puller._learn(node("warm", "a:1", "b:1"))
    puller._learn(node("cold"))
    assert puller.delay("warm", ["a:1", "b:1"]) == 0.0
    assert puller.delay("cold", ["a:1", "b:1"]) == 4.0  # two pulls, serialized
    clock.now += 1.0
    assert puller.delay("cold", ["a:1"]) == 1.0  # waits for the pull under way
    assert puller.delay("cold", ["c:1"]) == 5.0  # queued behind both
    assert puller.pulls == 3
    clock.now += 5.0
    await asyncio.sleep(0)  # the pull tasks see the clock past their end
    await asyncio.sleep(0)
    assert puller.present["cold"] >= {"a:1", "b:1", "c:1"}
    assert puller.delay("cold", ["a:1", "c:1"]) == 0.0
    await puller.close()


def test_bind_watch_stamps_running_once_and_results_report_it() -> None:
    clock = Clock()
    watch = BindWatch(clock)
    watch.expect("p", "agent").sent = 100.0
    bound = {"metadata": {"name": "p"}, "spec": {"nodeName": "n"}, "status": {"phase": "Pending"}}
    clock.now = 100.5
    watch.event("MODIFIED", bound)
    assert watch.bound == 1 and watch.running == 0
    clock.now = 102.5
    watch.event("MODIFIED", {**bound, "status": {"phase": "Running"}})
    clock.now = 109.0
    watch.event("MODIFIED", {**bound, "status": {"phase": "Running"}})
    times = watch.pods["p"]
    assert times.running == 102.5 and math.isclose(times.running_latency, 2.5)
    r = summarize(
        scheduler="s",
        scheduler_kind="agent",
        workload="w",
        nodes=1,
        agent=[times, PodTimes("agent", sent=100.0)],
        origin=100.0,
        end=110.0,
        usage={"scheduler": Usage()},
        host_cpu_s=0.0,
        pods_waiting_for_pulls=1,
        pulls=1,
    )
    assert r.running == 1 and r.running_p50_ms == 2500.0 and r.p50_ms == 500.0
    assert r.pods_waiting_for_pulls == 1


def test_fleet_nodes_list_the_agent_image_on_warm_and_prepulled_nodes() -> None:
    def has(n: dict[str, object]) -> bool:
        status = cast(dict[str, list[dict[str, list[str]]]], n["status"])
        return any(AGENT_IMAGE in i["names"] for i in status["images"])

    default = generate_nodes(400, now="t")
    none = generate_nodes(400, now="t", prepulled=0.0)
    every = generate_nodes(400, now="t", prepulled=1.0)
    warm = [has(n) for n in none]
    assert all(has(n) for n in every)
    assert 0 < sum(warm) < sum(has(n) for n in default) < 400
    # the share changes nothing else about a node
    for a, b in zip(none, every, strict=True):
        assert {**a, "status": {}} == {**b, "status": {}}
