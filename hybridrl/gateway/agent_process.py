"""Users' agents in a process of their own (``rollout.multi_turn.agent_process``): a rollout replica's episodes are
played by a child process that imports the agent by name and talks to the replica's gateway over HTTP like any
client, so the agents' Python (the ``openai`` client, their tools, their own code) runs beside the engine instead of
taking turns with it under one interpreter lock — and an agent that blocks its event loop, leaks or crashes takes
down its process, not the rollout worker.

The child is a fresh interpreter (nothing of the parent's engine, threads or ``__main__`` is inherited) in a process
group of its own, started on first use — it loads the agent, then says it is ready — and kept for later calls; it
may be another virtual environment's (``python``), for agents whose libraries cannot share the trainer's. Parent and
child talk over a socket pair of their own, in plain Python values only (a child of another environment reads
them alike). A batch that does not come back in time — an agent that blocks the event loop, so no per-episode
timeout can fire — or a child that dies ends that batch's episodes as failures, each saying why; the next batch
starts a fresh child. A child whose agents left tasks that ignore cancellation replies, then exits (a fresh one
serves the next batch); a child whose parent is gone exits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from multiprocessing.connection import Connection
from typing import Any, Mapping, Optional, Sequence

from hybridrl.gateway.episodes import EpisodeOutcome, load_agent, play_agent

logger = logging.getLogger(__name__)

GRACE_S = 30.0
START_TIMEOUT_S = 300.0
UNWIND_S = 2.0  # per wave: a timed-out episode's second to unwind, client set-up and teardown


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
        if not math.isfinite(timeout_s) or timeout_s <= 0:
            raise ValueError(f"{self.key}: the episode time limit must be a finite number of seconds, got {timeout_s}")
        batch = {"rows": [dict(row) for row in rows], "session_urls": list(session_urls), "timeout_s": timeout_s,
                 "concurrency": concurrency, "api_key": api_key}
        waves = math.ceil(len(rows) / max(concurrency, 1))
        return await asyncio.to_thread(self._play, batch, waves * (timeout_s + UNWIND_S) + self.grace_s)

    def _play(self, batch: dict, deadline_s: float) -> list[EpisodeOutcome]:
        with self._lock:
            try:
                connection = self._started()
            except OSError as error:
                return self._failed(batch, f"the agent process could not start: {error}")
            try:
                connection.send(batch)
                if not connection.poll(deadline_s):
                    return self._failed(batch, f"the agent process answered no batch in {deadline_s:g} s (an agent "
                                               "that blocks its event loop, e.g. with time.sleep or a synchronous "
                                               "client, stops every episode in it)")
                kind, payload, exiting = connection.recv()
            except (EOFError, OSError):
                return self._failed(batch, f"the agent process died (exit code {self._exit_code()})")
            if exiting:  # its agents left tasks behind: it ends, the next batch gets a fresh one
                self.close()
            if kind == "error":
                return self._failed(batch, payload)
            return [EpisodeOutcome(**outcome) for outcome in payload]

    def _failed(self, batch: dict, failure: str) -> list[EpisodeOutcome]:
        self.close()
        logger.warning("%s: %s; its %d episodes fail, the next batch starts a new process", self.key, failure,
                       len(batch["rows"]))
        return [EpisodeOutcome(failure=failure) for _ in batch["rows"]]

    def _started(self) -> Connection:
        """The running child's connection, starting one (and waiting until it has loaded the agent) if needed;
        ``ValueError`` with the child's message when the agent does not load there."""
        if self._process is not None and self._process.poll() is None:
            return self._connection
        self.close()
        ours, theirs = socket.socketpair()
        environment = dict(os.environ)
        if self.python is None:  # the same interpreter finds the same modules (the agent's among them)
            environment["PYTHONPATH"] = os.pathsep.join(path for path in sys.path if path)
        with theirs:
            self._process = subprocess.Popen(
                [self.python or sys.executable, "-c", "import sys; from hybridrl.gateway.agent_process import "
                 "serve_on; serve_on(int(sys.argv[1]), sys.argv[2])", str(theirs.fileno()), self.agent],
                pass_fds=(theirs.fileno(),), env=environment, stdin=subprocess.DEVNULL, start_new_session=True)
        self._connection = Connection(ours.detach())
        if not self._connection.poll(START_TIMEOUT_S):
            self.close()
            raise OSError(f"it loaded no agent in {START_TIMEOUT_S:g} s")
        try:
            kind, message, _ = self._connection.recv()
        except EOFError:
            raise OSError(f"it exited while starting (exit code {self._exit_code()})") from None
        if kind != "ready":
            self.close()
            raise ValueError(message)
        return self._connection

    def _exit_code(self) -> Optional[int]:
        if self._process is None:
            return None
        try:
            return self._process.wait(1.0)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        """End the child process and what it started (a later batch starts another)."""
        _end(self.__dict__)


def _end(state: dict) -> None:
    """Close an :class:`AgentProcess`'s connection and end its child's process group (also when it is
    garbage-collected)."""
    connection, process = state.get("_connection"), state.get("_process")
    state["_connection"] = state["_process"] = None
    if connection is not None:
        connection.close()
    if process is None:
        return
    for sent, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sent)  # the group: processes the agent started go too
        except ProcessLookupError:
            pass
        try:
            process.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def serve_on(fd: int, agent_name: str) -> None:
    """The child's entry point: load the agent, say so on the socket ``fd``, then play each batch it is sent
    until the parent closes the socket or is gone."""
    connection = Connection(fd)
    threading.Thread(target=_exit_when_orphaned, args=(os.getppid(),), daemon=True).start()
    try:
        agent = load_agent(agent_name)
    except (ValueError, TypeError) as error:
        connection.send(("load_error", str(error), True))
        return
    connection.send(("ready", "", False))
    while True:
        try:
            batch = connection.recv()
        except (EOFError, OSError):
            return
        reply = _played(agent, batch)
        try:
            connection.send(reply)
        except OSError:  # the parent is gone
            return
        if reply[2]:
            os._exit(0)  # tasks that ignore cancellation would keep the loop (and asyncio.run) from ending


def _played(agent, batch: dict) -> tuple[str, Any, bool]:
    """``("outcomes", [plain dicts], exiting)`` or ``("error", message, exiting)``: one batch, on a loop of its
    own; ``exiting`` when tasks the agents started are still running after a second's grace."""
    loop = asyncio.new_event_loop()
    try:
        outcomes = loop.run_until_complete(play_agent(agent, batch["rows"], batch["session_urls"],
                                                      timeout_s=batch["timeout_s"],
                                                      concurrency=batch["concurrency"], api_key=batch["api_key"]))
        reply: tuple[str, Any] = ("outcomes", [dataclasses.asdict(outcome) for outcome in outcomes])
    except Exception as error:  # noqa: BLE001 - reported as the batch's failure; the worker goes on
        reply = ("error", f"the agent process failed: {type(error).__name__}: {error}")
    leftovers = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in leftovers:
        task.cancel()
    if leftovers:
        loop.run_until_complete(asyncio.wait(leftovers, timeout=1.0))
    exiting = any(not task.done() for task in leftovers)
    if not exiting:
        loop.close()
    return (*reply, exiting)


def _exit_when_orphaned(parent: int) -> None:
    """End the child when its parent is gone (killed, out of memory) — even while an agent blocks."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)
