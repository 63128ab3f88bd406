"""``pod_from_json(obj, previous)``: a parse that reuses the previous record's spec-derived fields must give
exactly the record a full parse gives, whatever changed between the two objects."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from typing import Any

import pytest

from common import records
from common.records import pod_from_json, pod_key, pod_update, spec_digest
from tests.builders import make_pod

Obj = dict[str, Any]


def _pods() -> list[Obj]:
    """Pods of many shapes: plain, with rules, with an unsupported field, with a parse error, with claims."""
    out = [
        make_pod("plain").req(cpu="100m", memory="128Mi").json(),
        make_pod("ruled")
        .req(cpu="1")
        .label("app", "web")
        .node_selector(zone="a")
        .toleration("k", "v")
        .host_port(8080)
        .spread("zone", {"app": "web"}, match_label_keys=["app"])
        .owned_by("ReplicaSet", "rs")
        .json(),
        make_pod("gated").gate("wait").priority(5).never_preempt().json(),
        make_pod("bad").req(cpu="lots").json(),  # a parse error
        make_pod("refused").json(),
    ]
    out[-1]["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "c"}]  # not supported: refused
    claim = make_pod("claims").req(cpu="200m").json()
    claim["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "d"}}]
    out.append(claim)
    for i, obj in enumerate(out):
        obj["metadata"].update(uid=f"uid-{i}", resourceVersion="10", generation=1)
    return out


def _status_only(obj: Obj, rng: random.Random) -> None:
    status = obj.setdefault("status", {})
    status["phase"] = rng.choice(["Pending", "Running", "Succeeded"])
    status["startTime"] = f"2026-01-01T00:00:0{rng.randint(0, 9)}Z"
    status["conditions"] = [{"type": "Ready", "status": "True"}]


def _bump(obj: Obj) -> None:
    """A change of the spec, or a graceful delete: kube-apiserver (1.36, measured) bumps the generation."""
    if "generation" in obj["metadata"]:
        obj["metadata"]["generation"] += 1


def _mutations() -> list[Callable[[Obj, random.Random], None]]:
    def bind(obj: Obj, rng: random.Random) -> None:
        obj["spec"]["nodeName"] = f"n{rng.randint(0, 3)}"
        if rng.random() < 0.5:
            # kube-apiserver copies the node's topology labels onto the pod at its binding
            obj["metadata"].setdefault("labels", {})["topology.kubernetes.io/zone"] = "z1"

    def annotate(obj: Obj, rng: random.Random) -> None:
        obj["metadata"].setdefault("annotations", {})[f"a{rng.randint(0, 2)}"] = "x"

    def relabel(obj: Obj, rng: random.Random) -> None:
        obj["metadata"].setdefault("labels", {})["app"] = rng.choice(["web", "db"])

    def resize(obj: Obj, rng: random.Random) -> None:
        obj["spec"]["containers"][0]["resources"] = {"requests": {"cpu": f"{rng.randint(1, 9)}00m"}}
        _bump(obj)

    def ungate(obj: Obj, rng: random.Random) -> None:
        if obj["spec"].pop("schedulingGates", None):
            _bump(obj)

    def nominate(obj: Obj, rng: random.Random) -> None:
        obj.setdefault("status", {})["nominatedNodeName"] = f"n{rng.randint(0, 3)}"

    def delete(obj: Obj, rng: random.Random) -> None:
        if not obj["metadata"].get("deletionTimestamp"):
            obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
            _bump(obj)

    def preempted(obj: Obj, rng: random.Random) -> None:
        obj.setdefault("status", {})["conditions"] = [
            {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
        ]

    def recreate(obj: Obj, rng: random.Random) -> None:
        obj["metadata"]["uid"] = f"new-{rng.random()}"

    def own(obj: Obj, rng: random.Random) -> None:
        obj["metadata"]["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "s", "uid": "u", "controller": True}
        ]

    def tolerate(obj: Obj, rng: random.Random) -> None:
        obj["spec"].setdefault("tolerations", []).append({"key": "t", "operator": "Exists"})
        _bump(obj)

    def no_generation(obj: Obj, rng: random.Random) -> None:
        obj["metadata"].pop("generation", None)  # an API server that does not set it: the digest decides

    return [
        _status_only,
        bind,
        annotate,
        relabel,
        resize,
        ungate,
        nominate,
        delete,
        preempted,
        recreate,
        own,
        tolerate,
        no_generation,
    ]


def _full(obj: Obj) -> records.PodRecord:
    """A parse that shares nothing with earlier ones (no spec parts kept from other pods)."""
    records._SPEC_PARTS.clear()
    return pod_from_json(obj)


def test_a_reparse_with_the_previous_record_equals_a_full_parse() -> None:
    rng = random.Random(14)
    mutations = _mutations()
    reused = 0
    for _ in range(400):
        obj = copy.deepcopy(rng.choice(_pods()))
        previous = pod_from_json(obj)
        for step in range(rng.randint(1, 6)):
            obj = copy.deepcopy(obj)
            obj["metadata"]["resourceVersion"] = str(11 + step)
            for mutate in rng.sample(mutations, rng.randint(1, 2)):
                mutate(obj, rng)
            fast = pod_from_json(obj, previous)
            shared = pod_from_json(obj)  # the spec parts of an earlier parse of the same spec
            full = _full(obj)
            assert fast == full, (obj, fast, full)
            assert shared == full, (obj, shared, full)
            kept = pod_update(obj, previous)
            if kept is previous:  # only fields nothing reads of a placed pod changed
                assert previous.node_name and not full.terminal
                for name in records.PodRecord.__slots__:
                    if name not in records.UNREAD_WHEN_PLACED:
                        assert getattr(kept, name) == getattr(full, name), name
            else:
                assert kept == full
            reused += fast.spec_digest == previous.spec_digest
            previous = fast
    assert reused > 300  # the reuse was exercised, not only full parses


def test_status_events_and_the_binding_reuse_the_spec_fields() -> None:
    obj = make_pod("p").req(cpu="100m").label("app", "web").json()
    obj["metadata"]["uid"] = "u"
    pending = pod_from_json(obj)
    bound_obj = copy.deepcopy(obj)
    bound_obj["spec"]["nodeName"] = "n1"
    bound_obj["metadata"]["labels"]["topology.kubernetes.io/zone"] = "z1"  # added by the API server
    _status_only(bound_obj, random.Random(1))
    bound = pod_from_json(bound_obj, pending)
    assert bound == pod_from_json(bound_obj)
    assert bound.node_name == "n1" and bound.images == ()
    # the spec-derived values are the very objects of the previous record: nothing was parsed again
    assert bound.requests is pending.requests and bound.signature is pending.signature


def test_the_binding_of_a_refused_pod_is_parsed_in_full() -> None:
    obj = make_pod("p").json()
    obj["metadata"]["uid"] = "u"
    obj["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "c"}]
    pending = pod_from_json(obj)
    assert pending.parse_error is not None
    obj["spec"]["nodeName"] = "n1"
    bound = pod_from_json(obj, pending)
    assert bound.parse_error is None  # a placed pod is not ours to refuse
    assert bound == pod_from_json(obj)


@pytest.mark.parametrize("value", [2**70, float("nan")])
def test_content_json_cannot_digest_is_parsed_in_full(value: object) -> None:
    obj = make_pod("p").json()
    obj["spec"]["odd"] = value
    digest = spec_digest(obj["metadata"], obj["spec"])
    record = pod_from_json(obj)
    assert record.spec_digest == digest
    if not digest:
        assert pod_from_json(obj, record) == record


def test_pod_key_is_the_records_key() -> None:
    for obj in [*_pods(), {"metadata": {"name": "x"}}, {}]:
        assert pod_key(obj) == pod_from_json(obj).key
