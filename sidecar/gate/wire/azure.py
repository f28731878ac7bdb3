"""Azure OpenAI: the OpenAI Chat Completions and Responses adapters behind Azure's
paths and key header (DESIGN §5's node table).

n8n's Azure OpenAI Chat Model sends, below its credential's Endpoint,
``POST /openai/deployments/{deployment}/chat/completions?api-version=...``
(``.../responses`` for a deployment whose name holds ``codex`` or
``gpt-5.x-pro``) with the key in ``api-key``; with the AI Foundry endpoint
type, ``POST /chat/completions`` (``/responses``) with ``Authorization:
Bearer``. The bodies and answers are OpenAI's, so the formats are the
OpenAI adapters' own; what differs is the API (the ``azure`` upstream, the
real key in ``api-key``, the token read from ``api-key`` or a bearer
header) and the model, which is the deployment the path names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sidecar.gate.wire.base import BEARER, Api, TokenFrom
from sidecar.gate.wire.openai_chat import OpenAIChat
from sidecar.gate.wire.openai_responses import OpenAIResponses

#: Azure OpenAI: the real key in ``api-key``; the agent's token in ``api-key``
#: (classic endpoint) or ``Authorization: Bearer`` (AI Foundry).
AZURE = Api("azure", "api-key", token_from=(TokenFrom("api-key"), BEARER))


def _deployment(body: Mapping[str, Any], route: Mapping[str, str]) -> str | None:
    deployment = route.get("deployment")
    if deployment:
        return deployment
    model = body.get("model")
    return model if isinstance(model, str) and model else None


class AzureChat(OpenAIChat):
    """Chat Completions under Azure's paths: the model is the deployment."""

    api = AZURE
    name = "azure_chat"
    path = "/openai/deployments/{deployment}/chat/completions"

    def model(self, body: Mapping[str, Any], route: Mapping[str, str]) -> str | None:
        """The deployment the path names (AI Foundry: the body's ``model``)."""
        return _deployment(body, route)


class AzureResponses(OpenAIResponses):
    """The Responses API under Azure's paths: the model is the deployment."""

    api = AZURE
    name = "azure_responses"
    path = "/openai/deployments/{deployment}/responses"

    def model(self, body: Mapping[str, Any], route: Mapping[str, str]) -> str | None:
        """The deployment the path names (AI Foundry: the body's ``model``)."""
        return _deployment(body, route)
