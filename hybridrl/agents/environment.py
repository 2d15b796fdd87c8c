"""The environment interface of multi-turn episodes, the tool environment, and the registry that names them.

An environment sees text and answers with text; the agent loop (``loop.py``) owns the tokens. Per episode::

    messages = env.reset(row)            # the opening chat messages (from the data row)
    result = env.step(model_text)        # the model's turn, decoded → observations, reward, done, info
    ...                                  # until result.done, rollout.multi_turn.max_assistant_turns or the budget
    env.close()

``StepResult.observations`` are chat messages the loop renders with the chat template (each ``{"role": "tool",
"content": ...}`` by default); a step's reward belongs to the model turn it answers
(``rollout.multi_turn.reward_placement``: on that turn's last token, or all summed on the episode's last model token,
the default). Whatever an environment does wrong — raises, hangs past ``env_step_timeout_s``, returns an observation
that is not text or a reward that is not a number — ends that episode as a counted, logged failure, never the run.

``ToolEnvironment`` is the built-in one: the model calls tools in the Hermes format (``<tool_call>{"name": ...,
"arguments": {...}}</tool_call>``, ``tools.py``); each call's output (or the model's mistake: invalid JSON, an unknown
tool, a bad argument — told to the model, counted) comes back as a tool message; a turn without a tool call is the
final answer, scored by the row's reward function. Custom environments register by name
(``@ENVIRONMENTS.register("mine")`` on a class built with ``cls(tools, reward, max_tool_calls)``) and a data row
chooses its own with an ``agent_name`` column (verl's name, top-level or in ``extra_info``), else
``rollout.multi_turn.environment`` applies. verl's names ``tool_agent`` and ``single_turn_agent`` are the ``tool`` and
``single_turn`` environments.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from hybridrl.agents.builtin_tools import BUILTIN_TOOLS
from hybridrl.agents.tool_config import EpisodeTool
from hybridrl.agents.tools import Tool, ToolCall, ToolOutcome, is_finite_number, parse_tool_calls
from hybridrl.data.records import parse_tools_kwargs
from hybridrl.utils.registry import Registry

logger = logging.getLogger(__name__)

Message = dict[str, Any]
RewardFn = Callable[[str, Mapping[str, Any]], float]
"""``reward(final_text, row) -> float``: the score of an episode's final answer."""


@dataclass
class StepResult:
    """What an environment returns for one model turn."""

    observations: list[Message] = field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    info: dict[str, float] = field(default_factory=dict)


class EnvironmentFailure(RuntimeError):
    """An environment broke its contract (raised, hung, returned the wrong types); ends one episode, counted."""


def checked(result: object) -> StepResult:
    """``result`` if it honours the contract, else :class:`EnvironmentFailure` saying what is wrong."""
    if not isinstance(result, StepResult):
        raise EnvironmentFailure(f"step() returned {type(result).__name__}, not a StepResult")
    if not is_finite_number(result.reward):
        raise EnvironmentFailure(f"step() returned the reward {result.reward!r}: it must be a finite number")
    for message in result.observations:
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            raise EnvironmentFailure(f"step() returned the observation {message!r}: each must be a chat message "
                                     "with text content ({'role': 'tool', 'content': '...'})")
    return result


class Environment:
    """Base class of environments (see the module docstring). ``tools``: schemas shown to the model."""

    tools: Sequence[Tool] = ()

    def reset(self, row: Mapping[str, Any]) -> list[Message]:
        """The opening messages of an episode on data ``row`` (its ``prompt`` column by default)."""
        prompt = row.get("prompt")
        if isinstance(prompt, str):
            return [{"role": "user", "content": prompt}]
        return [dict(message) for message in prompt]

    def step(self, model_text: str) -> StepResult:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the episode held (default: nothing)."""


class ToolEnvironment(Environment):
    """Tool calls answered by plain Python functions; the turn without a call is the answer, scored by ``reward``.

    Args:
        tools: what the model may call.
        reward: ``reward(final_text, row)`` for the final answer.
        max_tool_calls: calls answered per turn (more are refused, counted as errors).
    """

    def __init__(self, tools: Sequence[Tool | EpisodeTool], reward: RewardFn, max_tool_calls: int = 4) -> None:
        self.tools, self.reward, self.max_tool_calls = list(tools), reward, max_tool_calls
        self.by_name: dict[str, Tool] = {}
        self.row: Mapping[str, Any] = {}

    def reset(self, row: Mapping[str, Any]) -> list[Message]:
        """Binds each tool to the row: its ``extra_info.tools_kwargs[<tool>].create_kwargs`` (verl's layout) are
        keyword arguments the model does not pass; a per-episode tool (a class) gets its instance here."""
        self.row = row
        self.by_name = {tool.name: tool.for_episode(row_tool_arguments(row, tool.name)) for tool in self.tools}
        return super().reset(row)

    def close(self) -> None:
        """Ends the episode's tool instances (their ``close()``, verl's ``release``)."""
        for tool in self.by_name.values():
            closer = getattr(tool.function, "close", None)
            if callable(closer):
                closer()

    def step(self, model_text: str) -> StepResult:
        parsed = parse_tool_calls(model_text)
        if not parsed.found:
            return self._final_answer(model_text)
        info = {"tool_calls": 0.0, "tool_errors": float(len(parsed.errors)), "tool_timeouts": 0.0,
                "tool_seconds": 0.0}
        observations = [{"role": "tool", "content": f"error: {error}"} for error in parsed.errors]
        outcomes = [self._answer(call, index, info) for index, call in enumerate(parsed.calls)]
        observations += [{"role": "tool", "content": outcome.content} for outcome in outcomes]
        return StepResult(observations=observations, reward=sum(outcome.reward for outcome in outcomes), info=info)

    def _final_answer(self, model_text: str) -> StepResult:
        return StepResult(reward=float(self.reward(model_text, self.row)), done=True)

    def _answer(self, call: ToolCall, index: int, info: dict[str, float]) -> ToolOutcome:
        if index >= self.max_tool_calls:
            info["tool_errors"] += 1
            return ToolOutcome(f"error: at most {self.max_tool_calls} tool calls per turn")
        tool = self.by_name.get(call.name)
        if tool is None:
            info["tool_errors"] += 1
            return ToolOutcome(f"error: unknown tool {call.name!r}; the tools are {', '.join(sorted(self.by_name))}")
        started = time.perf_counter()
        outcome = tool.call(call.arguments)
        if outcome.raised:
            log_tool_exception(call.name, outcome.error)
        info["tool_seconds"] += time.perf_counter() - started
        info["tool_calls"] += 1
        info["tool_errors"] += outcome.error is not None
        info["tool_timeouts"] += outcome.timed_out
        return outcome


class SingleTurnEnvironment(ToolEnvironment):
    """One model turn, scored by ``reward`` (verl's ``single_turn_agent``): a row of a multi-turn dataset that needs
    no tools — the tool environment without tools, whose every turn is the final answer."""

    def __init__(self, tools: Sequence[Tool | EpisodeTool], reward: RewardFn, max_tool_calls: int = 4) -> None:
        super().__init__([], reward, max_tool_calls)

    def step(self, model_text: str) -> StepResult:
        return self._final_answer(model_text)


MAX_LOGGED_TOOL_EXCEPTIONS = 100
"""Distinct (tool, exception text) pairs logged per process; later new ones are counted only (``tool_errors``)."""
_logged_tool_exceptions: set[tuple[str, str]] = set()
_logged_lock = threading.Lock()


def log_tool_exception(tool_name: str, error: Optional[str]) -> None:
    """A warning naming the tool and quoting its exception, once per distinct message: a tool that raises on every
    call shows why in the log, not only in a counter (the model sees the same text as the tool's message)."""
    key = (tool_name, error or "")
    with _logged_lock:
        if key in _logged_tool_exceptions or len(_logged_tool_exceptions) >= MAX_LOGGED_TOOL_EXCEPTIONS:
            return
        _logged_tool_exceptions.add(key)
    logger.warning("tool %r raised: %s (logged once per distinct message; the model sees it as the tool's answer, "
                   "counted in agent/tool_errors)", tool_name, error)


def row_tools_kwargs(row: Mapping[str, Any]) -> Optional[Mapping[str, Any]]:
    """The row's ``extra_info.tools_kwargs`` as a mapping, or None. Rows read from files were parsed when loaded;
    a row built in code is parsed the same way (``data.records.parse_tools_kwargs``: a JSON string, as verl's
    parquet files may hold, becomes a mapping; anything else is a ``ValueError`` that ends the episode)."""
    extra = row.get("extra_info")
    per_tool = extra.get("tools_kwargs") if isinstance(extra, Mapping) else None
    return parse_tools_kwargs(per_tool, "the row's extra_info")


def row_tool_arguments(row: Mapping[str, Any], tool_name: str) -> dict[str, Any]:
    """``row["extra_info"]["tools_kwargs"][tool_name]["create_kwargs"]`` (verl's layout) without None values, or
    ``{}``."""
    per_tool = row_tools_kwargs(row)
    entry = per_tool.get(tool_name) if isinstance(per_tool, Mapping) else None
    arguments = entry.get("create_kwargs") if isinstance(entry, Mapping) else None
    if not isinstance(arguments, Mapping):
        return {}
    # a parquet struct column holds every row's keys: another row's key is None here, and the tool's default applies
    return {key: value for key, value in arguments.items() if value is not None}


def unknown_row_tools(row: Mapping[str, Any], tool_names: Sequence[str]) -> list[str]:
    """The tools the row's ``extra_info.tools_kwargs`` gives arguments to that are not among ``tool_names`` (an entry
    that is None is another row's key of a parquet struct column, not this row's)."""
    per_tool = row_tools_kwargs(row) or {}
    return sorted(str(name) for name, entry in per_tool.items() if entry is not None and name not in tool_names)


ENVIRONMENTS: Registry[Callable[..., Environment]] = Registry("environment")
"""Environment factories by name: ``factory(tools, reward, max_tool_calls) -> Environment``."""


ENVIRONMENTS.register("tool")(ToolEnvironment)
ENVIRONMENTS.register("single_turn")(SingleTurnEnvironment)
ENVIRONMENTS.register("tool_agent")(ToolEnvironment)  # verl's agent_name for its tool agent loop
ENVIRONMENTS.register("single_turn_agent")(SingleTurnEnvironment)  # verl's agent_name for one-turn rows


def resolve_tools(names: Sequence[str], extra: Optional[Mapping[str, Tool]] = None) -> list[Tool]:
    """The tools called ``names`` (built-in, or in ``extra``); ``KeyError`` naming an unknown one and the choices."""
    known = {**BUILTIN_TOOLS, **(extra or {})}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise KeyError(f"unknown tool(s) {unknown}; known: {sorted(known)}")
    return [known[name] for name in names]
