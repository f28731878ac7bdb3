"""The model gate (DESIGN §5): an OpenAI-compatible endpoint in front of the
real model, so that every model turn of an n8n AI Agent is admitted and
counted, and a stopped task ends the agent with a plain final message.

Per request: find the ``loopstop-task: <task_id>`` line in the system
message; reserve a model turn (the same core as ``/v1/tasks/{id}/model-calls``);
when the task has ended, answer a final assistant message without calling
the upstream; else forward (adding a short system message at ``wrap_up``),
record the usage tokens the upstream reports, and relay its answer.
Prompts and completions are never logged or stored.
"""

from __future__ import annotations

import copy
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import requests

from sidecar.auth import Principal
from sidecar.config import ModelGateConfig
from sidecar.core.tasks import Task
from sidecar.errors import GateNotConfigured, LoopstopError, MalformedRequest, NotFound
from sidecar.service.messages import WRAP_UP_MESSAGE, final_message
from sidecar.service.tasks import TaskService

TASK_LINE = re.compile(r"loopstop-task:\s*(t[0-9a-f]{20})\b")


class UpstreamError(LoopstopError):
    """Raised when the upstream model answered an error or could not be reached.

    Rendered OpenAI-style (``{"error": {...}}``) with the same status class,
    which is what n8n's OpenAI node understands.
    """

    status = 502
    slug = "upstream-error"
    title = "Upstream model error"

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(str(body.get("error", {}).get("message", "upstream error")))
        self.status = status
        self.body = body


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def task_line(messages: list[Any]) -> str | None:
    """The task id named by a ``loopstop-task:`` line of a system (or developer) message."""
    for message in messages:
        if isinstance(message, dict) and message.get("role") in ("system", "developer"):
            found = TASK_LINE.search(_text(message.get("content")))
            if found:
                return found.group(1)
    return None


@dataclass(frozen=True)
class GateAnswer:
    """What the gate answers: the completion and how it was decided."""

    completion: dict[str, Any]
    decision: str
    reason: str | None
    task_id: str | None
    tokens: int


def final_completion(task: Task, model: str) -> dict[str, Any]:
    """An ordinary final assistant message (no tool calls, ``finish_reason: stop``)."""
    return {
        "id": "chatcmpl-loopstop-" + uuid.uuid4().hex[:24],
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": final_message(task)},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


class ModelGate:
    """Admits, forwards and counts model turns.

    :param session: the HTTP session to the upstream (tests inject theirs).
    :param environ: where the upstream's API key is read (``api_key_env``).
    """

    def __init__(
        self,
        config: ModelGateConfig,
        tasks: TaskService,
        session: requests.Session,
        environ: Mapping[str, str],
    ) -> None:
        self.config = config
        self.tasks = tasks
        self.session = session
        self.environ = environ

    def _upstream(self, path: str) -> str:
        if not self.config.upstream_url:
            raise GateNotConfigured("set model_gate.upstream_url to the real model's base URL")
        return self.config.upstream_url.rstrip("/") + path

    def _headers(self) -> dict[str, str]:
        key = self.environ.get(self.config.api_key_env or "", "")
        return {"Authorization": f"Bearer {key}"} if key else {}

    def chat(self, principal: Principal, body: dict[str, Any]) -> GateAnswer:
        """Serve one ``POST /chat/completions``.

        :raises MalformedRequest: no messages, no task line (unless untracked
            requests are allowed), or a streaming request.
        :raises NotFound: the task line names no task.
        :raises UpstreamError: the upstream failed; relayed OpenAI-style.
        """
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise MalformedRequest("messages must be a non-empty list")
        if body.get("stream"):
            raise MalformedRequest(
                "streaming is not served by the loopstop model gate: turn streaming off in "
                "the chat model node (n8n's OpenAI Chat Model does not stream to an agent)"
            )
        model = str(body.get("model") or self.config.default_model or "")
        self._upstream("")  # a misconfigured gate admits nothing
        task_id = task_line(messages)
        if task_id is None:
            if not self.config.allow_untracked:
                raise MalformedRequest(
                    "no 'loopstop-task: <task_id>' line in the system message: add it to the "
                    "AI Agent's System Message (or set model_gate.allow_untracked)"
                )
            completion, tokens = self._forward(body, model)
            return GateAnswer(completion, "untracked", None, None, tokens)
        ns = self.tasks.namespace_of(task_id)
        if ns is None:
            raise NotFound(f"no task {task_id!r}")
        task, outcome = self.tasks.model_call(principal, ns, task_id, None)
        if not outcome.admitted:
            return GateAnswer(
                final_completion(task, model),
                "deny",
                None if outcome.reason is None else str(outcome.reason),
                task_id,
                0,
            )
        forward = body
        if outcome.wrap_up:
            forward = copy.deepcopy(body)
            forward["messages"] = [*messages, {"role": "system", "content": WRAP_UP_MESSAGE}]
        completion, tokens = self._forward(forward, model)
        if tokens:
            self.tasks.record_tokens(principal, ns, task_id, tokens)
        return GateAnswer(
            completion, "admit", "wrap_up" if outcome.wrap_up else None, task_id, tokens
        )

    def _forward(self, body: dict[str, Any], model: str) -> tuple[dict[str, Any], int]:
        payload = dict(body)
        if model:
            payload["model"] = model
        try:
            resp = self.session.post(
                self._upstream("/chat/completions"),
                json=payload,
                headers=self._headers(),
                timeout=(min(self.config.timeout_s, 5.0), self.config.timeout_s),
                allow_redirects=False,
            )
        except requests.Timeout:
            raise UpstreamError(
                504, _error("the upstream model did not answer in time", "timeout")
            ) from None
        except requests.RequestException as exc:
            raise UpstreamError(
                502,
                _error(
                    f"the upstream model is unreachable ({type(exc).__name__})",
                    "upstream_unreachable",
                ),
            ) from None
        try:
            answer = resp.json()
        except ValueError:
            answer = None
        if resp.status_code >= 400 or not isinstance(answer, dict):
            status = resp.status_code if resp.status_code >= 400 else 502
            if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
                raise UpstreamError(status, answer)
            raise UpstreamError(
                status, _error(f"the upstream model answered {resp.status_code}", "upstream_error")
            )
        usage = answer.get("usage")
        tokens = usage.get("total_tokens") if isinstance(usage, dict) else 0
        if not isinstance(tokens, int) or isinstance(tokens, bool):
            tokens = 0
        return answer, max(0, tokens)

    def models(self) -> dict[str, Any]:
        """The upstream's model list (n8n's credential test and model picker), or the
        configured default model when the upstream cannot list."""
        try:
            resp = self.session.get(
                self._upstream("/models"),
                headers=self._headers(),
                timeout=(3.0, min(self.config.timeout_s, 10.0)),
                allow_redirects=False,
            )
            listed = resp.json() if resp.status_code == 200 else None
            if isinstance(listed, dict) and isinstance(listed.get("data"), list):
                return listed
        except (requests.RequestException, ValueError, LoopstopError):
            pass
        model = self.config.default_model or "loopstop-gate"
        return {
            "object": "list",
            "data": [{"id": model, "object": "model", "created": 0, "owned_by": "loopstop"}],
        }


def _error(message: str, code: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "loopstop_gate", "code": code, "param": None}}
