"""Users' own agent code as episodes: ``async def agent(row, client) -> float | AgentResult``, run once per row with an
``openai.AsyncOpenAI`` client pointed at its own session of the gateway, many at once.

The agent is plain OpenAI-client code — a loop over ``client.chat.completions.create``, with its own tools — and
returns the episode's reward (or an :class:`AgentResult`). Every call it makes is captured by the gateway token for
token (``sessions.py``); :func:`run_episodes` hands back, per row, the session's record with the reward. An agent
that raises or runs past ``timeout_s`` loses only its own episode: counted, its failure named, never raised.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping, Optional, Sequence, Union

from hybridrl.gateway.sessions import SessionRecord
from hybridrl.utils.user_files import import_named

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentResult:
    """What an agent may return instead of a bare reward: the ``reward`` (``None``: the reward function's) and
    numbers about the episode (``info``: kept on its :class:`AgentEpisode`; the trainer does not log them yet)."""

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


async def run_episodes(agent: Agent, rows: Sequence[Mapping[str, Any]], gateway, *, timeout_s: float = 600.0,
                       concurrency: int = 256, api_key: str = "hybridrl",
                       session_prefix: Optional[str] = None) -> list[AgentEpisode]:
    """Run ``agent`` once per row, up to ``concurrency`` at once, each with a client on a session of its own
    (``gateway``: a :class:`hybridrl.gateway.app.Gateway`); the episodes in row order. Session ``i`` is named
    ``<session_prefix>-i`` (default: a random prefix)."""
    import httpx
    import openai

    check_agent(agent)
    limit = asyncio.Semaphore(concurrency)
    prefix = session_prefix or uuid.uuid4().hex[:8]
    tls = httpx.create_ssl_context()  # made once: the gateway is plain HTTP, but every client would build one

    async def one(index: int, row: Mapping[str, Any]) -> AgentEpisode:
        session_id = f"{prefix}-{index}"
        async with limit:
            # a small pool per episode: an episode's calls come one after another, and one pool shared by
            # hundreds of episodes spends its time scanning its connections (httpcore) on every request
            async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), verify=tls,
                                         limits=httpx.Limits(max_connections=4)) as http:
                client = openai.AsyncOpenAI(base_url=gateway.session_url(session_id), api_key=api_key,
                                            http_client=http, max_retries=0)
                started = time.monotonic()
                outcome = await _outcome(agent, row, client, timeout_s)
        episode = AgentEpisode(row, gateway.service.take_session(session_id), seconds=time.monotonic() - started)
        if isinstance(outcome, str):
            episode.failure = outcome
            logger.warning("agent episode %d failed: %s", index, outcome)
        else:
            episode.reward, episode.info = outcome
        return episode
    return list(await asyncio.gather(*(one(index, row) for index, row in enumerate(rows))))

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
    except Exception as error:  # noqa: BLE001 - the user's code: its episode ends, the run goes on
        return f"the agent raised {type(error).__name__}: {error}"
    reward, info = (returned.reward, dict(returned.info)) if isinstance(returned, AgentResult) else (returned, {})
    if reward is None:
        return None, info
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        return f"the agent returned {reward!r}: a reward must be a finite number, None or an AgentResult"
    return float(reward), info
