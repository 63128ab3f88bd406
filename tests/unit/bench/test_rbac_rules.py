"""The benchmarks and the local-cluster tests bind the chart's rendered RBAC (``manifests/rbac.yaml``): one
identity running both roles gets the rules of both, and nothing more."""

from __future__ import annotations

from typing import Any

import yaml

from scale.bench.schedulers import RBAC_FILE, agent_rules


def rules() -> list[dict[str, Any]]:
    return agent_rules([d for d in yaml.safe_load_all(RBAC_FILE.read_text()) if d])


def granted(found: list[dict[str, Any]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for rule in found:
        for resource in rule.get("resources", []):
            out.setdefault(resource, set()).update(rule["verbs"])
    return out


def test_both_roles_rules_from_the_chart() -> None:
    verbs = granted(rules())
    assert verbs["pods/binding"] == {"create"}  # the worker's
    assert {"create", "patch"} <= verbs["nodeshards"]  # the coordinator's
    assert verbs["configmaps"] == {"get", "list", "watch"}
    assert "secrets" not in verbs and "nodes" in verbs and "patch" not in verbs["nodes"]


def test_the_policy_configmap_is_named_and_can_be_renamed() -> None:
    (default,) = [r for r in rules() if "configmaps" in r.get("resources", [])]
    assert default["resourceNames"] == ["volcano-sharding-configmap"]
    found = agent_rules([d for d in yaml.safe_load_all(RBAC_FILE.read_text()) if d], configmap="sharding")
    (renamed,) = [r for r in found if "configmaps" in r.get("resources", [])]
    assert renamed["resourceNames"] == ["sharding"]
