"""The deploy/ files: well-formed, and naming only metrics the service exports."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from conftest import Api, AppFactory

DEPLOY = Path(__file__).parent.parent / "deploy"


def test_compose_file_wires_redis_with_aof_and_loopstop() -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"redis", "loopstop", "n8n"} <= set(services)
    assert "--appendonly" in services["redis"]["command"]
    env = services["loopstop"]["environment"]
    assert env["LOOPSTOP_STORE"].startswith("redis://redis:")
    assert services["loopstop"]["depends_on"]["redis"]["condition"] == "service_healthy"


def test_compose_profile_runs_loopstop_on_postgres() -> None:
    """The "postgres" profile: a PostgreSQL service and a loopstop whose store it is."""
    from sidecar.store import check_store_url

    services = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["services"]
    assert services["postgres"]["profiles"] == ["postgres"]
    sidecar = services["loopstop-postgres"]
    assert sidecar["profiles"] == ["postgres"]
    url = sidecar["environment"]["LOOPSTOP_STORE"]
    assert url.startswith("postgresql://loopstop:") and url.endswith("@postgres:5432/loopstop")
    check_store_url(url.replace("${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}", "pw"))
    assert sidecar["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "pg_isready" in services["postgres"]["healthcheck"]["test"]


def test_alert_rules_use_exported_metrics(make_app: AppFactory) -> None:
    rules = yaml.safe_load((DEPLOY / "alerts.yml").read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    assert len(exprs) == 4
    exported = Api(make_app().test_client()).client.get("/metrics").get_data(as_text=True)
    for expr in exprs:
        for name in re.findall(r"loopstop_[a-z_]+", expr):
            assert f"# TYPE {name.removesuffix('_total')}" in exported or name in exported, name


def test_the_images_entry_command_runs(tmp_path: Path) -> None:
    """No Docker engine here: run what the image runs (`loopstop serve`) as the image
    would be configured, and check it refuses to listen publicly without tokens."""
    import os
    import subprocess
    import sys

    dockerfile = (Path(__file__).parent.parent / "Dockerfile").read_text()
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
    assert compose.service_names() == ["redis", "loopstop", "postgres", "loopstop-postgres", "n8n"]


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
    assert out.returncode == 0 and "SUCCESS: 4 rules found" in out.stdout, out.stdout + out.stderr


def test_dockerfile_passes_hadolint() -> None:
    import shutil
    import subprocess
    import sys

    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    dockerfile = Path(__file__).parent.parent / "Dockerfile"
    out = subprocess.run(
        [hadolint, "--no-color", str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
