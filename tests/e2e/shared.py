"""What the real-n8n modules share beside the session's n8n (``conftest.py``).

A recorder (the HTTP service a flow's tool or step posts to), a ``loopstop
serve`` on a configuration of the module's own, and copies of shipped
workflows under ids and webhook paths of their own (several modules use
the same examples in the one n8n of the session, which refuses a second
workflow under an id, and a second webhook on a path).
"""

from __future__ import annotations

import json
import re
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from local_http import JsonHandler, running  # noqa: E402
from served import Sidecar  # noqa: E402

EXAMPLES = HERE.parents[1] / "workflows-examples"

#: ``(path, body, n) -> (status, answer)``: what the recorder answers the n-th post.
Answer = Callable[[str, dict[str, Any], int], tuple[int, Any]]


def _saved(path: str, body: dict[str, Any], n: int) -> tuple[int, Any]:
    return 201, {"id": f"note-{n}", "saved": True}


@dataclass
class Recorder:
    """What a flow posted: every JSON body by path, answered by ``answer``
    (``201 {"id": "note-<n>", "saved": true}`` unless given)."""

    answer: Answer = _saved
    posts: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def bodies(self, path: str = "") -> list[dict[str, Any]]:
        """The bodies posted to paths that start with ``path``, oldest first."""
        with self.lock:
            return [body for p, body in self.posts if p.startswith(path)]

    def where(self, name: str, value: Any) -> list[dict[str, Any]]:
        """The bodies whose field ``name`` is ``value`` (a ticket, an email)."""
        return [b for b in self.bodies() if b.get(name) == value]

    @contextmanager
    def serve(self) -> Iterator[str]:
        """Serve on a free loopback port for the block; yields its base URL."""
        recorder = self

        class Handler(JsonHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.loads(raw or b"{}")
                with recorder.lock:
                    recorder.posts.append((self.path, body))
                    n = len(recorder.posts)
                self._json(*recorder.answer(self.path, body, n))

        with running(Handler) as base:
            yield base


def sidecar(work: Path, config: str, env: dict[str, str], workers: int = 2) -> Sidecar:
    """A ``loopstop serve`` (not started) on ``config`` (YAML, written to
    ``work/loopstop.yaml``) and a SQLite store in ``work``; ``env`` holds the
    variables the configuration names (tokens, upstream keys)."""
    path = work / "loopstop.yaml"
    path.write_text(config)
    full = {
        "LOOPSTOP_CONFIG": str(path),
        "LOOPSTOP_STORE": f"sqlite:///{work / 'loopstop.db'}",
        **env,
    }
    return Sidecar(work, full, workers=workers)


def tokens_only(work: Path, token: str) -> Sidecar:
    """A ``loopstop serve`` (not started) with one token and nothing else: a gate
    with no upstream configured."""
    config = "tokens:\n  - {name: n8n, env: LOOPSTOP_TOKEN_N8N, workflows: ['*']}\n"
    return sidecar(work, config, {"LOOPSTOP_TOKEN_N8N": token}, workers=1)


def sidecar_credentials(base: str, token: str, loop_stop: str) -> list[dict[str, Any]]:
    """The examples' two credentials on the sidecar at ``base``: the Loop Stop API
    (under the id ``loop_stop``) and the OpenAI one on the model gate
    (``lsExModelGate001``), both with ``token``."""
    return [
        {
            "id": loop_stop,
            "name": "Loop Stop",
            "type": "loopStopApi",
            "data": {"baseUrl": base, "token": token},
        },
        {
            "id": "lsExModelGate001",
            "name": "Loop Stop model gate",
            "type": "openAiApi",
            "data": {"apiKey": token, "url": base + "/v1/openai"},
        },
    ]


def rewrite(text: str, **addresses: str) -> str:
    """An example's text with its loopback addresses moved: ``sidecar`` (8765),
    ``recorder`` (8790), ``n8n`` (5678), ``model`` (8791)."""
    ports = {"sidecar": "127.0.0.1:8765", "recorder": "127.0.0.1:8790"}
    ports |= {"n8n": "localhost:5678", "model": "127.0.0.1:8791/v1"}
    for name, base in addresses.items():
        text = text.replace(f"http://{ports[name]}", base)
    return text


def own(workflows: list[dict[str, Any]], tag: str) -> list[dict[str, Any]]:
    """Copies of ``workflows`` whose ids and webhook paths end in ``-<tag>``, as do
    the references to them (a sub-workflow's id, a URL of one of the webhooks),
    with webhook ids of their own; the credentials they name are left as they are."""
    ids = {wf["id"] for wf in workflows}
    paths = {
        n["parameters"]["path"]
        for wf in workflows
        for n in wf["nodes"]
        if n["type"] == "n8n-nodes-base.webhook"
    }
    url = re.compile(r"/webhook/(" + "|".join(map(re.escape, sorted(paths))) + r")(?=$|[/?#])")

    def fix(value: Any) -> Any:
        if isinstance(value, dict):  # a credential's id may be spelled as a workflow's
            return {k: v if k == "credentials" else fix(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fix(v) for v in value]
        if isinstance(value, str) and value in ids:
            return f"{value}-{tag}"
        if isinstance(value, str) and paths:
            return url.sub(lambda m: f"/webhook/{m.group(1)}-{tag}", value)
        return value

    copies = []
    for wf in workflows:
        copy = fix(wf)
        copy["name"] = f"{wf['name']} ({tag})"
        for node in copy["nodes"]:
            if node["type"] == "n8n-nodes-base.webhook":
                node["parameters"]["path"] = f"{node['parameters']['path']}-{tag}"
            if node.get("webhookId"):
                node["webhookId"] = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{node['webhookId']}{tag}"))
        copies.append(copy)
    return copies
