"""Accepting configurations: Volcano's own examples verbatim, normalisation, defaults, versions."""

from __future__ import annotations

import logging

import pytest
import yaml

from coordinator.nodeshards.policy import (
    SETTINGS_KEY,
    SHARDING_KEY,
    AgentSchedulerSettings,
    EffectivePolicy,
    RebalanceSettings,
    default_policy,
    parse_configmap,
    parse_settings,
)
from coordinator.nodeshards.policy.durations import DurationError, parse_go_duration
from coordinator.workershards.assignment import AssignmentConfig
from tests.unit.nodeshards.policy._policy_builders import HERE, configmap_data


def test_volcano_user_guide_configmap_is_accepted_verbatim(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        policy = parse_configmap(configmap_data("volcano_user_guide_configmap.yaml"))
    agent, volcano = policy.sharding.schedulers
    assert (agent.name, agent.type, volcano.name, volcano.type) == (
        "agent-scheduler",
        "agent",
        "volcano",
        "volcano",
    )
    # Flat fields converted the way Volcano converts them.
    assert agent.to_dict()["policies"] == [
        {"name": "allocation-rate", "weight": 1, "arguments": {"minCPUUtil": 0.7, "maxCPUUtil": 1.0}},
        {
            "name": "warmup",
            "weight": 1,
            "arguments": {"warmupLabel": "node.volcano.sh/warmup", "warmupLabelValue": "true"},
        },
        {"name": "node-limit", "weight": 1, "arguments": {"minNodes": 1, "maxNodes": 100}},
    ]
    assert [e.plugin.name for e in volcano.policies] == ["allocation-rate", "node-limit"]
    assert policy.sharding.shard_sync_period_seconds == 60.0
    assert policy.sharding.enable_node_event_trigger is True
    assert any("deprecated" in w for w in policy.warnings)
    assert "deprecated" in caplog.text


def test_volcano_example_configmap_with_comments_is_accepted_verbatim() -> None:
    policy = parse_configmap(configmap_data("volcano_example_configmap.yaml"))
    assert [s.name for s in policy.sharding.schedulers] == ["agent-scheduler", "volcano"]
    # Same content as the user guide's, so the same normalised policy and version.
    assert policy.version == parse_configmap(configmap_data("volcano_user_guide_configmap.yaml")).version


def test_volcano_policy_readme_example_is_accepted_without_warnings() -> None:
    text = (HERE / "volcano_policy_readme_sharding.yaml").read_text(encoding="utf-8")
    policy = parse_configmap({SHARDING_KEY: text})
    assert policy.warnings == ()
    volcano, agent = policy.sharding.schedulers
    assert [e.weight for e in volcano.policies] == [1, 2, 1]
    assert agent.policies[1].to_dict() == {
        "name": "warmup",
        "weight": 5,
        "arguments": {"warmupLabel": "node.volcano.sh/warmup", "warmupLabelValue": "true"},
    }
    assert policy.sharding.shard_sync_period_seconds == 60.0  # default when absent
    assert policy.agent_scheduler() is agent
    assert policy.agent_scheduler("agent-scheduler") is agent
    with pytest.raises(LookupError):
        policy.agent_scheduler("volcano")


def test_project_configmap_manifest_parses_cleanly() -> None:
    doc = yaml.safe_load(
        (HERE.parents[3] / "manifests" / "configmap-sharding.yaml").read_text(encoding="utf-8")
    )
    policy = parse_configmap(doc["data"])
    assert policy.warnings == ()
    assert policy.settings == AgentSchedulerSettings()  # the manifest documents the defaults


def test_unknown_top_level_field_is_ignored_with_a_warning() -> None:
    text = (HERE / "volcano_policy_readme_sharding.yaml").read_text(encoding="utf-8")
    plain = parse_configmap({SHARDING_KEY: text})
    extra = parse_configmap({SHARDING_KEY: text + "futureVolcanoOption: 3\n", "other": "x"})
    assert extra.version == plain.version
    assert extra.warnings == (
        "sharding.yaml: futureVolcanoOption: unknown top-level field ignored",
        "other: unknown ConfigMap key ignored",
    )


def test_legacy_fields_beside_policies_are_ignored_with_a_warning() -> None:
    text = """
schedulerConfigs:
  - name: agent-scheduler
    type: agent
    cpuUtilizationMin: 0.1
    maxNodes: 7
    policies:
      - {name: allocation-rate, arguments: {minCPUUtil: 0.5}}
"""
    policy = parse_configmap({SHARDING_KEY: text})
    (agent,) = policy.sharding.schedulers
    assert agent.to_dict()["policies"] == [
        {"name": "allocation-rate", "weight": 1, "arguments": {"minCPUUtil": 0.5, "maxCPUUtil": 1.0}},
        {"name": "node-limit", "weight": 1, "arguments": {"minNodes": 0, "maxNodes": 7}},
    ]
    assert any("cpuUtilizationMin ignored" in w for w in policy.warnings)


def test_other_scheduler_types_are_accepted() -> None:
    text = """
schedulerConfigs:
  - {name: kube-batch, type: batch, policies: [{name: warmup}]}
  - {name: agent-scheduler, type: agent, policies: [{name: allocation-rate, arguments: {minCPUUtil: 0.7}}]}
"""
    policy = parse_configmap({SHARDING_KEY: text})
    assert [s.type for s in policy.sharding.schedulers] == ["batch", "agent"]


def test_version_ignores_formatting_and_tracks_meaning() -> None:
    text = (HERE / "volcano_policy_readme_sharding.yaml").read_text(encoding="utf-8")
    base = parse_configmap({SHARDING_KEY: text})
    reformatted = yaml.safe_dump(yaml.safe_load(text), default_flow_style=True) + "# a comment\n"
    assert parse_configmap({SHARDING_KEY: reformatted}).version == base.version
    assert parse_configmap({SHARDING_KEY: text + 'shardSyncPeriod: "1m"\n'}).version == base.version
    assert parse_configmap({SHARDING_KEY: text.replace("weight: 5", "weight: 4")}).version != base.version
    tuned = parse_configmap({SHARDING_KEY: text, SETTINGS_KEY: "shards: {maxMovesPerSync: 5}"})
    assert tuned.version != base.version
    assert len(base.version) == 12 and int(base.version, 16) >= 0


def test_summary_is_compact_and_names_everything() -> None:
    policy = parse_configmap(configmap_data("volcano_user_guide_configmap.yaml"))
    summary = policy.summary()
    assert summary.splitlines()[0] == f"policy {policy.version}: sync every 60s, node events on"
    assert (
        "1. agent-scheduler [agent]: util 0.70-1.00 x1, warm node.volcano.sh/warmup=true x1, nodes 1..100"
        in summary
    )
    assert "2. volcano [volcano]: util 0.00-0.69 x1, nodes 1..100" in summary
    assert "moves/sync 50" in summary and "warnings: " in summary
    # Only what acts: the rebalancing the assignment runs on; no lease TTL or wire intervals (process settings).
    assert (
        "  workers: rebalance when skew > 0.25 until <= 0.1, at most max(32, 10% of the pool) nodes in transit"
        in summary
    )
    assert "lease" not in summary and "dispatch" not in summary and "candidates" not in summary
    assert len(summary.splitlines()) <= 8


def test_default_policy_is_volcanos_flag_defaults() -> None:
    policy = default_policy()
    assert isinstance(policy, EffectivePolicy)
    assert [(s.name, s.type) for s in policy.sharding.schedulers] == [
        ("volcano", "volcano"),
        ("agent-scheduler", "agent"),
    ]
    assert policy.warnings == ()
    assert default_policy() is policy


def test_settings_defaults_and_overrides() -> None:
    assert parse_settings("") == AgentSchedulerSettings()
    assert parse_settings("shards: null\nrebalance: {}\n") == AgentSchedulerSettings()
    settings = parse_settings(
        """
shards: {bandHysteresis: 0.1, rankHysteresis: 0, maxMovesPerSync: null}
rebalance: {startSkew: 0.5, stopSkew: 0.2, maxNodeMovesPerRound: 3}
"""
    )
    assert settings.shards.band_hysteresis == 0.1
    assert settings.shards.max_moves_per_sync is None
    assert settings.rebalance.start_skew == 0.5
    assert settings.rebalance.stop_skew == 0.2
    assert settings.rebalance.max_node_moves_per_round == 3
    assert settings.to_dict()["rebalance"] == {
        "startSkew": 0.5,
        "stopSkew": 0.2,
        "maxNodeMovesPerRound": 3,
        "maxNodesInTransitFraction": 0.1,
    }
    assert settings.to_dict()["shards"] == {
        "bandHysteresis": 0.1,
        "rankHysteresis": 0.0,
        "maxMovesPerSync": None,
    }


def test_settings_that_left_the_configmap_are_ignored_with_a_warning() -> None:
    text = (HERE / "volcano_policy_readme_sharding.yaml").read_text(encoding="utf-8")
    plain = parse_configmap({SHARDING_KEY: text, SETTINGS_KEY: "rebalance: {maxNodeMovesPerRound: 10}\n"})
    old = parse_configmap(
        {
            SHARDING_KEY: text,
            SETTINGS_KEY: """
rebalance: {skewThreshold: 1.25, hysteresis: 0.1, maxNodeMovesPerRound: 10}
lease: {ttlSeconds: 0}
dispatch: 15
""",
        }
    )
    assert old.settings == plain.settings and old.version == plain.version
    assert old.warnings == (
        "agent-scheduler.yaml: lease: no longer a setting, ignored; "
        "lease TTLs are process flags (--lease-ttl of each worker and coordinator)",
        "agent-scheduler.yaml: dispatch: no longer a setting, ignored; the wire intervals are protocol constants",
        "agent-scheduler.yaml: rebalance.skewThreshold: no longer a setting, ignored; "
        "use startSkew (skew is the difference of worker fills, not a ratio)",
        "agent-scheduler.yaml: rebalance.hysteresis: no longer a setting, ignored; use stopSkew",
    )
    assert "warnings: 4" in old.summary()


def test_rebalance_settings_are_the_assignments_configuration() -> None:
    assert RebalanceSettings().assignment_config() == AssignmentConfig()  # one set of defaults
    config = parse_settings("rebalance: {startSkew: 0.4, stopSkew: 0, maxNodeMovesPerRound: 5}").rebalance
    assert config.assignment_config() == AssignmentConfig(
        skew_threshold=0.4, settle_skew=0.0, max_moves_per_round=5
    )
    fixed = parse_settings("rebalance: {maxNodeMovesPerRound: 8, maxNodesInTransitFraction: 0}").rebalance
    assert fixed.assignment_config().transit_limit(100_000) == 8  # the fixed budget of before
    wide = parse_settings("rebalance: {maxNodesInTransitFraction: 0.25}").rebalance
    assert wide.assignment_config().transit_limit(100_000) == 25_000


@pytest.mark.parametrize(
    ("text", "nanos"),
    [
        ("60s", 60 * 10**9),
        ("1m30s", 90 * 10**9),
        ("1.5h", 5400 * 10**9),
        ("250ms", 250 * 10**6),
        (".5s", 5 * 10**8),
        ("1us", 1000),
        ("1\u00b5s", 1000),
        ("2h45m0.5s", 9900 * 10**9 + 5 * 10**8),
        ("0", 0),
        ("-5s", -5 * 10**9),
    ],
)
def test_go_durations(text: str, nanos: int) -> None:
    assert parse_go_duration(text) == nanos


@pytest.mark.parametrize("text", ["", "60", "1d", "s", "-", "5 s", "1..5s", "60S"])
def test_invalid_go_durations(text: str) -> None:
    with pytest.raises(DurationError):
        parse_go_duration(text)


def test_min_residence_is_parsed_and_a_policy_without_it_keeps_its_version() -> None:
    sharding = (HERE / "volcano_policy_readme_sharding.yaml").read_text(encoding="utf-8")
    plain = parse_configmap({SHARDING_KEY: sharding, SETTINGS_KEY: "shards: {maxMovesPerSync: 5}\n"})
    zero = parse_configmap(
        {SHARDING_KEY: sharding, SETTINGS_KEY: "shards: {maxMovesPerSync: 5, minResidenceSeconds: 0}\n"}
    )
    resting = parse_configmap(
        {SHARDING_KEY: sharding, SETTINGS_KEY: "shards: {maxMovesPerSync: 5, minResidenceSeconds: 12.5}\n"}
    )
    assert resting.settings.shards.min_residence_seconds == 12.5
    plain_shards, resting_shards = plain.settings.to_dict()["shards"], resting.settings.to_dict()["shards"]
    assert isinstance(plain_shards, dict) and isinstance(resting_shards, dict)
    assert "minResidenceSeconds" not in plain_shards  # the default is left out of the hash
    assert zero.version == plain.version  # so every policy written before the setting keeps its version
    assert resting.version != plain.version
    assert resting_shards["minResidenceSeconds"] == 12.5
    assert "residence 12.5s" in resting.summary()


def test_min_residence_by_scheduler_overrides_the_default_per_entry() -> None:
    settings = parse_settings(
        "shards: {minResidenceSeconds: 5, minResidenceSecondsByScheduler: {volcano: 200, agent-scheduler: 0}}\n"
    )
    shards = settings.shards
    assert shards.min_residence_by_scheduler == (("agent-scheduler", 0.0), ("volcano", 200.0))
    assert shards.residence("volcano") == 200.0
    assert shards.residence("agent-scheduler") == 0.0
    assert shards.residence("other") == shards.residence(None) == 5.0
    assert settings.to_dict()["shards"] == {
        "bandHysteresis": 0.05,
        "rankHysteresis": 0.05,
        "maxMovesPerSync": 50,
        "minResidenceSeconds": 5.0,
        "minResidenceSecondsByScheduler": {"agent-scheduler": 0.0, "volcano": 200.0},
    }
    assert hash(settings)  # still a hashable value
    default_shards = parse_settings("").to_dict()["shards"]
    assert isinstance(default_shards, dict) and "minResidenceSecondsByScheduler" not in default_shards
