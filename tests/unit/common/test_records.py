import json

from common import records
from common.records import GPU, node_from_json, pod_from_json
from tests.builders import make_node, make_pod


def test_requests_sum_app_containers_and_take_max_of_init() -> None:
    b = make_pod("a").req(cpu="200m", memory="100Mi")
    b.spec["containers"].append({"name": "side", "resources": {"requests": {"cpu": "300m"}}})
    b.init_container(cpu="1", memory="50Mi")
    r = b.record().requests
    assert r.milli_cpu == 1000  # max(500m of app containers, 1 of the init container)
    assert r.memory == 100 * 2**20
    assert r.pods == 1


def test_sidecar_init_containers_add_to_the_app_containers() -> None:
    b = (
        make_pod("a")
        .req(cpu="200m")
        .init_container(restart_always=True, cpu="100m")
        .init_container(cpu="250m")
    )
    # app 200m + sidecar 100m = 300m; the plain init container runs beside the sidecar: 250m + 100m = 350m
    assert b.record().requests.milli_cpu == 350


def test_overhead_is_added() -> None:
    b = make_pod("a").req(cpu="100m")
    b.spec["overhead"] = {"cpu": "50m"}
    assert b.record().requests.milli_cpu == 150


def test_malformed_quantity_gives_a_parse_error_not_an_exception() -> None:
    pod = make_pod("a").req(cpu="1.5.3").record()
    assert pod.parse_error is not None and "1.5.3" in pod.parse_error


def test_invalid_affinity_operator_is_a_parse_error() -> None:
    pod = make_pod("a").required([{"key": "zone", "operator": "Near", "values": ["a"]}]).record()
    assert pod.parse_error is not None and "Near" in pod.parse_error


def test_extended_resources_are_scalar() -> None:
    pod = make_pod("a").req(nvidia_gpu="2").record()
    assert pod.requests.scalar == {GPU: 2}


def test_node_without_allocatable_has_no_capacity() -> None:
    obj = make_node("n").json()
    del obj["status"]["allocatable"]
    rec = node_from_json(obj)
    assert rec.allocatable.milli_cpu == 0 and rec.allocatable_error is not None


def test_node_with_malformed_allocatable_has_no_capacity() -> None:
    rec = make_node("n", cpu="thirty-two").record()
    assert rec.allocatable.milli_cpu == 0 and "thirty-two" in (rec.allocatable_error or "")


def test_garbage_spec_types_do_not_raise() -> None:
    pod = pod_from_json({"metadata": {"name": "x"}, "spec": {"containers": [{"resources": {"requests": 5}}]}})
    assert pod.parse_error is not None


def test_pods_share_equal_tolerations_signatures_and_label_strings() -> None:
    # A worker holds a record of every placed pod: what pods have in common is held once.
    def raw(name: str) -> dict[str, object]:
        b = make_pod(name).req(cpu="100m").label("app", "agent").toleration("dedicated", "batch")
        return dict(json.loads(json.dumps(b.obj)))  # fresh strings, as a watch delivers them

    a, b = pod_from_json(raw("a")), pod_from_json(raw("b"))
    assert a.tolerations == b.tolerations and a.tolerations is b.tolerations
    assert a.signature is b.signature
    ka, va = next((k, v) for k, v in a.labels.items() if k == "app")
    kb, vb = next((k, v) for k, v in b.labels.items() if k == "app")
    assert ka is kb and va is vb
    assert a.namespace is b.namespace and a.scheduler_name is b.scheduler_name


def test_shared_values_are_bounded() -> None:
    before = len(records._SHARED)
    for i in range(records.SHARED_LIMIT + 10):
        value = ("bounded-test", i)
        assert records.shared(value) == value
    assert len(records._SHARED) <= records.SHARED_LIMIT
    assert len(records._SHARED) >= before
