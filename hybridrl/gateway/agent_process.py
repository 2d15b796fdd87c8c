"""Users' agents in a process of their own (``rollout.multi_turn.agent_process``): a rollout replica's episodes are
played by a child process that imports the agent by name and talks to the replica's gateway over HTTP like any
client, so the agents' Python (the ``openai`` client, their tools, their own code) runs beside the engine instead of
taking turns with it under one interpreter lock — and an agent that blocks its event loop, leaks or crashes takes
down its process, not the rollout worker.

The child is started on first use (``spawn``: nothing of the parent's engine or threads is inherited) and kept for
later calls. A batch that does not come back in time — an agent that blocks the event loop, so no per-episode
timeout can fire — or a child that dies ends that batch's episodes as failures, each saying why; the next batch
starts a fresh child.
"""

from __future__ import annotations

import asyncio
import logging
import math
import multiprocessing
import threading
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from hybridrl.gateway.episodes import EpisodeOutcome, load_agent, play_agent

logger = logging.getLogger(__name__)

GRACE_S = 30.0


@dataclass(frozen=True)
class _Batch:
    """One request to the child: play ``agent`` (its name) on ``rows`` at ``session_urls``."""

    agent: str
    rows: Sequence[Mapping[str, Any]]
    session_urls: Sequence[str]
    timeout_s: float
    concurrency: int
    api_key: str


class AgentProcess:
    """Plays batches of episodes of the agent named ``agent`` (``module:function`` or ``file.py:function``) in a
    child process; an :class:`~hybridrl.gateway.episodes.AgentPlayer`. ``key`` names the setting in errors;
    ``grace_s``: how long past its episodes' time limits a batch may take before the process is deemed stuck."""

    def __init__(self, agent: str, key: str = "rollout.multi_turn.agent", grace_s: float = GRACE_S) -> None:
        self.agent, self.key, self.grace_s = agent, key, grace_s
        self._process: Optional[multiprocessing.process.BaseProcess] = None
        self._connection = None
        self._lock = threading.Lock()

    async def play(self, rows: Sequence[Mapping[str, Any]], session_urls: Sequence[str], *, timeout_s: float,
                   concurrency: int, api_key: str) -> list[EpisodeOutcome]:
        batch = _Batch(self.agent, [dict(row) for row in rows], list(session_urls), timeout_s, concurrency, api_key)
        waves = math.ceil(len(rows) / max(concurrency, 1))
        return await asyncio.to_thread(self._play, batch, timeout_s * waves + self.grace_s)

    def _play(self, batch: _Batch, deadline_s: float) -> list[EpisodeOutcome]:
        with self._lock:
            connection = self._started()
            connection.send(batch)
            failure = None
            try:
                if connection.poll(deadline_s):
                    reply = connection.recv()
                    if isinstance(reply, BaseException):  # the agent could not be loaded: the run's error
                        raise reply
                    return reply
                failure = (f"the agent process answered no batch in {deadline_s:g} s (an agent that blocks its "
                           "event loop, e.g. with time.sleep or a synchronous client, stops every episode in it)")
            except (EOFError, OSError, ConnectionError):
                failure = f"the agent process died (exit code {self._exit_code()})"
            self.close()
            logger.warning("%s: %s; its %d episodes fail, the next batch starts a new process", self.key, failure,
                           len(batch.rows))
            return [EpisodeOutcome(failure=failure) for _ in batch.rows]

    def _started(self):
        if self._process is None or not self._process.is_alive():
            self.close()
            context = multiprocessing.get_context("spawn")
            parent, child = context.Pipe()
            self._process = context.Process(target=_serve, args=(child,), name="hybridrl-agents", daemon=True)
            self._process.start()
            child.close()
            self._connection = parent
        return self._connection

    def _exit_code(self) -> Optional[int]:
        if self._process is None:
            return None
        self._process.join(1.0)
        return self._process.exitcode

    def close(self) -> None:
        """End the child process (a later batch starts another)."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        if self._process is not None:
            if self._process.is_alive():
                self._process.terminate()
                self._process.join(5.0)
                if self._process.is_alive():
                    self._process.kill()
                    self._process.join(5.0)
            self._process = None


def _serve(connection) -> None:
    """The child: play each batch it is sent, until the parent closes the pipe."""
    agents: dict[str, Any] = {}
    while True:
        try:
            batch: _Batch = connection.recv()
        except (EOFError, OSError):
            return
        try:
            agent = agents.get(batch.agent) or agents.setdefault(batch.agent, load_agent(batch.agent))
            reply: Any = asyncio.run(play_agent(agent, batch.rows, batch.session_urls, timeout_s=batch.timeout_s,
                                                concurrency=batch.concurrency, api_key=batch.api_key))
        except (ValueError, TypeError) as error:  # the agent could not be loaded
            reply = error
        try:
            connection.send(reply)
        except (OSError, EOFError):  # the parent is gone
            return
