"""Where the engine disagreed with the real kube-scheduler (found by tests/integration/test_differential.py),
each reduced to the smallest case and pinned here with kube-scheduler's verdict."""

from typing import Any

from tests.builders import PodBuilder, make_node, make_pod
from tests.unit.worker.helpers import engine_over


def fits(node: Any, pod: PodBuilder) -> bool:
    return engine_over([node.record()]).schedule(pod.record()).node is not None


def with_host_port(
    pod: PodBuilder, port: int, *, host_ip: str = "", init: bool = False, sidecar: bool = False
) -> PodBuilder:
    p: dict[str, Any] = {"containerPort": port, "hostPort": port, "protocol": "TCP"}
    if host_ip:
        p["hostIP"] = host_ip
    if init:
        c: dict[str, Any] = {"name": f"init{len(pod.spec.get('initContainers', []))}", "image": "init"}
        if sidecar:
            c["restartPolicy"] = "Always"
        pod.spec.setdefault("initContainers", []).append(c)
    else:
        c = pod.spec["containers"][0]
    c.setdefault("ports", []).append(p)
    return pod


def test_cordoned_node_needs_a_toleration_that_matches_the_unschedulable_taint() -> None:
    # kube-scheduler asks whether the pod tolerates node.kubernetes.io/unschedulable:NoSchedule (no value), so
    # an Equal toleration with a value does not, nor does one for another effect.
    node = make_node("n").cordon()
    key = "node.kubernetes.io/unschedulable"
    assert not fits(node, make_pod("p").toleration(key, "x"))
    assert not fits(node, make_pod("p").toleration(key, "x", effect="NoSchedule"))
    assert not fits(node, make_pod("p").toleration(key, operator="Exists", effect="NoExecute"))
    assert fits(node, make_pod("p").toleration(key))
    assert fits(node, make_pod("p").toleration(key, operator="Exists"))
    assert fits(node, make_pod("p").toleration("", operator="Exists", effect="NoSchedule"))


def test_gt_lt_read_labels_as_go_integers() -> None:
    # "1_0" is a valid label value and int("1_0") == 10 in Python, but not an integer to strconv.ParseInt.
    gt = {"key": "gen", "operator": "Gt", "values": ["3"]}
    assert not fits(make_node("n").label("gen", "1_0"), make_pod("p").required([gt]))
    assert fits(make_node("n").label("gen", "10"), make_pod("p").required([gt]))
    assert fits(make_node("n").label("gen", "007"), make_pod("p").required([{**gt, "values": ["5"]}]))


def test_a_term_that_does_not_parse_matches_nothing_but_the_other_terms_count() -> None:
    # The API server accepts Gt/Lt with a value like "abc"; kube-scheduler then skips that term only.
    node = make_node("n").label("zone", "a")
    bad = [{"key": "gen", "operator": "Lt", "values": ["abc"]}]
    good = [{"key": "zone", "operator": "In", "values": ["a"]}]
    pod = make_pod("p").required(bad, good)
    assert pod.record().parse_error is None
    assert fits(node, pod)
    assert not fits(node, make_pod("p").required(bad, [{"key": "zone", "operator": "In", "values": ["b"]}]))
    # With no term left the pod is invalid and placed nowhere, as with kube-scheduler.
    only_bad = make_pod("p").required(bad)
    assert only_bad.record().parse_error is not None
    assert not fits(node, only_bad)


def test_host_ports_of_plain_init_containers_are_not_held() -> None:
    # An init container has exited before the app containers start; only sidecars keep their ports.
    eng = engine_over([make_node("n").record()])
    running = with_host_port(make_pod("a"), 8080, init=True).record()
    eng.cache.assume(running, eng.schedule(running).node)  # type: ignore[arg-type]
    assert eng.schedule(with_host_port(make_pod("b"), 8080).record()).node == "n"
    assert eng.schedule(with_host_port(make_pod("c"), 8080, init=True).record()).node == "n"
    sidecar = with_host_port(make_pod("d"), 8080, init=True, sidecar=True).record()
    eng.cache.assume(sidecar, eng.schedule(sidecar).node)  # type: ignore[arg-type]
    assert eng.schedule(with_host_port(make_pod("e"), 8080).record()).node is None


def test_only_0_0_0_0_is_a_wildcard_host_ip() -> None:
    eng = engine_over([make_node("n").record()])
    running = with_host_port(make_pod("a"), 8080, host_ip="::").record()
    eng.cache.assume(running, eng.schedule(running).node)  # type: ignore[arg-type]
    assert eng.schedule(with_host_port(make_pod("b"), 8080, host_ip="10.0.0.1").record()).node == "n"
    assert eng.schedule(with_host_port(make_pod("c"), 8080, host_ip="::").record()).node is None
    assert eng.schedule(with_host_port(make_pod("d"), 8080).record()).node is None
    assert eng.schedule(with_host_port(make_pod("e"), 8080, host_ip="0.0.0.0").record()).node is None


def test_pod_level_requests_replace_the_containers_sum() -> None:
    # spec.resources.requests (PodLevelResources) is what kube-scheduler counts for cpu and memory; the
    # containers' own requests are then only a lower bound (the API server checks the sum fits in it).
    pod = make_pod("p").req(cpu="250m", memory="128Mi")
    pod.spec["resources"] = {"requests": {"cpu": "6"}}
    assert (pod.record().requests.milli_cpu, pod.record().requests.memory) == (6000, 128 * 2**20)
    assert not fits(make_node("n", cpu="4"), pod)
    assert fits(make_node("n", cpu="8"), pod)
    pod.spec["resources"]["requests"]["memory"] = "20Gi"
    assert not fits(make_node("n", cpu="8", memory="16Gi"), pod)
    # overhead comes on top
    pod.spec["overhead"] = {"cpu": "250m"}
    assert pod.record().requests.milli_cpu == 6250
