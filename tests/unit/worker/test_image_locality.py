"""ImageLocality: kube-scheduler's score (spread-scaled sizes, thresholds, normalized names), the image counts
the cache keeps, compact node records, and decisions that follow image changes despite the engine's caches."""

from __future__ import annotations

from common.records import (
    MAX_IMAGE_NAMES,
    MAX_NODE_IMAGES,
    NO_IMAGES,
    NodeName,
    node_from_json,
    normalized_image,
    pod_from_json,
)
from tests.builders import NodeBuilder, make_node, make_pod
from tests.unit.worker.helpers import engine_over, place
from worker.cache import Cache
from worker.plugins.images import MB, ImageLocality, image_score

GB = 1000 * MB


def score_nodes(builders: list[NodeBuilder], images: list[str]) -> dict[str, float]:
    cache = Cache()
    for b in builders:
        cache.upsert_node(b.record())
    plugin = ImageLocality()
    plugin.attach(cache)
    pod = make_pod("p")
    pod.spec["containers"] = [{"name": f"c{i}", "image": img} for i, img in enumerate(images)]
    record = pod.record()
    infos = [cache.nodes[NodeName(b.obj["metadata"]["name"])] for b in builders]
    return dict(zip([i.node.name for i in infos], plugin.scores(record, infos), strict=True))


def two_nodes() -> list[NodeBuilder]:
    n1 = make_node("n1").image(2000 * MB, "gcr.io/c:latest").image(300 * MB, "gcr.io/b:latest", "gcr.io/b:v1")
    n1.image(40 * MB, "gcr.io/a:latest", "gcr.io/a:v1", "gcr.io/a:v1")
    n2 = make_node("n2").image(250 * MB, "gcr.io/d:latest").image(10 * MB, "gcr.io/e:latest", "gcr.io/e:v1")
    return [n1, n2]


def test_normalized_names_as_kube_scheduler() -> None:
    assert normalized_image("root") == "root:latest"
    assert normalized_image("gcr.io:5000/root") == "gcr.io:5000/root:latest"
    assert normalized_image("root:tag") == "root:tag"
    digest = "root@sha256:" + "ab" * 32
    assert normalized_image(digest) == digest
    assert normalized_image("") == ":latest"


def test_scores_follow_spread_scaled_sizes_and_thresholds() -> None:
    # [a, d], 2 containers: n1 has a (40 MB / 2 nodes = 20 MB < 23 MB: 0); n2 has d: 100*(125-23)/(2000-23) = 5
    assert score_nodes(two_nodes(), ["gcr.io/a", "gcr.io/d"]) == {"n1": 0.0, "n2": 5.0}
    # [a, b] both on n1: (20 + 150 - 23) * 100 / 1977 = 7
    assert score_nodes(two_nodes(), ["gcr.io/a", "gcr.io/b:v1"]) == {"n1": 7.0, "n2": 0.0}
    # one container of 2000 MB on 1 of 2 nodes: 1000 MB reaches the one-container maximum
    assert score_nodes(two_nodes(), ["gcr.io/c"]) == {"n1": 100.0, "n2": 0.0}
    # a third node without images lowers the spread: int(2000 MiB / 3) = 699050666 bytes
    nodes = [*two_nodes(), make_node("n3")]
    expected = 100 * (699050666 - 23 * MB) // (1000 * MB - 23 * MB)
    assert expected == 65
    assert score_nodes(nodes, ["gcr.io/c"]) == {"n1": 65.0, "n2": 0.0, "n3": 0.0}


def test_init_containers_count_and_widen_the_range() -> None:
    pod = make_pod("p").image("gcr.io/c").init_container()
    pod.spec["initContainers"][0]["image"] = "gcr.io/d"
    record = pod.record()
    assert record.images == ("gcr.io/d:latest", "gcr.io/c:latest")
    cache = Cache()
    for b in two_nodes():
        cache.upsert_node(b.record())
    plugin = ImageLocality()
    plugin.attach(cache)
    infos = [cache.nodes[NodeName("n1")], cache.nodes[NodeName("n2")]]
    # n1: 1000 MB over a 2000 MB range -> 49; n2: 125 MB -> 5
    assert plugin.scores(record, infos) == [49.0, 5.0]
    assert image_score(0, 1) == 0 and image_score(10 * GB, 3) == 100


def test_applies_only_when_some_node_lists_an_image_of_the_pod() -> None:
    cache = Cache()
    for b in two_nodes():
        cache.upsert_node(b.record())
    plugin = ImageLocality()
    plugin.attach(cache)
    assert plugin.applies(make_pod("p").image("gcr.io/e:v1").record())
    assert not plugin.applies(make_pod("p").image("gcr.io/e:v2").record())


def test_image_counts_follow_node_updates_and_deletes() -> None:
    cache = Cache()
    for b in two_nodes():
        cache.upsert_node(b.record())
    assert cache.images.get("gcr.io/a:v1") == (40 * MB, 1)
    cache.upsert_node(make_node("n2").image(40 * MB, "gcr.io/a:v1").record())
    assert cache.images.get("gcr.io/a:v1") == (40 * MB, 2)
    assert cache.images.get("gcr.io/d:latest") is None
    # the only holder changes the size: the entry is made again with the new size (kube's cache does so)
    cache.upsert_node(make_node("n2").record())
    cache.upsert_node(make_node("n1").image(50 * MB, "gcr.io/a:v1").record())
    assert cache.images.get("gcr.io/a:v1") == (50 * MB, 1)
    cache.remove_node(NodeName("n1"))
    assert len(cache.images) == 0


def test_image_only_changes_keep_static_verdicts_and_do_not_wake_pods() -> None:
    cache = Cache()
    assert cache.upsert_node(make_node("n1").record())
    version = cache.static_version(NodeName("n1"))
    assert not cache.upsert_node(make_node("n1").image(500 * MB, "agent:latest").record())
    assert cache.static_version(NodeName("n1")) == version


def test_decisions_follow_image_changes_across_the_engines_caches() -> None:
    big = 100 * GB  # large enough that even one node in three scores the maximum
    nodes = [make_node(f"n{i}", cpu="64") for i in range(3)]
    nodes[2].image(big, "registry.example/agent:v1")
    eng = engine_over([n.record() for n in nodes])
    pod = make_pod("p0").image("registry.example/agent:v1").req(cpu="1")
    assert place(eng, pod.record()) == "n2"
    # the image moves to n0 (a node status update): the same pod shape must follow it, although its
    # signature's static verdicts are cached and no filter-relevant part of a node changed
    eng.cache.upsert_node(make_node("n2", cpu="64").record())
    eng.cache.upsert_node(make_node("n0", cpu="64").image(big, "registry.example/agent:v1").record())
    for i in range(1, 4):
        assert place(eng, make_pod(f"p{i}").image("registry.example/agent:v1").req(cpu="1").record()) == "n0"
    # pods of another image binpack as before (n0 is now the fullest)
    assert place(eng, make_pod("q").image("other:v1").req(cpu="1").record()) == "n0"


def test_node_records_are_compact_shared_and_bounded() -> None:
    a = make_node("a").image(10 * MB, "x:1", "x@sha256:" + "0" * 64).json()
    b = make_node("b").image(10 * MB, "x:1", "x@sha256:" + "0" * 64).json()
    ra, rb = node_from_json(a), node_from_json(b)
    assert ra.images is rb.images  # equal lists are one object
    assert node_from_json(make_node("c").json()).images is NO_IMAGES
    huge = make_node("h")
    for i in range(MAX_NODE_IMAGES + 20):
        huge.image(10 * MB, *[f"img{i}:t{j}" for j in range(MAX_IMAGE_NAMES + 3)])
    record = huge.record()
    assert len(record.images.names) == MAX_NODE_IMAGES * MAX_IMAGE_NAMES
    # malformed entries are skipped, never an error
    bad = make_node("bad").json()
    bad["status"]["images"] = [None, {"names": "x"}, {"names": [1, "ok:1"], "sizeBytes": "big"}, 7]
    assert node_from_json(bad).images.names == ("ok:1",)
    assert node_from_json(bad).images.sizes == (0,)
    bad["status"]["images"] = {"not": "a list"}
    assert node_from_json(bad).images is NO_IMAGES


def test_placed_pods_keep_no_images() -> None:
    obj = make_pod("p").image("agent:v1").obj
    obj["spec"]["nodeName"] = "n1"
    assert pod_from_json(obj).images == ()
