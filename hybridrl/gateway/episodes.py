"""Users' own agent code as episodes: ``async def agent(row, client) -> float | AgentResult``, run once per row with an
``openai.AsyncOpenAI`` client pointed at its own session of the gateway, many at once.

The agent is plain OpenAI-client code — a loop over ``client.chat.completions.create``, with its own tools — and
returns the episode's reward (or an :class:`AgentResult`). Every call it makes is captured by the gateway token for
token (``sessions.py``); :func:`run_episodes` hands back, per row, the session's record with the reward. An agent
that raises or runs past ``timeout_s`` loses only its own episode: counted, its failure named, never raised.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
import logging
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping, Optional, Protocol, Sequence, Union

from hybridrl.gateway.sessions import SessionRecord
from hybridrl.utils.user_files import import_named

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentResult:
    """What an agent may return instead of a bare reward: the ``reward`` (``None``: the reward function's) and
    numbers about the episode (``info``: names to numbers, kept on its :class:`AgentEpisode`; the trainer does not
    log them yet). ``info`` with a value that is not a number fails the episode, saying which."""

    reward: Optional[float]
    info: Mapping[str, float] = field(default_factory=dict)


Agent = Callable[[Mapping[str, Any], Any], Awaitable[Union[float, AgentResult, None]]]
"""``async def agent(row, client)``: ``row`` is the data row, ``client`` an ``openai.AsyncOpenAI``; it returns the
episode's reward, or ``None`` to leave the reward to the data source's reward function."""


@dataclass
class AgentEpisode:
    """One row's episode: the gateway's ``record`` of its calls, the ``reward`` (``None`` when it failed or the
    agent left it to the reward function), the ``failure`` (why, in one line), ``info`` the agent returned, and its
    wall ``seconds``."""

    row: Mapping[str, Any]
    record: SessionRecord
    reward: Optional[float] = None
    failure: Optional[str] = None
    info: Mapping[str, float] = field(default_factory=dict)
    seconds: float = 0.0


def load_agent(name: str, key: str = "rollout.multi_turn.agent") -> Agent:
    """The agent ``name`` names (``module:function``, ``file.py:function``), checked; ``ValueError`` /
    ``TypeError`` naming ``key``."""
    return check_agent(import_named(name, key), key)


def check_agent(agent: Any, name: str = "agent") -> Agent:
    """``agent`` if it is an ``async def`` taking ``(row, client)``; otherwise a ``TypeError`` saying what is
    expected (``name``: how the user named it, e.g. a config key)."""
    target = agent.__call__ if not inspect.isfunction(agent) and callable(agent) else agent
    if not inspect.iscoroutinefunction(target):
        raise TypeError(f"{name}: expected `async def agent(row, client) -> float`, got {agent!r} (not an async "
                        "function)")
    try:
        inspect.signature(agent).bind(object(), object())
    except TypeError as error:
        raise TypeError(f"{name}: `{getattr(agent, '__name__', agent)}` must take (row, client): {error}") from None
    return agent


@dataclass(frozen=True)
class EpisodeOutcome:
    """How one agent episode ended, on the client's side: its ``reward`` (``None``: failed, or left to the reward
    function), its ``failure`` in one line, the agent's ``info``, and its wall ``seconds``. Plain data: it crosses
    processes (``agent_process.py``)."""

    reward: Optional[float] = None
    failure: Optional[str] = None
    info: Mapping[str, float] = field(default_factory=dict)
    seconds: float = 0.0


class AgentPlayer(Protocol):
    """Where a batch of episodes runs: :class:`InProcess` (this event loop) or an ``AgentProcess`` (a process of its
    own, ``agent_process.py``). ``session_urls[i]`` is row ``i``'s base URL; outcomes come back in row order."""

    async def play(self, rows: Sequence[Mapping[str, Any]], session_urls: Sequence[str], *, timeout_s: float,
                   concurrency: int, api_key: str) -> list[EpisodeOutcome]: ...


@dataclass(frozen=True)
class InProcess:
    """An agent function played on the caller's event loop (easiest to debug; shares the interpreter with the
    engine when the caller is a rollout worker), each on a copy of its row (an ``AgentProcess``'s rows are copies
    by crossing to it)."""

    agent: Agent

    async def play(self, rows: Sequence[Mapping[str, Any]], session_urls: Sequence[str], *, timeout_s: float,
                   concurrency: int, api_key: str) -> list[EpisodeOutcome]:
        rows = [copy.deepcopy(row) for row in rows]  # an agent may edit its row: never its siblings' or the caller's
        return await play_agent(self.agent, rows, session_urls, timeout_s=timeout_s, concurrency=concurrency,
                                api_key=api_key)


async def run_episodes(agent: Union[Agent, AgentPlayer], rows: Sequence[Mapping[str, Any]], gateway, *,
                       timeout_s: float = 600.0, concurrency: int = 256, api_key: str = "hybridrl",
                       session_prefix: Optional[str] = None) -> list[AgentEpisode]:
    """Run ``agent`` once per row, up to ``concurrency`` at once, each with a client on a session of its own
    (``gateway``: a :class:`hybridrl.gateway.app.Gateway`); the episodes in row order. Session ``i`` is named
    ``<session_prefix>-i`` (default: a random prefix). ``agent``: an ``async def agent(row, client)`` (played on this
    event loop) or an :class:`AgentPlayer` (e.g. an ``AgentProcess``)."""
    player = agent if hasattr(agent, "play") else InProcess(check_agent(agent))
    prefix = session_prefix or uuid.uuid4().hex[:8]
    session_ids = [f"{prefix}-{index}" for index in range(len(rows))]
    outcomes = await player.play(rows, [gateway.session_url(session_id) for session_id in session_ids],
                                 timeout_s=timeout_s, concurrency=concurrency, api_key=api_key)
    episodes = []
    for index, (row, session_id, outcome) in enumerate(zip(rows, session_ids, outcomes, strict=True)):
        if outcome.failure is not None:
            logger.warning("agent episode %d failed: %s", index, outcome.failure)
        episodes.append(AgentEpisode(row, gateway.service.take_session(session_id), reward=outcome.reward,
                                     failure=outcome.failure, info=dict(outcome.info), seconds=outcome.seconds))
    return episodes


async def play_agent(agent: Agent, rows: Sequence[Mapping[str, Any]], session_urls: Sequence[str], *,
                     timeout_s: float, concurrency: int, api_key: str) -> list[EpisodeOutcome]:
    """The client's side of :func:`run_episodes`: ``agent`` once per row, with an ``openai.AsyncOpenAI`` on
    ``session_urls[i]``, up to ``concurrency`` at once; the outcomes in row order."""
    import httpx
    import openai

    limit = asyncio.Semaphore(concurrency)
    tls = _unused_tls_context()

    async def one(row: Mapping[str, Any], session_url: str) -> EpisodeOutcome:
        async with limit:
            # a small pool per episode: an episode's calls come one after another, and one pool shared by
            # hundreds of episodes spends its time scanning its connections (httpcore) on every request
            async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), verify=tls,
                                         limits=httpx.Limits(max_connections=4)) as http:
                client = openai.AsyncOpenAI(base_url=session_url, api_key=api_key, http_client=http, max_retries=0)
                started = time.monotonic()
                outcome = await _outcome(agent, row, client, timeout_s)
        seconds = time.monotonic() - started
        if isinstance(outcome, str):
            return EpisodeOutcome(failure=outcome, seconds=seconds)
        return EpisodeOutcome(reward=outcome[0], info=outcome[1], seconds=seconds)
    return list(await asyncio.gather(*(one(row, url) for row, url in zip(rows, session_urls))))


def _numbers(info: Mapping[str, Any]) -> dict[str, float]:
    """``AgentResult.info`` as ``{name: float}`` (what may cross to another process and into metrics);
    ``TypeError`` naming the first entry that is not a number."""
    if not isinstance(info, Mapping):
        raise TypeError(f"AgentResult.info must be a mapping of names to numbers, got {type(info).__name__}")
    numbers = {}
    for name, value in info.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"AgentResult.info[{name!r}] = {value!r} is not a number")
        numbers[str(name)] = float(value)
    return numbers


@functools.lru_cache(maxsize=1)
def _unused_tls_context():
    """One TLS context for every episode's ``httpx`` client, made once per process: the gateway speaks plain HTTP,
    but each client would otherwise build (and load the CA bundle into) its own — ≈ 0.1 s, once per generation
    call even when shared by the call's episodes."""
    import httpx

    return httpx.create_ssl_context()


async def _outcome(agent: Agent, row: Mapping[str, Any], client, timeout_s: float):
    """``(reward, info)``, or the failure in one line."""
    task = asyncio.ensure_future(agent(row, client))
    done, _ = await asyncio.wait({task}, timeout=timeout_s)
    if not done:
        task.cancel()
        await asyncio.wait({task}, timeout=1.0)  # let it unwind; one that ignores cancellation is left behind
        return f"the agent took longer than {timeout_s:g} s"
    try:
        returned = task.result()
        reward, info = (returned.reward, _numbers(returned.info)) if isinstance(returned, AgentResult) \
            else (returned, {})
    except Exception as error:  # noqa: BLE001 - the user's code: its episode ends, the run goes on
        return f"the agent raised {type(error).__name__}: {error}"
    if reward is None:
        return None, info
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        return f"the agent returned {reward!r}: a reward must be a finite number, None or an AgentResult"
    return float(reward), info
