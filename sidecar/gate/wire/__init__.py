"""One pure adapter per wire format the model gate speaks (DESIGN §5, STYLE 18).

:mod:`sidecar.gate.wire.base` holds the protocol (:class:`WireAdapter`,
:class:`StreamReader`) and the typed values they speak; each format is one
module. The service orchestrates adapters and never branches on the format.
"""

from __future__ import annotations

from sidecar.gate.wire import gemini
from sidecar.gate.wire.anthropic import AnthropicMessages
from sidecar.gate.wire.azure import AzureChat, AzureResponses
from sidecar.gate.wire.base import WireAdapter
from sidecar.gate.wire.ollama import Ollama
from sidecar.gate.wire.openai_chat import OpenAIChat
from sidecar.gate.wire.openai_responses import OpenAIResponses

#: Chat Completions (``/chat/completions``).
OPENAI_CHAT: WireAdapter = OpenAIChat()
#: The Responses API (``/responses``).
OPENAI_RESPONSES: WireAdapter = OpenAIResponses()
#: The Anthropic Messages API (``/v1/messages``).
ANTHROPIC_MESSAGES: WireAdapter = AnthropicMessages()
#: Gemini's ``models/{model}:generateContent``.
GEMINI_GENERATE: WireAdapter = gemini.GENERATE
#: Gemini's ``models/{model}:streamGenerateContent`` (``alt=sse``).
GEMINI_STREAM: WireAdapter = gemini.STREAM
#: Ollama's chat API (``/api/chat``).
OLLAMA: WireAdapter = Ollama()
#: Azure OpenAI's Chat Completions (``/openai/deployments/{deployment}/chat/completions``).
AZURE_CHAT: WireAdapter = AzureChat()
#: Azure OpenAI's Responses API (``/openai/deployments/{deployment}/responses``).
AZURE_RESPONSES: WireAdapter = AzureResponses()

__all__ = [
    "ANTHROPIC_MESSAGES",
    "AZURE_CHAT",
    "AZURE_RESPONSES",
    "GEMINI_GENERATE",
    "GEMINI_STREAM",
    "OLLAMA",
    "OPENAI_CHAT",
    "OPENAI_RESPONSES",
    "WireAdapter",
]
