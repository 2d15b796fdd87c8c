"""From sampled ids to what an OpenAI client reads: the reply message (text and tool calls), stop strings, log-probs,
and the text a stream may send so far.

The model's text is decoded for the client only; the ids stay as sampled (``sessions.py`` keeps them). Tool calls are
read in the Hermes format (``hybridrl.agents.tools.parse_tool_calls``): the text before the first ``<tool_call>``
is the reply's content, each valid block one ``tool_calls`` entry with its arguments as JSON text.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from hybridrl.agents.tools import TOOL_CALL_OPEN, parse_tool_calls


@dataclass
class Sampled:
    """One choice as the engine produced it: ``token_ids`` with ``log_probs`` and ``policy_versions``; ``text``:
    their decoded text (cut before a stop string that ended it); ``finish_reason``: OpenAI's (``stop`` /
    ``length``)."""

    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    policy_versions: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: Optional[str] = None


def cut_at_stop(text: str, stops: Sequence[str]) -> Optional[str]:
    """``text`` up to the earliest of ``stops`` in it; ``None`` when none occurs."""
    found = [text.index(stop) for stop in stops if stop in text]
    return text[:min(found)] if found else None


def streamable(text: str, holds: Sequence[str]) -> str:
    """The longest prefix of ``text`` a stream may send now: it stops before any of ``holds`` (stop strings, the
    tool-call tag) that occurs, and before a tail that could still grow into one of them."""
    cut = len(text)
    for marker in holds:
        position = text.find(marker)
        if position >= 0:
            cut = min(cut, position)
            continue
        for length in range(min(len(marker) - 1, len(text)), 0, -1):
            if text.endswith(marker[:length]):
                cut = min(cut, len(text) - length)
                break
    return text[:cut]


def reply_message(text: str, with_tools: bool) -> tuple[dict[str, Any], bool]:
    """The assistant message for ``text`` and whether it calls tools. With tools offered, valid Hermes blocks
    become ``tool_calls`` and the text before the first block the content (``None`` when empty)."""
    if with_tools and TOOL_CALL_OPEN in text:
        calls = parse_tool_calls(text).calls
        if calls:
            content = text[:text.index(TOOL_CALL_OPEN)].strip() or None
            return {"role": "assistant", "content": content, "tool_calls": [
                {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                 "function": {"name": call.name, "arguments": json.dumps(call.arguments)}} for call in calls]}, True
    return {"role": "assistant", "content": text}, False


def for_template(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as chat templates expect them: tool-call arguments as objects, not JSON text."""
    rendered = []
    for message in messages:
        if message.get("tool_calls"):
            message = {**message, "tool_calls": [
                {**call, "function": {**call["function"], "arguments": _arguments(call["function"]["arguments"])}}
                for call in message["tool_calls"]]}
        rendered.append(message)
    return rendered


def _arguments(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def chat_logprobs(tokenizer, sampled: Sampled) -> dict[str, Any]:
    """OpenAI's ``logprobs.content``: each sampled token's text, log-prob and bytes (no alternatives)."""
    content = []
    for token_id, log_prob in zip(sampled.token_ids, sampled.log_probs):
        token = tokenizer.decode([token_id], skip_special_tokens=False)
        content.append({"token": token, "logprob": log_prob, "bytes": list(token.encode()), "top_logprobs": []})
    return {"content": content}


def completion_logprobs(tokenizer, sampled: Sampled) -> dict[str, Any]:
    """The legacy completions' ``logprobs``: tokens, their log-probs and text offsets."""
    tokens = [tokenizer.decode([token_id], skip_special_tokens=False) for token_id in sampled.token_ids]
    offsets, position = [], 0
    for token in tokens:
        offsets.append(position)
        position += len(token)
    return {"tokens": tokens, "token_logprobs": list(sampled.log_probs), "top_logprobs": None,
            "text_offset": offsets}
