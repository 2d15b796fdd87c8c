"""A small persistent pool of reward worker processes with a per-sample timeout.

Why not ``concurrent.futures.ProcessPoolExecutor``: it cannot stop a running task, so one reward function that
hangs would hold a worker forever (and block shutdown). Here each worker is a ``spawn``-ed process talking to the
parent over its own pipe, and the parent hands out **one sample at a time**:

- a sample that runs past ``timeout_s`` (counted from when it was handed to a worker) gets status ``timeout``; its
  worker is killed (``SIGKILL``) and a fresh one is started in the background while the others keep working;
- a worker that dies mid-sample (segfault, ``os._exit``, OOM kill) gives status ``crashed`` and is replaced;
- the pool is reused across calls, so the common fast path (a batch of cheap pure-Python scores) costs only pipe
  round trips (tens of microseconds per sample), never a process start.

Workers load the reward function themselves from a pickled :class:`~hybridrl.rewards.custom.RewardFunctionSource`
(or a module-level function, pickled by reference), ignore ``SIGINT`` (the parent decides when they stop), and are
daemonic: they die with the parent. ``spawn`` (not ``fork``) keeps them safe to start from processes that hold
threads, CUDA contexts or Ray connections; like any spawn pool, a script that creates one must guard its entry point
with ``if __name__ == "__main__":``.

Pure Python (no torch): the worker processes import only this package's reward modules.
"""

from __future__ import annotations

import multiprocessing
import pickle
import signal
import time
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from hybridrl.rewards.custom import RewardFunctionSource
from hybridrl.rewards.outcome import CRASHED, TIMEOUT, ScoreOutcome, call_reward_fn
from hybridrl.rewards.registry import warm_up

__all__ = ["RewardWorkerPool", "WorkerStartError"]

_START_TIMEOUT_S = 120.0  # a cold start imports Python, this package and the reward module: seconds, not minutes
_READY, _INIT_ERROR = "ready", "init_error"


class WorkerStartError(RuntimeError):
    """A reward worker could not load the reward function or did not start in time."""


def _worker_main(connection: Connection, pickled_source: bytes) -> None:
    """Entry point of a worker process: load the function, then score samples until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        source = pickle.loads(pickled_source)
        function = source.load() if isinstance(source, RewardFunctionSource) else source
        if isinstance(source, RewardFunctionSource) and source.is_builtin:
            warm_up()
    except BaseException as error:  # report anything, including SystemExit from a user file
        connection.send((_INIT_ERROR, f"{type(error).__name__}: {error}"))
        return
    connection.send((_READY, None))
    while True:
        try:
            message = connection.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        task_id, arguments = message
        outcome = call_reward_fn(function, arguments)
        try:
            connection.send((task_id, outcome))
        except Exception as error:  # extras that cannot be pickled
            connection.send((task_id, ScoreOutcome("error", message=f"result could not be sent back: {error}")))


@dataclass
class _Slot:
    """One worker process and what it is doing: ``starting`` → ``idle`` ⇄ ``busy``."""

    process: Any
    connection: Connection
    state: str = "starting"
    task_id: int = -1
    deadline: float = 0.0


class RewardWorkerPool:
    """``num_workers`` persistent processes that score samples with a per-sample timeout.

    Args:
        source: a :class:`RewardFunctionSource`, or a module-level function (pickled by reference).
        num_workers: processes to run (>= 1).
        start_timeout_s: how long a worker may take to start and load the function.
    """

    def __init__(self, source: Any, num_workers: int, *, start_timeout_s: float = _START_TIMEOUT_S) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        try:
            self._pickled_source = pickle.dumps(source)
        except Exception as error:
            raise ValueError(
                f"the reward function {source!r} cannot be sent to worker processes ({error}); use a module-level "
                "function or RewardFunctionSource(path, name)"
            ) from None
        self._context = multiprocessing.get_context("spawn")
        self._num_workers = num_workers
        self._start_timeout_s = start_timeout_s
        self._slots: list[_Slot] = []
        self._finalizer = weakref.finalize(self, _shutdown, self._slots)

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the current workers (for tests and debugging)."""
        return [slot.process.pid for slot in self._slots]

    def run(self, tasks: Sequence[tuple[Any, ...]], timeout_s: float) -> list[ScoreOutcome]:
        """Score every task (the reward function's positional arguments); one outcome per task, in order."""
        while len(self._slots) < self._num_workers:
            self._slots.append(self._start_worker())
        pending = deque(range(len(tasks)))
        outcomes: list[ScoreOutcome | None] = [None] * len(tasks)
        try:
            while pending or any(slot.state == "busy" for slot in self._slots):
                self._dispatch(tasks, pending, timeout_s)
                self._collect(outcomes)
                self._expire(outcomes, timeout_s)
        except BaseException:
            self.close()  # a pool in an unknown state is not reused
            raise
        assert all(outcome is not None for outcome in outcomes)
        return outcomes  # type: ignore[return-value]

    def close(self) -> None:
        """Stop every worker (politely, then by force). The pool restarts workers if used again."""
        _shutdown(self._slots)

    def _start_worker(self) -> _Slot:
        parent_end, child_end = self._context.Pipe(duplex=True)
        process = self._context.Process(
            target=_worker_main, args=(child_end, self._pickled_source), daemon=True, name="hybridrl-reward-worker"
        )
        process.start()
        child_end.close()
        return _Slot(process, parent_end, deadline=time.monotonic() + self._start_timeout_s)

    def _replace(self, slot: _Slot) -> None:
        _kill(slot)
        self._slots[self._slots.index(slot)] = self._start_worker()

    def _dispatch(self, tasks: Sequence[tuple[Any, ...]], pending: deque[int], timeout_s: float) -> None:
        for slot in list(self._slots):
            if slot.state != "idle" or not pending:
                continue
            task_id = pending.popleft()
            try:
                slot.connection.send((task_id, tasks[task_id]))
            except (OSError, ValueError):  # the idle worker died; retry the task on its replacement
                pending.appendleft(task_id)
                self._replace(slot)
                continue
            slot.state, slot.task_id, slot.deadline = "busy", task_id, time.monotonic() + timeout_s

    def _collect(self, outcomes: list[ScoreOutcome | None]) -> None:
        waiting = [slot for slot in self._slots if slot.state != "idle"]
        if not waiting:
            return
        timeout = max(0.0, min(slot.deadline for slot in waiting) - time.monotonic())
        ready = wait([slot.connection for slot in waiting], timeout)
        for slot in waiting:
            if slot.connection in ready:
                self._receive(slot, outcomes)

    def _receive(self, slot: _Slot, outcomes: list[ScoreOutcome | None]) -> None:
        try:
            kind, payload = slot.connection.recv()
        except (EOFError, OSError):
            slot.process.join(timeout=1.0)
            if slot.state == "starting":
                raise WorkerStartError(
                    f"a reward worker exited during start-up (exit code {slot.process.exitcode}); see its stderr"
                ) from None
            message = f"the worker process died (exit code {slot.process.exitcode})"
            outcomes[slot.task_id] = ScoreOutcome(CRASHED, message=message)
            self._replace(slot)
            return
        if kind == _INIT_ERROR:
            raise WorkerStartError(f"a reward worker could not load the reward function: {payload}")
        if kind == _READY:
            slot.state = "idle"
            return
        outcomes[kind] = payload
        slot.state = "idle"

    def _expire(self, outcomes: list[ScoreOutcome | None], timeout_s: float) -> None:
        now = time.monotonic()
        for slot in list(self._slots):
            if slot.state == "idle" or now < slot.deadline:
                continue
            if slot.connection.poll():  # the answer arrived just in time
                self._receive(slot, outcomes)
                continue
            if slot.state == "starting":
                raise WorkerStartError(f"a reward worker did not start within {self._start_timeout_s:g} s")
            message = f"ran longer than the {timeout_s:g} s timeout; its worker was killed"
            outcomes[slot.task_id] = ScoreOutcome(TIMEOUT, message=message)
            self._replace(slot)


def _kill(slot: _Slot) -> None:
    if slot.process.is_alive():
        slot.process.kill()
    slot.process.join(timeout=5.0)
    slot.connection.close()


def _shutdown(slots: list[_Slot]) -> None:
    """Ask idle workers to exit and give them a moment; kill busy or starting ones and stragglers. Empties ``slots``."""
    polite = []
    for slot in slots:
        try:
            if slot.state == "idle":
                slot.connection.send(None)
                polite.append(slot)
        except (OSError, ValueError):
            pass
    deadline = time.monotonic() + 1.0
    for slot in polite:
        slot.process.join(timeout=max(0.0, deadline - time.monotonic()))
    for slot in slots:
        _kill(slot)
    slots.clear()
