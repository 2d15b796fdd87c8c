"""Users' agents in a process of their own (``rollout.multi_turn.agent_process``): a rollout replica's episodes are
played by a child process that imports the agent by name and talks to the replica's gateway over HTTP like any
client, so the agents' Python (the ``openai`` client, their tools, their own code) runs beside the engine instead of
taking turns with it under one interpreter lock — and an agent that blocks its event loop, leaks or crashes takes
down its process, not the rollout worker.

The child is a fresh interpreter (nothing of the parent's engine, threads or ``__main__`` is inherited), started on
first use and kept for later calls; it may be another virtual environment's (``python``), for agents whose
libraries cannot share the trainer's. Parent and child talk over a socket pair of their own. A batch that does not
come back in time — an agent that blocks the event loop, so no per-episode timeout can fire — or a child that dies
ends that batch's episodes as failures, each saying why; the next batch starts a fresh child.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import subprocess
import sys
import threading
import weakref
from dataclasses import dataclass
from multiprocessing.connection import Connection
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
    child process; an :class:`~hybridrl.gateway.episodes.AgentPlayer`.

    Args:
        agent: the agent's name, imported in the child.
        key: the setting that named it, for errors.
        grace_s: how long past its episodes' time limits a batch may take before the process is deemed stuck.
        python: the interpreter the child runs (a virtual environment's ``bin/python`` with libraries that cannot
            share this one's: ``rollout.multi_turn.agent_python``); it must have hybridrl installed. ``None``:
            this interpreter, with this process's import path.
    """

    def __init__(self, agent: str, key: str = "rollout.multi_turn.agent", grace_s: float = GRACE_S,
                 python: Optional[str] = None) -> None:
        self.agent, self.key, self.grace_s, self.python = agent, key, grace_s, python
        self._process: Optional[subprocess.Popen] = None
        self._connection: Optional[Connection] = None
        self._lock = threading.Lock()
        weakref.finalize(self, _end, self.__dict__)

    async def play(self, rows: Sequence[Mapping[str, Any]], session_urls: Sequence[str], *, timeout_s: float,
                   concurrency: int, api_key: str) -> list[EpisodeOutcome]:
        batch = _Batch(self.agent, [dict(row) for row in rows], list(session_urls), timeout_s, concurrency, api_key)
        waves = math.ceil(len(rows) / max(concurrency, 1))
        return await asyncio.to_thread(self._play, batch, timeout_s * waves + self.grace_s)

    def _play(self, batch: _Batch, deadline_s: float) -> list[EpisodeOutcome]:
        with self._lock:
            try:
                connection = self._started()
                connection.send(batch)
                if not connection.poll(deadline_s):
                    failure = (f"the agent process answered no batch in {deadline_s:g} s (an agent that blocks its "
                               "event loop, e.g. with time.sleep or a synchronous client, stops every episode in it)")
                else:
                    reply = connection.recv()
                    if isinstance(reply, str):  # the agent could not be loaded there: the run's error
                        raise ValueError(reply)
                    return reply
            except (EOFError, OSError):
                failure = f"the agent process died (exit code {self._exit_code()})"
            self.close()
            logger.warning("%s: %s; its %d episodes fail, the next batch starts a new process", self.key, failure,
                           len(batch.rows))
            return [EpisodeOutcome(failure=failure) for _ in batch.rows]

    def _started(self) -> Connection:
        if self._process is None or self._process.poll() is not None:
            self.close()
            ours, theirs = socket.socketpair()
            environment = dict(os.environ)
            if self.python is None:  # the same interpreter finds the same modules (the agent's among them)
                environment["PYTHONPATH"] = os.pathsep.join(path for path in sys.path if path)
            with theirs:
                self._process = subprocess.Popen(
                    [self.python or sys.executable, "-c", "import sys; from hybridrl.gateway.agent_process import "
                     "serve_on; serve_on(int(sys.argv[1]))", str(theirs.fileno())],
                    pass_fds=(theirs.fileno(),), env=environment, stdin=subprocess.DEVNULL)
            self._connection = Connection(ours.detach())
        return self._connection

    def _exit_code(self) -> Optional[int]:
        if self._process is None:
            return None
        try:
            return self._process.wait(1.0)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        """End the child process (a later batch starts another)."""
        _end(self.__dict__)


def _end(state: dict) -> None:
    """Close an :class:`AgentProcess`'s connection and end its child (also when it is garbage-collected)."""
    connection, process = state.get("_connection"), state.get("_process")
    state["_connection"] = state["_process"] = None
    if connection is not None:
        connection.close()
    if process is not None and process.poll() is None:
        process.terminate()
        try:
            process.wait(5.0)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5.0)


def serve_on(fd: int) -> None:
    """The child's entry point: serve the parent on the socket ``fd`` it was handed."""
    _serve(Connection(fd))


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
        except (ValueError, TypeError) as error:  # the agent could not be loaded: its message, as plain text
            reply = str(error)
        try:
            connection.send(reply)
        except (OSError, EOFError):  # the parent is gone
            return
