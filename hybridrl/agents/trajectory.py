"""A multi-turn episode as token ids: what the model sampled, exactly, and what the environment said, rendered.

A trajectory is ``prompt_ids`` followed by ``response_ids`` = turn₁ model ids, observation ids, turn₂ model ids, …
with ``response_mask`` 1 on the model's ids and 0 on observation ids (no loss, not in the token normaliser), and the
rollout's log-prob and weight version of each model id. The model's ids are appended as the engine produced them;
its text is decoded only for the environment to read and is never encoded again.

Observation ids come from the chat template (:class:`ChatRenderer`): render the conversation with the model's turn,
render it again with the observations and the next generation prompt, and keep the difference. Two checks make that
exact: the template must be prefix-preserving (the second rendering starts with the first), and the ids so far must
equal the first rendering's ids — the model's ids are what the template would produce for its text. Where the second
does not hold (the model produced an unusual tokenisation of its text) the ids so far are kept as generated, the
template's tokens after the model's stop token (e.g. a newline after ``<|im_end|>``) are carried over so no separator
is lost, and the mismatch is counted and logged; ``strict`` mode raises :class:`TemplateMismatch` instead. Where the
first does not hold (a thinking template that drops an earlier turn's ``<think>`` block, as Qwen3-style templates
do) the observation ids are those after the model's stop token, found by counting turn boundaries, so the model's
turn is never rendered a second time into the observation; the mismatch is counted the same way.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

logger = logging.getLogger(__name__)

Message = dict[str, Any]


class TemplateMismatch(RuntimeError):
    """The chat template does not reproduce the ids generated so far (``rollout.multi_turn.strict``)."""


def supports_tools(tokenizer, tools: Sequence[dict]) -> bool:
    """Whether the tokenizer's chat template renders a ``tools`` list (the rendering changes when tools are given)."""
    probe = [{"role": "user", "content": "x"}]
    plain = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
    with_tools = tokenizer.apply_chat_template(probe, tools=list(tools), tokenize=False, add_generation_prompt=True)
    return plain != with_tools


PROBE_TOOL = {"type": "function", "function": {"name": "hybridrl_probe", "description": "probe",
                                               "parameters": {"type": "object", "properties": {}}}}


def drops_tool_calls(tokenizer) -> bool:
    """Whether the chat template renders tools but loses an assistant message's ``tool_calls`` (the rendering is the
    same with and without them). A client of a sessionless server (``hybridrl serve``) sends the model's call back
    as ``tool_calls``: such a template shows the model a prompt without its own call, unlike the ids it sampled and
    was trained on. ``False`` for a template without tools, or one that refuses the probe."""
    if not supports_tools(tokenizer, [PROBE_TOOL]):
        return False
    call = {"id": "call_probe", "type": "function", "function": {"name": "hybridrl_probe", "arguments": {}}}
    conversation = [{"role": "user", "content": "x"}]
    try:
        with_call, without = (tokenizer.apply_chat_template(
            [*conversation, {"role": "assistant", "content": "", **extra}], tools=[PROBE_TOOL], tokenize=False)
            for extra in ({"tool_calls": [call]}, {}))
    except Exception:  # noqa: BLE001 - a template that refuses the probe says nothing about dropping calls
        return False
    return with_call == without


def tool_system_prompt(tools: Sequence[dict]) -> str:
    """Tools and the Hermes call format, described in words, for a chat template that cannot render tools."""
    schemas = "\n".join(json.dumps(tool, sort_keys=True) for tool in tools)
    return ("You can call tools. To call one, reply with only\n<tool_call>\n{\"name\": <tool name>, \"arguments\": "
            "<arguments as a JSON object>}\n</tool_call>\nand wait for its result; answer the user when you know "
            f"the answer. Tools:\n{schemas}")


def with_tool_system_prompt(messages: Sequence[Message], tools: Sequence[dict]) -> list[Message]:
    """``messages`` with :func:`tool_system_prompt` as (or before) the system message."""
    prompt = tool_system_prompt(tools)
    if messages and messages[0].get("role") == "system":
        return [{"role": "system", "content": f"{prompt}\n\n{messages[0]['content']}"}, *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]


class ChatRenderer:
    """The chat template as ids, with the prefix checks of the module docstring.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        tools: tool schemas (``Tool.schema()``) rendered into the prompt; empty for none.
        strict: raise :class:`TemplateMismatch` instead of counting a mismatch.
    """

    def __init__(self, tokenizer, tools: Sequence[dict] = (), strict: bool = False,
                 tools_in_system: bool = False) -> None:
        self.tokenizer, self.tools, self.strict = tokenizer, list(tools), strict
        self.tools_in_system = tools_in_system and bool(self.tools)

    def ids(self, messages: Sequence[Message], generation_prompt: bool) -> list[int]:
        """``messages`` rendered and tokenised: ``tools`` passed to the template, or (``tools_in_system``, for a
        template without tool support) described in a system message of our own (:func:`tool_system_prompt`)."""
        extra = {"tools": self.tools} if self.tools and not self.tools_in_system else {}
        if self.tools_in_system:
            messages = with_tool_system_prompt(messages, self.tools)
        encoded = self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=generation_prompt,
                                                     tokenize=True, return_dict=True, **extra)
        return list(encoded["input_ids"])

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        return self.ids(messages, generation_prompt=True)

    def decode(self, model_ids: Sequence[int], stop_ids: Sequence[int]) -> str:
        """The text of one model turn for the environment (its final stop token left out)."""
        ids = list(model_ids[:-1]) if model_ids and model_ids[-1] in stop_ids else list(model_ids)
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def observation_ids(self, history: Sequence[Message], observations: Sequence[Message],
                        ids_so_far: Sequence[int]) -> tuple[list[int], bool]:
        """Ids to append after ``ids_so_far`` (prompt + every turn so far, the model's last turn included, as
        generated): the observations and the next generation prompt. ``history`` ends with the model's last turn as
        text. Returns ``(ids, matched)``; ``matched`` is False when a check of the module docstring failed."""
        before = self.ids(history, generation_prompt=False)
        after = self.ids([*history, *observations], generation_prompt=True)
        preserving = after[:len(before)] == before
        matched = preserving and list(before[:len(ids_so_far)]) == list(ids_so_far) and len(before) >= len(
            ids_so_far)
        if matched:
            return after[len(ids_so_far):], True
        reason = ("the chat template is not prefix-preserving (rendering the observations changed the earlier "
                  "turns)" if not preserving else "the template's ids for the conversation differ from the ids "
                  "generated so far")
        if self.strict:
            raise TemplateMismatch(f"multi-turn prefix check failed: {reason} (rollout.multi_turn.strict)")
        logger.debug("multi-turn prefix check failed: %s", reason)
        return self._after_last_turn(before, after, ids_so_far), False

    def _after_last_turn(self, before: list[int], after: list[int], ids_so_far: Sequence[int]) -> list[int]:
        """Without the checks: the ids of ``after`` that follow the model's last turn. When the turn ended with a
        special token (its stop, e.g. ``<|im_end|>``), that is everything after the same count of it as ``before``
        holds — right even when the template rewrote an earlier turn's content (a thinking template dropping an
        empty ``<think>`` block): turn boundaries survive such rewrites. Otherwise the template's tokens after the
        model's last token in ``before`` and the part of ``after`` past the common prefix."""
        last = ids_so_far[-1] if ids_so_far else None
        if last is not None and last in set(self.tokenizer.all_special_ids):
            count, seen = before.count(last), 0
            for index, token in enumerate(after):
                seen += token == last
                if count and seen == count:
                    return after[index + 1:]
        return _trailer(before, ids_so_far) + after[_common_prefix(before, after):]


def _common_prefix(first: Sequence[int], second: Sequence[int]) -> int:
    length = 0
    for a, b in zip(first, second):
        if a != b:
            break
        length += 1
    return length


def _trailer(rendered: Sequence[int], ids_so_far: Sequence[int]) -> list[int]:
    """The template's ids after the model's final stop token in ``rendered`` (what the model did not generate)."""
    if not ids_so_far:
        return []
    last = ids_so_far[-1]
    positions = [index for index, token in enumerate(rendered) if token == last]
    return list(rendered[positions[-1] + 1:]) if positions else []


@dataclass
class SequenceIds:
    """One more training sequence of an episode: its ``prompt_ids`` and ``response_ids`` with ``response_mask`` (1:
    sampled) and the rollout's ``log_probs`` (0 on observations) — one entry per response id."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    log_probs: list[float]


@dataclass
class Trajectory:
    """One episode, token-exact (see the module docstring). Lists of one entry per response id."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    policy_versions: list[int] = field(default_factory=list)
    turns: int = 0
    reward: float = 0.0
    """The environment's rewards, summed over the episode's steps."""
    turn_rewards: list[tuple[int, float]] = field(default_factory=list)
    """``(response index of the answered model turn's last id, reward)`` per step that paid one."""
    end: str = ""
    """``done`` (the environment ended it), ``max_turns``, ``budget`` (the response length) or ``failed``."""
    failure: Optional[str] = None
    prefix_mismatches: int = 0
    counters: dict[str, float] = field(default_factory=dict)
    final_text: str = ""
    """The last model turn, decoded (what the reward function scores)."""
    agent_reward: Optional[float] = None
    """The reward a user's agent returned for the episode: its whole reward, the reward function does not score
    it (``None``: the reward function scores ``final_text``)."""
    other_sequences: tuple[SequenceIds, ...] = ()
    """The episode's other training sequences (an agent's calls that did not extend this one's conversation),
    trained beside it with its advantage (``agents/episode_rows.py``), oldest first."""

    def add_model_turn(self, ids: Sequence[int], log_probs: Sequence[float], versions: Sequence[int]) -> None:
        self.response_ids += list(ids)
        self.response_mask += [1] * len(ids)
        self.log_probs += list(log_probs)
        self.policy_versions += list(versions)
        self.turns += 1

    def add_observation(self, ids: Sequence[int]) -> None:
        self.response_ids += list(ids)
        self.response_mask += [0] * len(ids)
        self.log_probs += [0.0] * len(ids)
        self.policy_versions += [-1] * len(ids)
        self.counters["observation_tokens"] = self.counters.get("observation_tokens", 0.0) + len(ids)

    def add_reward(self, reward: float) -> None:
        """A step's reward, for the model turn it answered (the last one added)."""
        self.reward += reward
        if reward:
            last_model_id = max((index for index, mask in enumerate(self.response_mask) if mask), default=0)
            self.turn_rewards.append((last_model_id, reward))

    def count(self, info: dict[str, float]) -> None:
        for key, value in info.items():
            self.counters[key] = self.counters.get(key, 0.0) + float(value)

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def truncate(self, max_response_tokens: int) -> None:
        """Keep at most ``max_response_tokens`` response ids (the episode then ends on the budget)."""
        if len(self.response_ids) > max_response_tokens:
            for name in ("response_ids", "response_mask", "log_probs", "policy_versions"):
                setattr(self, name, getattr(self, name)[:max_response_tokens])
            self.end = "budget"
