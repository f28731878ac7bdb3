"""The ``n8n`` and ``outliers`` sections (DESIGN §6, "Configuration"): defaults, errors
with their paths, and ``loopstop check-config``."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_config import cli

from sidecar.config import Settings, load_settings
from sidecar.errors import ConfigError


def test_defaults_of_the_design() -> None:
    s = Settings.from_mapping({"n8n": {"api_url": "http://n8n:5678/api/v1"}})
    assert s.n8n is not None
    assert (s.n8n.api_key_env, s.n8n.timeout_s, s.n8n.confirm_s) == ("N8N_API_KEY", 5, 20)
    assert Settings.from_mapping({}).n8n is None
    o = Settings.from_mapping({}).outliers
    assert (o.factor, o.min_tasks, o.running_s, o.action) == (5, 20, 1800, "flag")


@pytest.mark.parametrize(
    ("section", "path"),
    [
        ({"n8n": {"api_url": "n8n:5678/api/v1"}}, "n8n"),
        ({"n8n": {"api_url": "ftp://n8n/api/v1"}}, "n8n"),
        ({"n8n": {"api_url": "http://n8n/api/v1?x=1"}}, "n8n"),
        ({"n8n": {"api_url": "http://n8n/api/v1", "timeout_s": 0}}, "n8n.timeout_s"),
        ({"n8n": {"api_url": "http://n8n/api/v1", "confirm_s": -1}}, "n8n.confirm_s"),
        ({"n8n": {"api_url": "http://n8n/api/v1", "api_key_env": "a-b"}}, "n8n.api_key_env"),
        ({"n8n": {"api_url": "http://n8n/api/v1", "key": "x"}}, "n8n.key"),
        ({"n8n": {}}, "n8n.api_url"),
        ({"outliers": {"factor": 1}}, "outliers.factor"),
        ({"outliers": {"min_tasks": 0}}, "outliers.min_tasks"),
        ({"outliers": {"action": "kill"}}, "outliers.action"),
        ({"outliers": {"running_s": float("nan")}}, "outliers.running_s"),
    ],
)
def test_errors_name_their_path(section: dict[str, object], path: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_mapping(section)
    assert path in {p for p, _ in info.value.problems}, info.value.problems


def test_the_key_variable_must_be_set() -> None:
    data = {"n8n": {"api_url": "http://n8n/api/v1", "api_key_env": "MY_N8N_KEY"}}
    with pytest.raises(ConfigError) as info:
        load_settings(data, {})
    assert ("n8n.api_key_env") in {p for p, _ in info.value.problems}
    assert load_settings(data, {"MY_N8N_KEY": "k"}).n8n is not None


@pytest.mark.slow  # runs the CLI in a process
def test_check_config_validates_the_section(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(
        'n8n: {api_url: "http://127.0.0.1:5678/api/v1", confirm_s: 20}\n'
        "outliers: {factor: 5, min_tasks: 20, running_s: 1800, action: stop}\n"
    )
    out = cli("check-config", cwd=tmp_path, env={"LOOPSTOP_CONFIG": "c.yaml", "N8N_API_KEY": "k"})
    assert out.returncode == 0, out.stderr
    assert "n8n API http://127.0.0.1:5678/api/v1" in out.stdout
    out = cli("check-config", cwd=tmp_path, env={"LOOPSTOP_CONFIG": "c.yaml"})
    assert out.returncode == 1 and "n8n.api_key_env" in out.stderr
    (tmp_path / "bad.yaml").write_text("n8n: {api_url: nowhere, timeout_s: 0}\n")
    out = cli("check-config", cwd=tmp_path, env={"LOOPSTOP_CONFIG": "bad.yaml", "N8N_API_KEY": "k"})
    assert out.returncode == 1
    assert "n8n.timeout_s" in out.stderr
