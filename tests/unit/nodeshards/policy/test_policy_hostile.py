"""Hostile ConfigMaps: whoever may edit the sharding ConfigMap cannot hurt the leader.

Every case is rejected with a short ``PolicyConfigError`` in bounded time and memory (peak measured with
``tracemalloc``), with libyaml's parser and with PyYAML's own, and through ``PolicySource`` it becomes one
Warning event while the last good policy stays in force. Realistic policies near the limits are still accepted.
"""

from __future__ import annotations

import random
import time
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest
import yaml

from coordinator.nodeshards import REASON_INVALID
from coordinator.nodeshards.policy import (
    SETTINGS_KEY,
    SHARDING_KEY,
    PolicyConfigError,
    parse_configmap,
    safeyaml,
)
from coordinator.nodeshards.policy.errors import MAX_PATH, MAX_REASON, MAX_SOURCE
from tests.unit.nodeshards.helpers import SHARDING, configmap
from tests.unit.nodeshards.test_configsource import source

GOOD = SHARDING % 3
MIB = 1024 * 1024
PEAK_BOUND = 50 * MIB  # generous: the worst case measured is well under 1 MiB
# A guard against runaway work (an unbounded case takes minutes of CPU or never ends), not a speed test: CPU
# seconds of this process, so a loaded machine (the wall clock of one case reached 69 s at load 20) cannot fail it.
HANG = 60.0
MESSAGE_BOUND = MAX_SOURCE + MAX_PATH + MAX_REASON + 10  # the key, the path and the reason, each cut


def _laughs(levels: int, width: int, *, as_key: bool) -> str:
    """Billion laughs: each anchor a list of ``width`` aliases of the previous one; the last used as a value or
    as a mapping key (whose ``repr`` in an error message used to exhaust memory)."""
    lines = [f"a0: &a0 [{', '.join(['lol'] * width)}]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    last = f"*a{levels - 1}"
    lines.append(f"? {last}\n: x" if as_key else f"boom: {last}")
    return "\n".join(lines) + "\n"


def _garbage(size: int) -> str:
    rng = random.Random(7)
    return bytes(rng.randrange(256) for _ in range(size)).decode("latin-1")


ALIAS_BOMB_KEY = _laughs(9, 9, as_key=True)
assert len(ALIAS_BOMB_KEY) < 1024  # a few hundred bytes

# (id, ConfigMap data, fragment the message must contain)
# the data is Any-keyed: a hostile ConfigMap may carry a key that is not a string
CASES: list[tuple[str, Callable[[], dict[Any, Any]], str]] = [
    ("alias-bomb-as-key", lambda: {SHARDING_KEY: GOOD + ALIAS_BOMB_KEY}, "not allowed in the policy"),
    (
        "billion-laughs",
        lambda: {SHARDING_KEY: GOOD + _laughs(9, 10, as_key=False)},
        "not allowed in the policy",
    ),
    ("alias-without-anchor", lambda: {SHARDING_KEY: GOOD + "extra: *nowhere\n"}, "aliases"),
    ("anchor-alone", lambda: {SHARDING_KEY: GOOD + "extra: &a 1\n"}, "anchors"),
    (
        "merge-key",
        lambda: {SHARDING_KEY: "base: &b {type: agent}\nschedulerConfigs:\n  - {<<: *b, name: a}\n"},
        "anchors",
    ),
    ("alias-bomb-in-settings", lambda: {SHARDING_KEY: GOOD, SETTINGS_KEY: ALIAS_BOMB_KEY}, SETTINGS_KEY),
    ("deep-flow-sequence", lambda: {SHARDING_KEY: "x: " + "[" * 20_000 + "]" * 20_000}, "nest"),
    ("deep-flow-mapping", lambda: {SHARDING_KEY: "x: " + "{a: " * 12_000 + "}" * 12_000}, "nest"),
    ("deep-flow-mapping-keys", lambda: {SHARDING_KEY: "x: " + "{" * 20_000 + "}" * 20_000}, "nest"),
    (
        "deep-block-sequence",
        lambda: {SHARDING_KEY: "x:\n  " + "- " * 20_000 + "y\n"},
        "nested deeper than 32",
    ),
    (
        "deep-block-mapping",
        lambda: {SHARDING_KEY: "".join(" " * i + "a:\n" for i in range(40)) + " " * 40 + "b\n"},
        "nested deeper than 32",
    ),
    ("deep-in-settings", lambda: {SHARDING_KEY: GOOD, SETTINGS_KEY: "[" * 20_000 + "]" * 20_000}, "nest"),
    (
        "int-5000-digits",
        lambda: {SHARDING_KEY: GOOD.replace("maxNodes: 3", "maxNodes: " + "9" * 5000)},
        "1024",
    ),
    (
        "int-5000-digits-tagged",
        lambda: {SHARDING_KEY: GOOD.replace("maxNodes: 3", 'maxNodes: !!int "' + "9" * 5000 + '"')},
        "longer than 1024",
    ),
    (
        "int-100-digits",
        lambda: {SHARDING_KEY: GOOD.replace("maxNodes: 3", "maxNodes: " + "9" * 100)},
        "integer literal of 100 characters is longer than 64",
    ),
    (
        "int-in-settings",
        lambda: {SHARDING_KEY: GOOD, SETTINGS_KEY: "shards: {maxMovesPerSync: " + "7" * 4400 + "}\n"},
        "longer than 1024",
    ),
    (
        "float-100-digits",
        lambda: {SHARDING_KEY: GOOD + "extra: 0." + "1" * 100 + "\n"},
        "float literal of 102 characters",
    ),
    (
        "duration-5000-digits",
        lambda: {SHARDING_KEY: GOOD.replace('"2s"', '"' + "9" * 1000 + 's"')},
        "too long",
    ),
    ("duration-70-chars", lambda: {SHARDING_KEY: GOOD.replace('"2s"', '"' + "1" * 69 + 's"')}, "too long"),
    ("string-1mib-policy-key", lambda: {SHARDING_KEY: GOOD + "x: " + "a" * MIB + "\n"}, "at most 64 KiB"),
    ("string-1mib-other-key", lambda: {SHARDING_KEY: GOOD, "blob": "a" * MIB}, "ConfigMap data too large"),
    (
        "many-keys-over-total",
        lambda: {SHARDING_KEY: GOOD, **{f"k{i}": "a" * 60_000 for i in range(5)}},
        "ConfigMap data too large",
    ),
    (
        "multibyte-over-key-cap",
        lambda: {SHARDING_KEY: GOOD + "x: '" + "\u00e9" * 40_000 + "'\n"},
        "at most 64 KiB",
    ),
    ("string-2000-chars", lambda: {SHARDING_KEY: GOOD + "x: " + "a" * 2000 + "\n"}, "longer than 1024"),
    (
        "name-1000-chars",
        lambda: {SHARDING_KEY: GOOD.replace("name: agent", "name: " + "a" * 1000)},
        "not a valid NodeShard name",
    ),
    (
        "unknown-policy-long-name",
        lambda: {SHARDING_KEY: GOOD.replace("{name: warmup,", "{name: " + "w" * 1000 + ",")},
        "unknown policy",
    ),
    (
        "too-many-values",
        lambda: {SHARDING_KEY: GOOD + "x: [" + ",".join(["1"] * 10_001) + "]\n"},
        "10000 values",
    ),
    ("tab-indent", lambda: {SHARDING_KEY: "schedulerConfigs:\n\t- name: a\n"}, "invalid YAML"),
    ("nul-byte", lambda: {SHARDING_KEY: GOOD + "x: a\x00b\n"}, "invalid YAML"),
    ("control-char", lambda: {SHARDING_KEY: GOOD + "x: a\x07b\n"}, "invalid YAML"),
    ("lone-surrogate", lambda: {SHARDING_KEY: GOOD + "x: a\ud800b\n"}, "invalid YAML"),
    (
        "right-to-left-override-in-name",
        lambda: {SHARDING_KEY: GOOD.replace("name: agent", "name: ag\u202eent")},
        "not a valid NodeShard name",
    ),
    (
        "zero-width-joiner-in-name",
        lambda: {SHARDING_KEY: GOOD.replace("name: agent", "name: age\u200dnt")},
        "not a valid NodeShard name",
    ),
    ("binary-garbage", lambda: {SHARDING_KEY: _garbage(4096)}, "sharding.yaml"),
    ("binary-garbage-60k", lambda: {SHARDING_KEY: _garbage(60_000)}, "sharding.yaml"),
    ("top-level-list", lambda: {SHARDING_KEY: "- a\n- b\n"}, "must be a mapping, got list"),
    ("top-level-scalar", lambda: {SHARDING_KEY: "'" + "a" * 1000 + "'\n"}, "must be a mapping, got string"),
    ("top-level-empty", lambda: {SHARDING_KEY: "# nothing\n"}, "must be a mapping, got empty document"),
    ("two-documents", lambda: {SHARDING_KEY: GOOD + "---\n" + GOOD}, "another document"),
    (
        "duplicate-key",
        lambda: {SHARDING_KEY: GOOD + 'shardSyncPeriod: "5s"\n'},
        "duplicate key 'shardSyncPeriod'",
    ),
    ("list-as-key", lambda: {SHARDING_KEY: GOOD + "? [a, b]\n: 1\n"}, "mapping key <list> is not a string"),
    ("int-as-key", lambda: {SHARDING_KEY: GOOD + "1: x\n"}, "mapping key 1 is not a string"),
    (
        "python-tag",
        lambda: {SHARDING_KEY: GOOD + "x: !!python/object/apply:os.system [true]\n"},
        "invalid YAML",
    ),
    ("unknown-tag", lambda: {SHARDING_KEY: GOOD + "x: !custom 1\n"}, "invalid YAML"),
    ("bad-binary", lambda: {SHARDING_KEY: GOOD + "x: !!binary 'a'\n"}, "invalid YAML"),
    ("value-not-a-string", lambda: {SHARDING_KEY: 42}, "value is not a string"),
    ("key-not-a-string", lambda: {SHARDING_KEY: GOOD, 7: "x"}, "ConfigMap data key 7 is not a string"),
]
IDS = [case[0] for case in CASES]


@pytest.fixture(params=["libyaml", "python"])
def parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Run with libyaml's parser (when PyYAML has it) and with PyYAML's own, the fallback."""
    if request.param == "libyaml":
        if not hasattr(yaml, "CSafeLoader"):
            pytest.skip("PyYAML built without libyaml")
        # the stubs do not relate libyaml's loader to SafeLoader; the product takes it as one (safeyaml._Base)
        base = cast("type[yaml.SafeLoader]", yaml.CSafeLoader)
    else:
        base = yaml.SafeLoader
    monkeypatch.setattr(safeyaml, "_Base", base)
    monkeypatch.setattr(safeyaml, "_PolicyLoader", safeyaml.policy_loader(base))
    yield request.param


def _measured(call: Callable[[], object]) -> tuple[BaseException | None, float, int]:
    """Run ``call``; return what it raised, the CPU seconds it took and its peak traced memory in bytes."""
    tracemalloc.start()
    started = time.process_time()
    raised: BaseException | None = None
    try:
        call()
    except Exception as e:
        raised = e
    elapsed = time.process_time() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return raised, elapsed, peak


@pytest.mark.parametrize(("kind", "build", "fragment"), CASES, ids=IDS)
def test_hostile_configmap_is_rejected_short_and_bounded(
    parser: str, kind: str, build: Callable[[], dict[str, Any]], fragment: str
) -> None:
    data = build()
    raised, elapsed, peak = _measured(lambda: parse_configmap(data))
    assert isinstance(raised, PolicyConfigError), (kind, type(raised), str(raised)[:300])
    message = str(raised)
    assert fragment in message, (kind, message)
    assert len(message) <= MESSAGE_BOUND, (kind, len(message))
    assert peak < PEAK_BOUND, (kind, peak)
    assert elapsed < HANG, (kind, elapsed)


@pytest.mark.parametrize(("kind", "build", "fragment"), CASES, ids=IDS)
def test_hostile_configmap_keeps_the_last_good_policy(
    kind: str, build: Callable[[], dict[str, Any]], fragment: str, caplog: pytest.LogCaptureFixture
) -> None:
    src, emitted, _ = source()
    src.event("ADDED", configmap({SHARDING_KEY: GOOD}, "10"))
    good = src.current
    assert good is not None
    hostile = configmap(build(), "11")
    raised, _, peak = _measured(lambda: src.event("MODIFIED", hostile))
    assert raised is None, (kind, type(raised))
    assert src.current is good and src.agent is not None and src.agent.name == "agent"
    assert src.origin == "configmap ns/cm@10"
    type_, reason, message = emitted.events[-1]
    assert (type_, reason) == ("Warning", REASON_INVALID)
    assert fragment in message and "resourceVersion 11" in message, (kind, message)
    assert f"keeping policy {good.version}" in message
    assert len(message) <= MESSAGE_BOUND + 100, (kind, len(message))
    assert src.last_verdict is not None and not src.last_verdict.accepted
    assert peak < PEAK_BOUND, (kind, peak)
    logged = [r.getMessage() for r in caplog.records if "rejected (resourceVersion 11)" in r.getMessage()]
    assert len(logged) == 1 and fragment in logged[0] and len(logged[0]) <= MESSAGE_BOUND + 200, logged
    # and the next good edit is applied
    src.event("MODIFIED", configmap({SHARDING_KEY: SHARDING % 4}, "12"))
    assert src.current is not None and src.current.version != good.version


def test_an_unexpected_parser_failure_is_a_rejection_too(monkeypatch: pytest.MonkeyPatch) -> None:
    src, emitted, _ = source()
    src.event("ADDED", configmap({SHARDING_KEY: GOOD}, "10"))
    good = src.current

    def broken(data: object) -> object:
        raise RuntimeError("x" * MIB)

    monkeypatch.setattr("coordinator.nodeshards.configsource.parse_configmap", broken)
    src.event("MODIFIED", configmap({SHARDING_KEY: GOOD}, "11"))
    assert src.current is good
    type_, reason, message = emitted.events[-1]
    assert (type_, reason) == ("Warning", REASON_INVALID)
    assert "could not be validated (RuntimeError: xxx" in message and len(message) < 400


def test_data_that_is_not_a_mapping_is_rejected() -> None:
    src, emitted, _ = source()
    src.event("ADDED", configmap({SHARDING_KEY: GOOD}, "10"))
    obj = configmap(None, "11")
    obj["data"] = ["sharding.yaml", GOOD]
    src.event("MODIFIED", obj)
    assert emitted.events[-1][1] == REASON_INVALID and "not a mapping" in emitted.events[-1][2]


# ---- what the limits still accept ----


def _large_policy(schedulers: int) -> str:
    entries = "".join(
        f"""\
  - name: sched-{i:03d}
    type: {"agent" if i == 0 else "volcano"}
    policies:
      - {{name: allocation-rate, weight: 1, arguments: {{minCPUUtil: 0.0, maxCPUUtil: 0.6}}}}
      - {{name: warmup, weight: 5, arguments: {{warmupLabel: node.volcano.sh/warmup, warmupLabelValue: "true"}}}}
      - {{name: node-limit, arguments: {{minNodes: 0, maxNodes: 100}}}}
"""
        for i in range(schedulers)
    )
    return f"# sharding for a large cluster\nschedulerConfigs:\n{entries}shardSyncPeriod: 1m30s\n"


def test_a_large_realistic_policy_is_accepted(parser: str) -> None:
    text = _large_policy(100)
    assert len(text) < safeyaml.MAX_KEY_BYTES
    policy = parse_configmap({SHARDING_KEY: text})
    assert len(policy.sharding.schedulers) == 100


def test_values_just_inside_the_limits_are_accepted(parser: str) -> None:
    nested = "[" * (safeyaml.MAX_DEPTH - 2) + "x" + "]" * (safeyaml.MAX_DEPTH - 2)
    extras = (
        f"deep: {nested}\n"
        f"bigint: {'9' * safeyaml.MAX_NUMBER_CHARS}\n"
        f"text: {'a' * safeyaml.MAX_SCALAR_CHARS}\n"
        "when: 2001-02-30\n"  # an impossible timestamp is a string, as in Kubernetes
    )
    policy = parse_configmap({SHARDING_KEY: GOOD + extras})
    assert len(policy.warnings) == 4  # the four unknown top-level fields, ignored
    assert all(len(w) < 200 for w in policy.warnings)


def test_shown_never_renders_a_huge_value() -> None:
    assert safeyaml.shown("abc") == "'abc'"
    assert safeyaml.shown("a" * 10_000) == repr("a" * safeyaml.MAX_SHOWN) + "... (10000 characters)"
    assert safeyaml.shown(10**5000) == "<integer of 16610 bits>"
    assert safeyaml.shown([[1] * 1000] * 1000) == "<list>"
    assert safeyaml.shown(True) == "True" and safeyaml.shown(None) == "None" and safeyaml.shown(1.5) == "1.5"


def test_error_parts_are_cut() -> None:
    e = PolicyConfigError("p" * 10_000, "r" * 10_000, source="s" * 10_000)
    assert (
        len(e.path) == MAX_PATH
        and e.source is not None
        and len(e.source) == MAX_SOURCE
        and len(e.reason) == MAX_REASON
        and len(str(e)) <= MESSAGE_BOUND
    )
    assert len(str(e.in_source("sharding.yaml"))) <= MESSAGE_BOUND
