"""A tiny real model that has learnt one tool-using conversation by heart: asked anything, it calls the calculator
in the Hermes format with ``2+3``, and answers ``5`` once the tool has replied — so that tests of agent libraries
(the OpenAI Agents SDK) see a real tool call from a real engine."""

from __future__ import annotations

from pathlib import Path

from hybridrl.agents.tools import format_tool_call
from hybridrl.utils.tiny_model import save_tiny_model, teach_tiny_model

QUESTIONS = ["1+2=", "3+4=", "5+6=", "7+1=", "2+2=", "9+9="]
CALL = format_tool_call("calculator", {"expression": "2+3"})
RENDERED_TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "", "parameters": {}}}]


def save_calculator_caller(directory: Path) -> Path:
    """The tool-chat tiny model, taught ``user → calculator("2+3") → tool "5" → "5"`` (≈ 1.5 s on two quiet cores)."""
    save_tiny_model(directory, tool_chat=True)
    conversations = [[{"role": "user", "content": question}, {"role": "assistant", "content": CALL},
                      {"role": "tool", "content": "5"}, {"role": "assistant", "content": "5"}]
                     for question in QUESTIONS]
    return teach_tiny_model(directory, conversations, tools=RENDERED_TOOLS)
