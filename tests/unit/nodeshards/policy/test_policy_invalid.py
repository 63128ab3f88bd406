"""Rejecting configurations: every kind of invalid ConfigMap names the ConfigMap key and the field path."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from coordinator.nodeshards.policy import SETTINGS_KEY, SHARDING_KEY, PolicyConfigError, parse_configmap
from tests.unit.nodeshards.policy._policy_builders import band, limit, scheduler, warmup

BASE: dict[str, Any] = {
    "schedulerConfigs": [
        scheduler(
            "volcano",
            "volcano",
            band(0.0, 0.6),
            warmup(2, warmupLabel="node.volcano.sh/warmup"),
            limit(100, 2),
        ),
        scheduler("agent-scheduler", "agent", band(0.7, 1.0), {"name": "warmup", "weight": 5}, limit(50, 2)),
    ],
    "shardSyncPeriod": "60s",
    "enableNodeEventTrigger": True,
}
_DELETE = object()


def mutated(path: tuple[str | int, ...], value: object) -> str:
    """BASE with the value at ``path`` replaced (or deleted with ``_DELETE``), as YAML."""
    doc = copy.deepcopy(BASE)
    target: Any = doc
    for step in path[:-1]:
        target = target[step]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return yaml.safe_dump(doc, sort_keys=False)


ARGS1 = ("schedulerConfigs", 1, "policies", 0, "arguments")

SHARDING_CASES = [
    # (id, sharding.yaml, expected path, expected reason fragment)
    ("yaml-syntax", "schedulerConfigs: [\n  - name: a\n", "", "invalid YAML: line"),
    ("yaml-tab-indent", "schedulerConfigs:\n\t- name: a\n", "", "invalid YAML"),
    (
        "duplicate-yaml-key",
        "schedulerConfigs: []\nshardSyncPeriod: 1s\nshardSyncPeriod: 2s\n",
        "",
        "duplicate key 'shardSyncPeriod'",
    ),
    ("non-mapping-top-level", "- volcano\n- agent\n", "", "must be a mapping, got list"),
    ("empty-document", "", "", "must be a mapping, got empty document"),
    ("scalar-top-level", "42\n", "", "must be a mapping, got number"),
    ("missing-schedulerConfigs", "shardSyncPeriod: 60s\n", "schedulerConfigs", "required field is missing"),
    (
        "schedulerConfigs-not-list",
        mutated(("schedulerConfigs",), {"a": 1}),
        "schedulerConfigs",
        "must be a list",
    ),
    (
        "schedulerConfigs-empty",
        mutated(("schedulerConfigs",), []),
        "schedulerConfigs",
        "at least one scheduler",
    ),
    (
        "entry-not-mapping",
        mutated(("schedulerConfigs", 0), "volcano"),
        "schedulerConfigs[0]",
        "must be a mapping",
    ),
    (
        "unknown-policy",
        mutated(("schedulerConfigs", 1, "policies", 0, "name"), "binpack"),
        "schedulerConfigs[1].policies[0].name",
        "unknown policy 'binpack'",
    ),
    (
        "min-gt-max",
        mutated((*ARGS1, "maxCPUUtil"), 0.5),
        "schedulerConfigs[1].policies[0].arguments.minCPUUtil",
        "must be <= maxCPUUtil",
    ),
    (
        "util-above-one",
        mutated((*ARGS1, "maxCPUUtil"), 1.5),
        "schedulerConfigs[1].policies[0].arguments.maxCPUUtil",
        "must be <= 1",
    ),
    (
        "util-negative",
        mutated(("schedulerConfigs", 0, "policies", 0, "arguments", "minCPUUtil"), -0.1),
        "schedulerConfigs[0].policies[0].arguments.minCPUUtil",
        "must be >= 0",
    ),
    (
        "util-wrong-type",
        mutated((*ARGS1, "minCPUUtil"), "0.7"),
        "schedulerConfigs[1].policies[0].arguments.minCPUUtil",
        "must be a number, got string",
    ),
    (
        "util-boolean",
        mutated((*ARGS1, "maxCPUUtil"), True),
        "schedulerConfigs[1].policies[0].arguments.maxCPUUtil",
        "must be a number, got boolean",
    ),
    (
        "negative-weight",
        mutated(("schedulerConfigs", 0, "policies", 1, "weight"), -2),
        "schedulerConfigs[0].policies[1].weight",
        "must be >= 0",
    ),
    (
        "weight-wrong-type",
        mutated(("schedulerConfigs", 0, "policies", 1, "weight"), "high"),
        "schedulerConfigs[0].policies[1].weight",
        "must be an integer, got string",
    ),
    (
        "weight-float",
        mutated(("schedulerConfigs", 0, "policies", 1, "weight"), 1.5),
        "schedulerConfigs[0].policies[1].weight",
        "must be an integer",
    ),
    (
        "maxNodes-zero",
        mutated(("schedulerConfigs", 1, "policies", 2, "arguments", "maxNodes"), 0),
        "schedulerConfigs[1].policies[2].arguments.maxNodes",
        "must be > 0",
    ),
    (
        "maxNodes-negative",
        mutated(("schedulerConfigs", 1, "policies", 2, "arguments", "maxNodes"), -5),
        "schedulerConfigs[1].policies[2].arguments.maxNodes",
        "must be > 0",
    ),
    (
        "minNodes-gt-maxNodes",
        mutated(("schedulerConfigs", 1, "policies", 2, "arguments", "minNodes"), 60),
        "schedulerConfigs[1].policies[2].arguments.minNodes",
        "must be <= maxNodes",
    ),
    (
        "minNodes-negative",
        mutated(("schedulerConfigs", 1, "policies", 2, "arguments", "minNodes"), -1),
        "schedulerConfigs[1].policies[2].arguments.minNodes",
        "must be >= 0",
    ),
    (
        "maxNodes-float",
        mutated(("schedulerConfigs", 1, "policies", 2, "arguments", "maxNodes"), 5.5),
        "schedulerConfigs[1].policies[2].arguments.maxNodes",
        "must be an integer",
    ),
    (
        "missing-agent-entry",
        mutated(("schedulerConfigs", 1, "type"), "volcano"),
        "schedulerConfigs",
        'no scheduler of type "agent"',
    ),
    (
        "duplicate-scheduler-name",
        mutated(("schedulerConfigs", 1, "name"), "volcano"),
        "schedulerConfigs[1].name",
        "duplicate scheduler name 'volcano' (also schedulerConfigs[0])",
    ),
    (
        "invalid-scheduler-name",
        mutated(("schedulerConfigs", 0, "name"), "Volcano_Batch"),
        "schedulerConfigs[0].name",
        "not a valid NodeShard name",
    ),
    (
        "missing-name",
        mutated(("schedulerConfigs", 0, "name"), _DELETE),
        "schedulerConfigs[0].name",
        "required",
    ),
    (
        "missing-type",
        mutated(("schedulerConfigs", 0, "type"), _DELETE),
        "schedulerConfigs[0].type",
        "required",
    ),
    (
        "no-policies",
        mutated(("schedulerConfigs", 0, "policies"), []),
        "schedulerConfigs[0].policies",
        "at least one policy",
    ),
    (
        "policies-not-list",
        mutated(("schedulerConfigs", 0, "policies"), {"name": "warmup"}),
        "schedulerConfigs[0].policies",
        "must be a list",
    ),
    (
        "arguments-not-mapping",
        mutated(("schedulerConfigs", 0, "policies", 0, "arguments"), [0.1, 0.2]),
        "schedulerConfigs[0].policies[0].arguments",
        "must be a mapping, got list",
    ),
    (
        "unknown-entry-field",
        mutated(("schedulerConfigs", 0, "polices"), []),
        "schedulerConfigs[0].polices",
        "unknown field",
    ),
    (
        "unknown-policy-field",
        mutated(("schedulerConfigs", 0, "policies", 0, "wieght"), 2),
        "schedulerConfigs[0].policies[0].wieght",
        "unknown field",
    ),
    (
        "unknown-argument",
        mutated((*ARGS1, "maxCPUutil"), 0.9),
        "schedulerConfigs[1].policies[0].arguments.maxCPUutil",
        "unknown field",
    ),
    (
        "node-limit-args-on-allocation-rate",
        mutated((*ARGS1, "maxNodes"), 9),
        "schedulerConfigs[1].policies[0].arguments.maxNodes",
        "only supported by the node-limit policy",
    ),
    (
        "warmup-value-unquoted-bool",
        mutated(("schedulerConfigs", 0, "policies", 1, "arguments", "warmupLabelValue"), True),
        "schedulerConfigs[0].policies[1].arguments.warmupLabelValue",
        "must be a string, got boolean (quote it",
    ),
    (
        "warmup-label-invalid",
        mutated(("schedulerConfigs", 0, "policies", 1, "arguments", "warmupLabel"), "warm up!"),
        "schedulerConfigs[0].policies[1].arguments.warmupLabel",
        "not a valid label key",
    ),
    ("duration-no-unit", mutated(("shardSyncPeriod",), "60"), "shardSyncPeriod", "invalid duration '60'"),
    ("duration-garbage", mutated(("shardSyncPeriod",), "one minute"), "shardSyncPeriod", "invalid duration"),
    ("duration-number", mutated(("shardSyncPeriod",), 60), "shardSyncPeriod", "must be a string, got number"),
    ("duration-zero", mutated(("shardSyncPeriod",), "0s"), "shardSyncPeriod", "must be > 0"),
    ("duration-negative", mutated(("shardSyncPeriod",), "-1m"), "shardSyncPeriod", "must be > 0"),
    (
        "trigger-not-bool",
        mutated(("enableNodeEventTrigger",), "sometimes"),
        "enableNodeEventTrigger",
        "must be a boolean, got string",
    ),
    (
        "legacy-min-gt-max",
        "schedulerConfigs:\n- {name: agent-scheduler, type: agent, cpuUtilizationMin: 0.9, cpuUtilizationMax: 0.7}\n",
        "schedulerConfigs[0].cpuUtilizationMin",
        "must be <= cpuUtilizationMax",
    ),
    (
        "legacy-maxNodes-below-min",
        "schedulerConfigs:\n- {name: agent-scheduler, type: agent, cpuUtilizationMin: 0.7, minNodes: 5, maxNodes: 2}\n",
        "schedulerConfigs[0].minNodes",
        "must be <= maxNodes",
    ),
]


@pytest.mark.parametrize(
    ("text", "path", "reason"), [c[1:] for c in SHARDING_CASES], ids=[c[0] for c in SHARDING_CASES]
)
def test_invalid_sharding_yaml_is_rejected_with_its_path(text: str, path: str, reason: str) -> None:
    with pytest.raises(PolicyConfigError) as caught:
        parse_configmap({SHARDING_KEY: text})
    err = caught.value
    assert (err.source, err.path) == (SHARDING_KEY, path)
    assert reason in err.reason
    assert str(err).startswith(f"{SHARDING_KEY}: {path}: " if path else f"{SHARDING_KEY}: ")


def test_brief_example_message() -> None:
    with pytest.raises(PolicyConfigError) as caught:
        parse_configmap({SHARDING_KEY: mutated((*ARGS1, "maxCPUUtil"), 0.5)})
    assert str(caught.value) == (
        "sharding.yaml: schedulerConfigs[1].policies[0].arguments.minCPUUtil: must be <= maxCPUUtil (got 0.7 > 0.5)"
    )


SETTINGS_CASES = [
    ("settings-yaml-syntax", "shards: {bandHysteresis: 0.1\n", "", "invalid YAML"),
    ("settings-not-mapping", "[1, 2]\n", "", "must be a mapping"),
    ("settings-unknown-section", "dispach: {candidatesPerPod: 2}\n", "dispach", "unknown field"),
    ("settings-section-not-mapping", "rebalance: 15\n", "rebalance", "must be a mapping"),
    ("settings-unknown-key", "shards: {maxMoves: 3}\n", "shards.maxMoves", "unknown field"),
    (
        "band-hysteresis-too-wide",
        "shards: {bandHysteresis: 0.9}\n",
        "shards.bandHysteresis",
        "must be <= 0.5",
    ),
    ("rank-hysteresis-negative", "shards: {rankHysteresis: -1}\n", "shards.rankHysteresis", "must be >= 0"),
    ("moves-negative", "shards: {maxMovesPerSync: -1}\n", "shards.maxMovesPerSync", "must be >= 0"),
    (
        "residence-by-scheduler-not-mapping",
        "shards: {minResidenceSecondsByScheduler: 5}\n",
        "shards.minResidenceSecondsByScheduler",
        "must be a mapping",
    ),
    (
        "residence-by-scheduler-negative",
        "shards: {minResidenceSecondsByScheduler: {volcano: -1}}\n",
        "shards.minResidenceSecondsByScheduler.volcano",
        "must be >= 0",
    ),
    (
        "residence-by-scheduler-not-number",
        "shards: {minResidenceSecondsByScheduler: {volcano: soon}}\n",
        "shards.minResidenceSecondsByScheduler.volcano",
        "must be a number",
    ),
    (
        "residence-negative",
        "shards: {minResidenceSeconds: -5}\n",
        "shards.minResidenceSeconds",
        "must be >= 0",
    ),
    ("start-skew-zero", "rebalance: {startSkew: 0}\n", "rebalance.startSkew", "must be > 0"),
    ("stop-skew-negative", "rebalance: {stopSkew: -0.1}\n", "rebalance.stopSkew", "must be >= 0"),
    (
        "stop-skew-above-start",
        "rebalance: {startSkew: 0.2, stopSkew: 0.3}\n",
        "rebalance.stopSkew",
        "must be <= startSkew",
    ),
    ("start-skew-string", "rebalance: {startSkew: high}\n", "rebalance.startSkew", "must be a number"),
    (
        "moves-per-round-zero",
        "rebalance: {maxNodeMovesPerRound: 0}\n",
        "rebalance.maxNodeMovesPerRound",
        ">= 1",
    ),
    (
        "transit-fraction-above-one",
        "rebalance: {maxNodesInTransitFraction: 1.5}\n",
        "rebalance.maxNodesInTransitFraction",
        "must be <= 1",
    ),
    (
        "moves-per-round-null",
        "rebalance: {maxNodeMovesPerRound: null}\n",
        "rebalance.maxNodeMovesPerRound",
        "must be an integer, got null",
    ),
]


@pytest.mark.parametrize(
    ("text", "path", "reason"), [c[1:] for c in SETTINGS_CASES], ids=[c[0] for c in SETTINGS_CASES]
)
def test_invalid_settings_are_rejected_with_their_path(text: str, path: str, reason: str) -> None:
    valid = mutated(("shardSyncPeriod",), "60s")
    with pytest.raises(PolicyConfigError) as caught:
        parse_configmap({SHARDING_KEY: valid, SETTINGS_KEY: text})
    err = caught.value
    assert (err.source, err.path) == (SETTINGS_KEY, path)
    assert reason in err.reason


def test_missing_sharding_key_is_rejected() -> None:
    for data in (None, {}, {SETTINGS_KEY: ""}):
        with pytest.raises(PolicyConfigError) as caught:
            parse_configmap(data)
        assert caught.value.source == SHARDING_KEY
        assert "missing" in str(caught.value)


def test_legacy_entry_without_a_band_is_rejected() -> None:
    text = "schedulerConfigs:\n- {name: agent-scheduler, type: agent, preferWarmupNodes: true, maxNodes: 5}\n"
    with pytest.raises(PolicyConfigError) as caught:
        parse_configmap({SHARDING_KEY: text})
    assert caught.value.path == "schedulerConfigs[0].policies"
