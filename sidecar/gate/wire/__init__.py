"""One pure adapter per wire format the model gate speaks (DESIGN §5, STYLE 18).

:mod:`sidecar.gate.wire.base` holds the protocol (:class:`WireAdapter`,
:class:`StreamReader`) and the typed values they speak; each format is one
module. The service orchestrates adapters and never branches on the format.
"""

from __future__ import annotations

from sidecar.gate.wire import gemini
from sidecar.gate.wire.base import WireAdapter
from sidecar.gate.wire.openai_chat import OpenAIChat
from sidecar.gate.wire.openai_responses import OpenAIResponses

#: Chat Completions (``/chat/completions``).
OPENAI_CHAT: WireAdapter = OpenAIChat()
#: The Responses API (``/responses``).
OPENAI_RESPONSES: WireAdapter = OpenAIResponses()
#: Gemini's ``models/{model}:generateContent``.
GEMINI_GENERATE: WireAdapter = gemini.GENERATE
#: Gemini's ``models/{model}:streamGenerateContent`` (``alt=sse``).
GEMINI_STREAM: WireAdapter = gemini.STREAM

__all__ = ["GEMINI_GENERATE", "GEMINI_STREAM", "OPENAI_CHAT", "OPENAI_RESPONSES", "WireAdapter"]
