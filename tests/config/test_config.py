"""Configuration: validation with paths, check-config, secrets and rotation."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SECRET, Api, Clock
from sidecar.app import create_app
from sidecar.config import Settings, load_settings
from sidecar.errors import ConfigError

FULL = """
tokens:
  - name: n8n
    env: LOOPSTOP_TOKEN_N8N
    workflows: ["*"]
  - name: operator
    env: LOOPSTOP_TOKEN_ADMIN
    workflows: ["*"]
    admin: true
limits:
  max_model_calls: 20
  max_tool_calls: 30
  wrap_up_ratio: 0.8
policies:
  support-agent:
    limits: {max_tool_calls: 20}
    tools: [search_orders, update_order]
    exit_check: order_done
tools:
  update_order: {kind: write, check: order_confirmed, max_calls: 3}
chains:
  default: {max_depth: 3, max_activations: 20, rate_limit: 10, rate_window_s: 3600}
  workflows:
    wf-sheet-sync: {max_depth: 1}
operations: {lease_s: 60, max_attempts: 3, retention_s: 604800}
tasks: {retention_s: 604800}
model_gate: {upstream_url: "https://llm.example/v1", api_key_env: OPENAI_API_KEY}
http: {max_body_bytes: 262144}
logging: {allowed_fields: []}
checks:
  order_confirmed:
    kind: http
    url: "http://orders.internal:8080/orders/{order_id}"
    expect_status: [200]
    assert: ["status == 'confirmed'"]
    revision: "version"
    headers: {Authorization: {env: ORDERS_TOKEN, prefix: "Bearer "}}
  answer_shape: {kind: json_schema, path: output, schema: {type: object, required: [answer]}}
  all_pages: {kind: cursor, cursor: next_cursor, records: "items[].id"}
  receipts: {kind: operations, operations: operation_ids}
  order_done: {kind: all, of: [order_confirmed, receipts]}
"""

ENV = {"LOOPSTOP_TOKEN_N8N": "a" * 20, "LOOPSTOP_TOKEN_ADMIN": "b" * 20}


def cli(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar", *args],
        cwd=cwd,
        text=True,
        capture_output=True,
        env={"PATH": os.environ["PATH"], **env},
        timeout=30,
        check=False,
    )


def test_design_example_file_is_valid(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(FULL)
    settings = load_settings(None, {**ENV, "LOOPSTOP_CONFIG": str(tmp_path / "c.yaml")})
    assert settings.chains.for_workflow("wf-sheet-sync").max_depth == 1
    assert settings.chains.for_workflow("other").max_depth == 3
    assert settings.policies["support-agent"].exit_check == "order_done"


def test_every_error_has_its_path() -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_mapping(
            {
                "limits": {"max_tool_calls": 0, "max_toll_calls": 3},
                "tokens": [{"name": "x", "workflows": ["*"]}],
                "tools": {"t": {"check": "nope"}},
            }
        )
    paths = {p for p, _ in info.value.problems}
    assert {"limits.max_tool_calls", "limits.max_toll_calls", "tokens.0.env"} <= paths


def test_infinite_and_unbounded_times_are_refused() -> None:
    """Settings end up in stored records and TTLs: NaN, Infinity (YAML's .inf)
    and windows past a year are refused with their paths."""
    with pytest.raises(ConfigError) as info:
        Settings.from_mapping(
            {
                "chains": {
                    "default": {"chain_ttl_s": float("inf"), "rate_window_s": float("nan")},
                    "workflows": {"wf": {"dedupe_window_s": 1e300}},
                },
                "operations": {"lease_s": float("inf")},
                "limits": {"wrap_up_ratio": float("nan")},
            }
        )
    paths = {p for p, _ in info.value.problems}
    assert paths == {
        "chains.default.chain_ttl_s",
        "chains.default.rate_window_s",
        "chains.workflows.wf.dedupe_window_s",
        "operations.lease_s",
        "limits.wrap_up_ratio",
    }


def test_cross_references_are_checked() -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_mapping(
            {
                "tools": {"t": {"check": "nope"}},
                "checks": {"both": {"kind": "all", "of": ["ghost"]}},
            }
        )
    paths = {p for p, _ in info.value.problems}
    assert paths == {"tools.t.check", "checks.both.of.0"}


def test_token_variable_must_be_set_and_long_enough() -> None:
    tokens = [
        {"name": "n8n", "env": "NOPE_TOKEN", "workflows": ["*"]},
        {"name": "short", "env": "SHORT_TOKEN", "workflows": ["*"]},
    ]
    with pytest.raises(ConfigError) as info:
        load_settings({"tokens": tokens}, {"SHORT_TOKEN": "abc"})
    assert [p for p, _ in info.value.problems] == ["tokens.0.env", "tokens.1.env"]
    assert "NOPE_TOKEN" in info.value.problems[0][1]
    assert "shorter than 16" in info.value.problems[1][1]


def test_token_scope_is_never_implied() -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_mapping({"tokens": [{"name": "n8n", "env": "T"}]})
    assert info.value.problems[0][0] == "tokens.0.workflows"


def test_store_url_from_environment_wins(tmp_path: Path) -> None:
    s = load_settings({"store": "sqlite:///a.db"}, {"LOOPSTOP_STORE": "redis://h:1/0"})
    assert s.store == "redis://h:1/0"


@pytest.mark.slow  # runs the CLI in a process
def test_check_config_ok_and_errors(tmp_path: Path) -> None:
    (tmp_path / "good.yaml").write_text(FULL)
    out = cli("check-config", cwd=tmp_path, env={**ENV, "LOOPSTOP_CONFIG": "good.yaml"})
    assert out.returncode == 0, out.stderr
    assert "configuration ok" in out.stdout
    (tmp_path / "bad.yaml").write_text(
        "limits: {max_idle: 0}\nchains: {workflows: {wf: {max_dept: 2}}}\n"
        "tokens: [{name: a, env: MISSING_VAR, workflows: ['*']}]\n"
    )
    out = cli("check-config", cwd=tmp_path, env={"LOOPSTOP_CONFIG": "bad.yaml"})
    assert out.returncode == 1
    assert "limits.max_idle" in out.stderr and "chains.workflows.wf.max_dept" in out.stderr
    for env, says in (
        ({"LOOPSTOP_STORE": "mongodb://x"}, "unknown store scheme"),
        ({"LOOPSTOP_STORE": "sqlite://two-slashes.db"}, "three or four slashes"),
        ({"LOOPSTOP_STORE": "sqlite:///x.db?busy_timeout_s=abc"}, "positive number"),
        ({"LOOPSTOP_STORE": "postgresql://u@h/db?pool_size=2.5"}, "positive integer"),
        ({"LOOPSTOP_STORE": "postgresql://u@h/db?isolation=dirty"}, "cas or serializable"),
        ({"LOOPSTOP_STORE": "postgres://u@h/db?sweep_interval_s=0"}, "positive number"),
        ({"LOOPSTOP_BIND": "nonsense"}, "LOOPSTOP_BIND"),
        ({"LOOPSTOP_LOG_LEVEL": "CHATTY"}, "LOOPSTOP_LOG_LEVEL"),
    ):
        out = cli("check-config", cwd=tmp_path, env=env)
        assert out.returncode in (1, 2) and says in out.stderr, (env, out.stderr)
        assert "Traceback" not in out.stderr
    out = cli("check-config", cwd=tmp_path, env={"LOOPSTOP_CONFIG": "missing.yaml"})
    assert out.returncode == 1 and "does not exist" in out.stderr
    (tmp_path / "notyaml.yaml").write_text("limits: [unclosed\n")
    out = cli("check-config", cwd=tmp_path, env={"LOOPSTOP_CONFIG": "notyaml.yaml"})
    assert out.returncode == 1 and "cannot read YAML" in out.stderr


@pytest.mark.slow  # runs the CLI in a process
def test_redis_store_requires_a_configured_secret(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        create_app({"store": "redis://127.0.0.1:1/0"}, environ={})
    assert info.value.problems[0][0] == "LOOPSTOP_SECRET"
    out = cli("check-config", cwd=tmp_path, env={"LOOPSTOP_STORE": "redis://127.0.0.1:1/0"})
    assert out.returncode == 1 and "LOOPSTOP_SECRET" in out.stderr


def test_short_secret_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        create_app({"store": f"sqlite:///{tmp_path}/x.db"}, environ={"LOOPSTOP_SECRET": "short"})


def test_secret_rotation_keeps_matching_old_records(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/x.db"
    old = Api(
        create_app(
            {"store": url}, environ={"LOOPSTOP_SECRET": SECRET}, clock=Clock()
        ).test_client(),
        token=None,
    )
    old.begin("o", {"a": 1})
    old.post("/v1/operations/o/commit", {"attempt": 1, "receipt": "r"})
    new_secret = "rotated-secret-abcdefghijklmnop"
    rotated = Api(
        create_app(
            {"store": url},
            environ={
                "LOOPSTOP_SECRET": new_secret,
                "LOOPSTOP_SECRET_PREVIOUS": SECRET,
            },
            clock=Clock(),
        ).test_client(),
        token=None,
    )
    assert rotated.begin("o", {"a": 1})["decision"] == "replay"
    assert rotated.begin("o", {"a": 2})["decision"] == "conflict"
    forgot = Api(
        create_app(
            {"store": url}, environ={"LOOPSTOP_SECRET": new_secret}, clock=Clock()
        ).test_client(),
        token=None,
    )
    assert forgot.begin("o", {"a": 1})["decision"] == "conflict"  # never a blind replay
    assert forgot.begin("fresh", {"a": 1})["decision"] == "execute"


def test_generated_secret_is_shared_and_private(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/data/x.db"
    a = create_app({"store": url}, environ={})
    b = create_app({"store": url}, environ={})
    fa = a.extensions["loopstop"].fingerprinter
    fb = b.extensions["loopstop"].fingerprinter
    assert fa.current.id == fb.current.id
    secret = tmp_path / "data" / "loopstop.secret"
    assert oct(secret.stat().st_mode & 0o777) == "0o600"
