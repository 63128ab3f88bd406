"""``--config``: a versioned YAML document per role, validated with field paths, overridden by flags."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from agent_scheduler import cli
from agent_scheduler.config import API_VERSION, ConfigError, field_name, load

WORKER = f"apiVersion: {API_VERSION}\nkind: WorkerConfiguration\n"
COORDINATOR = f"apiVersion: {API_VERSION}\nkind: CoordinatorConfiguration\n"


def parse(*argv: str) -> argparse.Namespace:
    parser = cli._build_parser(argv[0])
    args = parser.parse_args(list(argv))
    return cli._apply_config(parser, args, list(argv))


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return str(path)


def test_field_names_are_the_flags_in_camel_case() -> None:
    assert field_name("--kube-api-qps") == "kubeApiQps"
    assert field_name("--lease-ttl") == "leaseTtl"
    assert field_name("--standalone") == "standalone"


def test_the_file_sets_and_flags_override(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        WORKER + "leaseTtl: 7\nkubeApiQps: 500\nstrategy: LeastAllocated\nscoreWeight: [MostAllocated=2]\n"
        "noScheduledEvents: true\nschedulerName: sandboxes\n",
    )
    args = parse("worker", "--config", path, "--kube-api-qps", "900")
    assert (args.lease_ttl, args.kube_api_qps, args.strategy) == (7, 900.0, "LeastAllocated")
    assert args.score_weight == ["MostAllocated=2"]
    assert args.no_scheduled_events is True
    assert args.scheduler_name == "sandboxes"
    plain = parse("worker")
    assert (plain.lease_ttl, plain.kube_api_qps) == (10, 2000.0)


def test_coordinator_documents(tmp_path: Path) -> None:
    path = write(tmp_path, COORDINATOR + "agentNodeSelector: pool=agents\npolicyNamespace: volcano-system\n")
    args = parse("coordinator", "--config", path)
    assert (args.agent_node_selector, args.policy_namespace) == ("pool=agents", "volcano-system")
    assert args.policy_configmap is None  # absent from the file: the label pool until the ConfigMap exists


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (WORKER + "leaseTtl: ten\n", "leaseTtl: expected an integer, got 'ten'"),
        (WORKER + "leaseTtl: 1.5\n", "leaseTtl: expected an integer"),
        (WORKER + "kubeApiQps: [1]\n", "kubeApiQps: expected a number"),
        (WORKER + "strategy: Random\n", "strategy: 'Random' is not one of MostAllocated, LeastAllocated"),
        (WORKER + "standalone: yes please\n", "standalone: expected true or false"),
        (WORKER + "scoreWeight: MostAllocated=2\n", "scoreWeight: expected a list"),
        (WORKER + "scoreWeight: [1, {a: b}]\n", "scoreWeight[0]: expected a string"),
        (WORKER + "schedulerName: 5\n", "schedulerName: expected a string"),
        (WORKER + "leaseTTL: 5\n", "leaseTTL: unknown field (known: "),
        (COORDINATOR + "leaseTtl: 5\n", "kind: expected WorkerConfiguration"),
        ("apiVersion: v1\nkind: WorkerConfiguration\n", f"apiVersion: expected {API_VERSION}"),
        (WORKER + "---\n" + WORKER, "expected one YAML mapping"),
        ("[1, 2]\n", "expected one YAML mapping"),
        (WORKER + "leaseTtl: [\n", "not YAML"),
        (WORKER + "eventLoop: trio\n", "eventLoop: 'trio' is not an event loop: choose uvloop or asyncio"),
        (WORKER + "eventLoop: 3\n", "eventLoop: 3 is not an event loop"),
    ],
)
def test_errors_name_the_file_and_field(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    parser = cli._build_parser("worker")
    with pytest.raises(ConfigError) as e:
        load(path, "worker", parser._defaults["_subparser"])
    assert str(e.value).startswith(f"{path}: ")
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_a_bad_file_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, WORKER + "leaseTtl: ten\n")
    assert cli.main(["worker", "--config", path]) == 2
    err = capsys.readouterr().err
    assert err == f"agent-scheduler worker: error: config {path}: leaseTtl: expected an integer, got 'ten'\n"
    assert cli.main(["worker", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "No such file" in capsys.readouterr().err


def test_warm_connections_default_to_the_binding_concurrency_and_refuse_a_negative_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from worker import command

    assert (
        command.settings_from(parse("worker")).api.warm_connections is None
    )  # Scheduler: --bind-concurrency
    path = write(tmp_path, WORKER + "warmConnections: 8\n")
    assert command.settings_from(parse("worker", "--config", path)).api.warm_connections == 8
    assert command.settings_from(parse("worker", "--warm-connections", "0")).api.warm_connections == 0
    assert command.run(parse("worker", "--warm-connections", "-1")) == 2
    assert "--warm-connections must be 0 or more" in capsys.readouterr().err


def test_the_event_loop_comes_from_the_flag_the_file_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("AGENT_SCHEDULER_EVENT_LOOP", raising=False)
    assert parse("worker").event_loop == "uvloop"
    assert parse("coordinator", "--event-loop", "asyncio").event_loop == "asyncio"
    path = write(tmp_path, WORKER + "eventLoop: asyncio\n")
    assert parse("worker", "--config", path).event_loop == "asyncio"
    monkeypatch.setenv("AGENT_SCHEDULER_EVENT_LOOP", "asyncio")
    assert parse("worker").event_loop == "asyncio"
    assert parse("worker", "--event-loop", "uvloop").event_loop == "uvloop"
    # A bad environment value is a usage error of the command, not a crash later.
    monkeypatch.setenv("AGENT_SCHEDULER_EVENT_LOOP", "tornado")
    with pytest.raises(SystemExit) as e:
        cli.main(["worker", "--standalone"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument --event-loop: 'tornado' is not an event loop: choose uvloop or asyncio" in err
