"""The deploy/ files: well-formed, and naming only metrics the service exports."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from conftest import REPO, Api, AppFactory

DEPLOY = REPO / "deploy"


def test_compose_file_wires_redis_with_aof_and_loopstop() -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"redis", "loopstop", "n8n"} <= set(services)
    assert "--appendonly" in services["redis"]["command"]
    env = services["loopstop"]["environment"]
    assert env["LOOPSTOP_STORE"].startswith("redis://redis:")
    assert services["loopstop"]["depends_on"]["redis"]["condition"] == "service_healthy"
    assert services["redis"]["command"][-2:] == ["--maxmemory-policy", "noeviction"]


def test_compose_n8n_has_the_node_and_the_same_token() -> None:
    """n8n is built with the Loop Stop node, and its credential's token is loopstop's."""
    services = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["services"]
    n8n = services["n8n"]
    assert n8n["build"] == {"context": "..", "dockerfile": "deploy/n8n/Dockerfile"}
    dockerfile = (DEPLOY.parent / n8n["build"]["dockerfile"]).read_text()
    assert "FROM n8nio/n8n:2.41.1" in dockerfile and "npm pack" in dockerfile
    assert (
        n8n["environment"]["LOOPSTOP_TOKEN_N8N"]
        == services["loopstop"]["environment"]["LOOPSTOP_TOKEN_N8N"]
    )
    assert n8n["environment"]["LOOPSTOP_URL"] == "${LOOPSTOP_URL:-http://loopstop:8765}"
    script = (DEPLOY / "n8n" / "import-examples.sh").read_text()
    assert '"type": "loopStopApi"' in script and "publish:workflow --id=lsExSelfCall0001" in script


@pytest.mark.slow  # builds and starts the Compose stack where a Docker engine runs
def test_compose_brings_up_a_guarded_flow() -> None:
    """Where a Docker engine runs: build, start, import, and the self-call loop ends
    (four activations proceed, the fifth is dropped at the chain's depth) and the
    gate-only agent is ended by the gate. tests/e2e/test_n8n_compose_files.py runs the
    same files without Docker."""
    import shutil
    import subprocess
    import time

    import pytest
    import requests

    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker client on this machine")
    info = subprocess.run([docker, "info"], capture_output=True, text=True, check=False)
    if info.returncode != 0:
        pytest.skip("no Docker engine answers here (docker info failed); CI has none")
    env = {
        **__import__("os").environ,
        "LOOPSTOP_SECRET": "compose-test-secret-0123456789",
        "LOOPSTOP_TOKEN_N8N": "compose-test-n8n-token-0123",
        "LOOPSTOP_TOKEN_ADMIN": "compose-test-admin-token-0123",
    }
    compose = [docker, "compose", "-f", str(DEPLOY / "docker-compose.yml"), "-p", "lstest"]
    try:
        subprocess.run([*compose, "up", "-d", "--build"], env=env, check=True, timeout=1800)
        subprocess.run(
            [*compose, "exec", "-T", "n8n", "loopstop-import-examples"], env=env, check=True
        )
        subprocess.run([*compose, "restart", "n8n"], env=env, check=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if requests.get("http://127.0.0.1:5678/healthz", timeout=2).ok:
                    break
            except requests.RequestException:
                time.sleep(1)
        requests.post(
            "http://127.0.0.1:5678/webhook/loopstop-self-call",
            json={"run": "r1", "hop": 0},
            timeout=30,
        ).raise_for_status()
        dropped = 'route="activations",reason="chain_depth"'
        while time.monotonic() < deadline + 60:
            metrics = requests.get("http://127.0.0.1:8765/metrics", timeout=5).text
            if any(
                dropped in line or ("chain_depth" in line and "activations" in line)
                for line in metrics.splitlines()
            ):
                break
            time.sleep(1)
        else:
            raise AssertionError("the self-call loop was not dropped at its depth")
        agent = requests.post(
            "http://127.0.0.1:5678/webhook/loopstop-gate-agent",
            json={"ticket": "T-1", "question": "Add a note."},
            timeout=180,
        )
        agent.raise_for_status()
        assert agent.json()["output"].startswith("[loopstop] This task has ended: partial")
    finally:
        subprocess.run([*compose, "down", "-v"], env=env, check=False)


def test_compose_profile_runs_loopstop_on_postgres() -> None:
    """The "postgres" profile: a PostgreSQL service and a loopstop whose store it is."""
    from sidecar.store import check_store_url

    services = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["services"]
    assert services["postgres"]["profiles"] == ["postgres"]
    sidecar = services["loopstop-postgres"]
    assert sidecar["profiles"] == ["postgres"]
    url = sidecar["environment"]["LOOPSTOP_STORE"]
    assert url.startswith("postgresql://loopstop:") and url.endswith("@postgres:5432/loopstop")
    check_store_url(url.replace("${POSTGRES_PASSWORD:-loopstop-change-me}", "pw"))
    assert sidecar["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "pg_isready" in services["postgres"]["healthcheck"]["test"]
    # The same configuration file as the Redis sidecar's, so the same upstream and variables.
    redis_sidecar = services["loopstop"]
    assert sidecar["volumes"] == redis_sidecar["volumes"]
    assert set(sidecar["depends_on"]) - {"postgres"} == set(redis_sidecar["depends_on"]) - {"redis"}
    assert set(sidecar["environment"]) == set(redis_sidecar["environment"])


def test_alert_rules_use_exported_metrics(make_app: AppFactory) -> None:
    rules = yaml.safe_load((DEPLOY / "alerts.yml").read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    assert len(exprs) == 7
    exported = Api(make_app().test_client()).client.get("/metrics").get_data(as_text=True)
    for expr in exprs:
        for name in re.findall(r"loopstop_[a-z_]+", expr):
            assert f"# TYPE {name.removesuffix('_total')}" in exported or name in exported, name


@pytest.mark.slow  # runs the CLI in a process
def test_the_images_entry_command_runs(tmp_path: Path) -> None:
    """No Docker engine here: run what the image runs (`loopstop serve`) as the image
    would be configured, and check it refuses to listen publicly without tokens."""
    import os
    import subprocess
    import sys

    dockerfile = (REPO / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["loopstop"]' in dockerfile and "USER 10001" in dockerfile
    assert "HEALTHCHECK" in dockerfile
    env = {
        "PATH": os.environ["PATH"],
        "LOOPSTOP_BIND": "0.0.0.0:8765",
        "LOOPSTOP_STORE": f"sqlite:///{tmp_path}/data/loopstop.db",
    }
    out = subprocess.run(
        [sys.executable, "-m", "sidecar", "serve", "--workers", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2 and "refusing to bind 0.0.0.0:8765" in out.stderr


def test_compose_file_is_valid_against_the_compose_specification() -> None:
    """No Docker engine runs here: validate with the compose specification's own rules."""
    import compose_spec

    compose = compose_spec.PyCompose.from_yaml((DEPLOY / "docker-compose.yml").read_text())
    compose.validate()
    assert compose.service_names() == [
        "redis",
        "loopstop",
        "records",
        "model",
        "postgres",
        "loopstop-postgres",
        "n8n",
    ]


@pytest.mark.slow  # runs promtool
def test_alert_rules_pass_promtool() -> None:
    import shutil
    import subprocess

    promtool = shutil.which("promtool")
    if promtool is None:
        import pytest

        pytest.fail("promtool is not installed (scripts/test installs Debian's prometheus)")
    out = subprocess.run(
        [promtool, "check", "rules", str(DEPLOY / "alerts.yml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0 and "SUCCESS: 7 rules found" in out.stdout, out.stdout + out.stderr


@pytest.mark.slow  # runs hadolint
def test_dockerfile_passes_hadolint() -> None:
    import shutil
    import subprocess
    import sys

    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    root = REPO
    out = subprocess.run(
        [hadolint, "--no-color", str(root / "Dockerfile"), str(root / "deploy/n8n/Dockerfile")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
