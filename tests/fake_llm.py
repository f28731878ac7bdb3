"""The fake upstream model of the model gate tests is the examples' stand-in model.

``workflows-examples/stand-in/model.py`` is what a reader runs to try the
model gate offline; the tests drive exactly that file (see its docstring
for the modes).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflows-examples" / "stand-in"))

from model import (
    TEXT_PARTS,
    USAGE_CHAT,
    USAGE_RESPONSES,
    FakeLLM,
    first_tool,
    serve,
)

__all__ = ["TEXT_PARTS", "USAGE_CHAT", "USAGE_RESPONSES", "FakeLLM", "first_tool", "serve"]
