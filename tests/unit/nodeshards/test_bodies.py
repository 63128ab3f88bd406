"""NodeShard bodies (``coordinator.nodeshards.bodies``) and the CRD manifest."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

from coordinator.nodeshards import bodies
from coordinator.nodeshards.bodies import (
    NodeShardFormatError,
    new_nodeshard,
    parse_nodeshard,
    spec_patch,
    status_patch,
)

HERE = Path(__file__).parent
CRD = HERE.parents[2] / "manifests" / "crds" / "nodeshards.shard.volcano.sh.yaml"


def test_new_nodeshard_sorts_and_deduplicates() -> None:
    body = new_nodeshard("agent-scheduler", ["n2", "n1", "n2"], labels={"app": "agent-scheduler"})
    assert body == {
        "apiVersion": "shard.volcano.sh/v1alpha1",
        "kind": "NodeShard",
        "metadata": {"name": "agent-scheduler", "labels": {"app": "agent-scheduler"}},
        "spec": {"nodesDesired": ["n1", "n2"]},
    }
    assert bodies.object_path("volcano") == "/apis/shard.volcano.sh/v1alpha1/nodeshards/volcano"
    assert bodies.status_path("volcano") == "/apis/shard.volcano.sh/v1alpha1/nodeshards/volcano/status"


def test_spec_patch_is_a_merge_patch_optionally_conditional() -> None:
    assert spec_patch({"b", "a"}) == {"spec": {"nodesDesired": ["a", "b"]}}
    assert spec_patch([], resource_version="42") == {
        "spec": {"nodesDesired": []},
        "metadata": {"resourceVersion": "42"},
    }


def test_status_patch_sends_every_list_and_a_utc_time() -> None:
    now = datetime(2026, 1, 15, 17, 0, 0, 123456, tzinfo=timezone(timedelta(hours=1)))
    assert status_patch(nodes_in_use=["n2", "n1"], nodes_to_add=[], nodes_to_remove={"n3"}, now=now) == {
        "status": {
            "nodesInUse": ["n1", "n2"],
            "nodesToAdd": [],
            "nodesToRemove": ["n3"],
            "lastUpdateTime": "2026-01-15T16:00:00Z",
        }
    }
    with pytest.raises(ValueError, match="timezone-aware"):
        status_patch(nodes_in_use=[], nodes_to_add=[], nodes_to_remove=[], now=datetime(2026, 1, 1))


def test_parse_volcano_user_guide_object() -> None:
    obj = yaml.safe_load(
        """
apiVersion: shard.volcano.sh/v1alpha1
kind: NodeShard
metadata: {name: volcano, resourceVersion: "7"}
spec:
  nodesDesired: [node1, node2, node3]
status:
  nodesInUse: [node1, node2]
  nodesToAdd: [node3]
  nodesToRemove: []
  lastUpdateTime: "2026-01-15T16:00:00Z"
"""
    )
    shard = parse_nodeshard(obj)
    assert shard.name == "volcano" and shard.resource_version == "7"
    assert shard.nodes_desired == {"node1", "node2", "node3"}
    assert shard.nodes_in_use == {"node1", "node2"}
    assert shard.nodes_to_add == {"node3"} and shard.nodes_to_remove == frozenset()
    assert shard.last_update_time == datetime(2026, 1, 15, 16, tzinfo=UTC)


def test_parse_tolerates_absent_and_null_lists() -> None:
    shard = parse_nodeshard({"metadata": {"name": "a"}, "spec": {"nodesDesired": None}})
    assert shard.nodes_desired == frozenset() and shard.nodes_in_use == frozenset()
    assert shard.last_update_time is None
    round_trip = parse_nodeshard(
        {
            **new_nodeshard("a", ["x"]),
            **status_patch(
                nodes_in_use=["x"], nodes_to_add=[], nodes_to_remove=[], now=datetime(2026, 1, 1, tzinfo=UTC)
            ),
        }
    )
    assert round_trip.nodes_in_use == {"x"}


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        ({"metadata": {}}, "metadata.name"),
        ({"metadata": {"name": "a"}, "spec": []}, "spec"),
        ({"metadata": {"name": "a"}, "spec": {"nodesDesired": "n1"}}, "spec.nodesDesired"),
        ({"metadata": {"name": "a"}, "status": {"nodesInUse": [1]}}, "status.nodesInUse"),
        ({"metadata": {"name": "a"}, "status": {"lastUpdateTime": "yesterday"}}, "status.lastUpdateTime"),
        (
            {"metadata": {"name": "a"}, "status": {"lastUpdateTime": "2026-01-15T16:00:00"}},
            "status.lastUpdateTime",
        ),
    ],
)
def test_parse_rejects_wrong_types(obj: dict[str, object], field: str) -> None:
    with pytest.raises(NodeShardFormatError, match=field):
        parse_nodeshard(obj)


def test_crd_manifest_matches_volcanos_nodeshard() -> None:
    crd = yaml.safe_load(CRD.read_text(encoding="utf-8"))
    assert crd["metadata"]["name"] == "nodeshards.shard.volcano.sh"
    spec = crd["spec"]
    assert spec["group"] == bodies.GROUP and spec["scope"] == "Cluster"
    assert spec["names"] == {
        "kind": "NodeShard",
        "listKind": "NodeShardList",
        "plural": "nodeshards",
        "singular": "nodeshard",
        "shortNames": ["nsh"],
    }
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}
    schema = version["schema"]["openAPIV3Schema"]
    assert schema["required"] == ["spec"]
    assert schema["properties"]["spec"]["required"] == ["nodesDesired"]
    string_list = {"type": "array", "items": {"type": "string"}}
    desired = schema["properties"]["spec"]["properties"]["nodesDesired"]
    assert {k: desired[k] for k in ("type", "items")} == string_list
    status = schema["properties"]["status"]["properties"]
    for key in ("nodesInUse", "nodesToAdd", "nodesToRemove"):
        assert {k: status[key][k] for k in ("type", "items")} == string_list
    assert (status["lastUpdateTime"]["type"], status["lastUpdateTime"]["format"]) == ("string", "date-time")
