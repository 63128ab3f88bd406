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
