"""A session's calls, captured token for token, and stitched into training sequences.

Every call the gateway serves records the prompt ids it built, the ids the engine sampled, their log-probs and the
``policy_version`` of each — what was generated, never a re-tokenisation of the text the agent saw. A session is one
episode of an agent; its calls become training sequences:

- **Continued**: when a request's conversation is an earlier call's conversation plus the reply the gateway gave
  it, plus new messages (tool results, the user's next turn), its prompt is that call's prompt and sampled ids as
  they were, followed by the chat template's ids for the new messages (``ChatRenderer.observation_ids``). The
  agent's copy of the reply is never encoded again, so the sequence is exactly the engine's ids; the call extends
  the earlier call's sequence, the new messages taking no loss.
- **Split**: any other conversation (an agent that edits or summarises its context, a template that rewrites
  history) is rendered afresh and starts a sequence of its own; nothing is re-tokenised into an earlier one.

Both cases are counted (``SessionRecord.continued`` / ``split``).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

Message = dict[str, Any]


@dataclass
class Call:
    """One sampled reply: the conversation it answered (``messages``, normalised), the assistant ``reply`` returned
    for it, ``prompt_ids`` as given to the engine and what the engine sampled (``completion_ids`` with
    ``log_probs`` and ``policy_versions``); ``parent``: the index of the call whose sequence it continues (``None``:
    it starts one); ``observation_ids``: the ids between that call's end and this call's sampled ids."""

    messages: list[Message]
    reply: Message
    prompt_ids: list[int]
    completion_ids: list[int]
    log_probs: list[float]
    policy_versions: list[int]
    finish_reason: str
    parent: Optional[int] = None
    observation_ids: list[int] = field(default_factory=list)
    rendered: list[Message] = field(default_factory=list)
    """The conversation as the chat template rendered it, every earlier reply as the model's own text."""
    raw_text: str = ""
    """The model's text of this reply (tool-call blocks included): how a continuation renders it."""
    tools_key: str = ""
    """The tools offered (as JSON): a continuation must offer the same."""
    root_prompt_length: int = 0
    """The length of the prompt its sequence began with (the first call's of the chain)."""

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.completion_ids


@dataclass
class TrainingSequence:
    """One training sequence of a session: ``prompt_ids``, then ``response_ids`` with ``response_mask`` (1: sampled,
    0: observation), ``log_probs`` (0 on observations) and ``policy_versions`` (-1 on observations); ``calls``: the
    indices of the calls it holds."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    policy_versions: list[int] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)

    def add(self, ids: Sequence[int], log_probs: Sequence[float] = (), versions: Sequence[int] = (),
            sampled: bool = False) -> None:
        self.response_ids += list(ids)
        self.response_mask += [int(sampled)] * len(ids)
        self.log_probs += list(log_probs) if sampled else [0.0] * len(ids)
        self.policy_versions += list(versions) if sampled else [-1] * len(ids)


class SessionRecord:
    """The calls of one session, in the order they were served (thread-safe: the gateway's handlers add to it)."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.calls: list[Call] = []
        self.continued = 0
        self.split = 0
        self.template_mismatches = 0
        self._asked: dict[tuple[int, ...], int] = {}
        self._lock = threading.Lock()

    def claim(self, prompt_ids: Sequence[int]) -> int:
        """How many times the session asked for ``prompt_ids`` before this request (counted as requests arrive)."""
        with self._lock:
            key = tuple(prompt_ids)
            count = self._asked.get(key, 0)
            self._asked[key] = count + 1
            return count

    def find_parent(self, messages: Sequence[Message], tools_key: str) -> Optional[tuple[Call, int, list[Message]]]:
        """The latest call, with the same tools, whose conversation plus reply begins ``messages``; its index and
        the messages after it."""
        with self._lock:
            calls = list(enumerate(self.calls))
        for index, call in reversed(calls):
            history = [*call.messages, call.reply]
            if call.tools_key == tools_key and len(messages) > len(history) and same_messages(
                    messages[:len(history)], history):
                return call, index, list(messages[len(history):])
        return None

    def find_prefix_call(self, prompt_ids: Sequence[int]) -> Optional[tuple[Call, int]]:
        """The latest call whose ids (prompt and sampled) begin ``prompt_ids`` and are shorter (completions)."""
        with self._lock:
            calls = list(enumerate(self.calls))
        for index, call in reversed(calls):
            ids = call.ids
            if len(prompt_ids) > len(ids) and list(prompt_ids[:len(ids)]) == ids:
                return call, index
        return None

    def add(self, call: Call, template_matched: bool = True) -> int:
        """Record ``call``; its index. A call that continues none counts as a split unless it is the session's
        first prompt or a sibling of an earlier call (another choice of the same prompt)."""
        with self._lock:
            earlier = self.calls[:]
            self.calls.append(call)
            if call.parent is not None:
                self.continued += 1
            elif earlier and all(other.prompt_ids != call.prompt_ids for other in earlier):
                self.split += 1
            self.template_mismatches += not template_matched
            return len(self.calls) - 1

    def sequences(self) -> list[TrainingSequence]:
        """The session's training sequences: each call either continues its parent's sequence or starts one; a
        call continued by another is a prefix of it, so only the calls nobody continued end a sequence."""
        with self._lock:
            calls = list(self.calls)
        continued = {call.parent for call in calls if call.parent is not None}
        return [self._chain(calls, index) for index in range(len(calls)) if index not in continued]

    @staticmethod
    def _chain(calls: list[Call], last: int) -> TrainingSequence:
        chain = [last]
        while calls[chain[-1]].parent is not None:
            chain.append(calls[chain[-1]].parent)
        chain.reverse()
        sequence = TrainingSequence(prompt_ids=list(calls[chain[0]].prompt_ids), calls=chain)
        for position, index in enumerate(chain):
            call = calls[index]
            if position:
                sequence.add(call.observation_ids)
            sequence.add(call.completion_ids, call.log_probs, call.policy_versions, sampled=True)
        return sequence


def same_messages(first: Sequence[Message], second: Sequence[Message]) -> bool:
    """Whether two conversations say the same: role, text content, tool calls (name and arguments, compared as
    JSON values) and a tool result's ``tool_call_id``; other keys (call ids, ``name``, ``refusal``, ``annotations``
    …) are ignored — the model's text of a call is what was sampled, whatever id the agent gives it."""
    return len(first) == len(second) and all(_essence(a) == _essence(b) for a, b in zip(first, second))


def _essence(message: Message) -> tuple:
    calls = tuple((call["function"]["name"], _canonical(call["function"]["arguments"]))
                  for call in message.get("tool_calls") or ())
    return message.get("role"), message.get("content") or "", calls, message.get("tool_call_id")


def _canonical(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments
    return json.dumps(arguments, sort_keys=True)
