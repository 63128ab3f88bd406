"""The command line as an operator meets it: ``--version``, and one-line errors instead of tracebacks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agent_scheduler import cli


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = cli.main(list(argv))
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_version_is_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--version")
    assert code == 0
    assert out.strip() == f"agent-scheduler {cli.version()}"
    assert cli.version() != "unknown"


def test_a_bad_flag_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "status", "--no-such-flag")
    assert code == 2
    assert err.count("\n") == 1
    assert "unrecognized arguments: --no-such-flag" in err


def test_a_bad_flag_value_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "worker", "--lease-ttl", "ten")
    assert code == 2
    assert err.count("\n") == 1
    assert "--lease-ttl" in err


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "no such file"),
        ("", "empty"),
        (":::: not yaml [", "current-context"),
        ("apiVersion: v1\nkind: Config\nclusters: []\n", "current-context"),
    ],
)
def test_a_bad_kubeconfig_is_one_line_exit_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str | None, expected: str
) -> None:
    path = tmp_path / "kubeconfig"
    if content is not None:
        path.write_text(content)
    for role in ("worker", "coordinator"):
        code, _, err = run(capsys, role, "--kubeconfig", str(path))
        assert code == 1
        assert err.count("\n") == 1, err
        assert err.startswith(f"agent-scheduler {role}: error: kubeconfig {path}")
        assert expected in err
        assert "Traceback" not in err


def test_a_directory_as_kubeconfig(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "worker", "--kubeconfig", str(tmp_path))
    assert (code, err.count("\n")) == (1, 1)
    assert "not a file" in err


def test_no_kubeconfig_outside_a_pod(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    code, _, err = run(capsys, "coordinator")
    assert (code, err.count("\n")) == (1, 1)
    assert "not running in a pod" in err


def test_development_commands_without_scale_say_so(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # An installation without the scale package (the container image): importing it fails.
    for name in [m for m in sys.modules if m == "scale" or m.startswith("scale.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "scale", None)
    for command in ("cluster", "bench", "demo"):
        code, _, err = run(capsys, command, "--help")
        assert (code, err.count("\n")) == (1, 1), err
        assert "development command" in err
