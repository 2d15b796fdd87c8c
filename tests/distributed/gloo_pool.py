"""Rank processes started once per test process and reused by every gloo test that runs in it.

Spawning a rank costs a Python start and the imports of torch, transformers and the test module (3-4 CPU seconds on
the 2-core box); the FSDP2 exactness tests spawned 49 pairs of them in one ``make test``. A :class:`RankPool` keeps
its processes: each call sends the function and its arguments to ranks ``0 .. world_size - 1`` over a pipe; every
rank joins a fresh gloo group on a new port, runs the function, leaves the group and answers with its outcome.

A reused process must look like a fresh one to the next test. After each call a rank restores what a test may
change (environment variables, working directory, default dtype, deterministic-algorithm flag, grad mode, torch
threads) and reports whether it is still *clean*: no thread or child process left running, no vLLM imported (it
changes process-wide state). The pool is ended, and the next call starts new processes, after a call with an unclean
rank, a failed call, a rank that died, or an interrupted wait.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from hybridrl.utils.distributed import leave_process_group

FAILURE_GRACE_S = 10.0
"""After one rank fails, how long the others get to report (a peer blocked in a collective fails as soon as the
failed rank leaves the group)."""


@dataclass
class Outcome:
    """One rank's answer to a call: ``error`` is its traceback (``None``: it returned); ``joined``: it got into the
    process group (``False``: joining failed, before the function ran); ``clean``: the process is fit for the next
    call."""

    error: Optional[str]
    joined: bool
    clean: bool


class JoinFailed(RuntimeError):
    """A rank could not join the call's process group (the port taken meanwhile, a peer that failed to start): the
    function never ran, so the call can be made again."""


class RankDied(RuntimeError):
    """A rank process ended during a call (a signal, or ``os._exit``): ``exitcode`` as ``multiprocessing`` gives it."""

    def __init__(self, rank: int, exitcode: Optional[int]) -> None:
        super().__init__(f"gloo rank {rank} died (exit code {exitcode})")
        self.rank, self.exitcode = rank, exitcode


def _process_state() -> dict[str, Any]:
    return {"environ": dict(os.environ), "cwd": os.getcwd(), "dtype": torch.get_default_dtype(),
            "deterministic": torch.are_deterministic_algorithms_enabled(), "grad": torch.is_grad_enabled(),
            "threads": torch.get_num_threads()}


def _restore(state: dict[str, Any]) -> None:
    os.environ.clear()
    os.environ.update(state["environ"])
    os.chdir(state["cwd"])
    torch.set_default_dtype(state["dtype"])
    torch.use_deterministic_algorithms(state["deterministic"])
    torch.set_grad_enabled(state["grad"])
    torch.set_num_threads(state["threads"])


def _still_clean(threads_at_start: int) -> bool:
    import sys

    import psutil

    return ("vllm" not in sys.modules and threading.active_count() <= threads_at_start
            and not psutil.Process().children())


def _serve(rank: int, connection: Connection) -> None:
    """A rank process: run calls until told to stop (``None``)."""
    torch.set_num_threads(1)
    state, threads_at_start = _process_state(), threading.active_count()
    while True:
        call = connection.recv()
        if call is None:
            return
        world_size, port, fn, args = call
        error, joined = None, False
        try:
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                              WORLD_SIZE=str(world_size))
            dist.init_process_group("gloo", rank=rank, world_size=world_size)
            joined = True
            fn(rank, world_size, *args)
        except BaseException:  # noqa: BLE001 - the caller gets every rank's traceback
            error = traceback.format_exc()
        finally:
            leave_process_group()
            _restore(state)
        connection.send(Outcome(error, joined, error is None and _still_clean(threads_at_start)))


class RankPool:
    """Rank processes ``0 .. size - 1``, grown on demand; a call on ``world_size`` ranks uses the first ones."""

    def __init__(self) -> None:
        self._context = multiprocessing.get_context("spawn")
        self._ranks: list[tuple[multiprocessing.process.BaseProcess, Connection]] = []

    def run(self, world_size: int, fn: Callable[..., Any], args: tuple, port: int) -> dict[int, str]:
        """Run ``fn(rank, world_size, *args)`` on the first ``world_size`` ranks; the tracebacks of those that raised
        (empty: all returned). Raises :class:`RankDied` when a rank's process ends during the call, and
        :class:`JoinFailed` when a rank could not join the group (the function then ran nowhere to its end)."""
        self._grow(world_size)
        finished = False
        try:
            for _, connection in self._ranks[:world_size]:
                connection.send((world_size, port, fn, args))
            outcomes = self._collect(world_size)
            finished = True
        finally:
            if not finished:  # an interrupt, a dead rank: the others may be anywhere
                self.close()
        if any(outcome.error is not None or not outcome.clean for outcome in outcomes.values()):
            self.close()
        if not all(outcome.joined for outcome in outcomes.values()):
            raise JoinFailed(_first_error(outcomes))
        return {rank: outcome.error for rank, outcome in outcomes.items() if outcome.error is not None}

    def _grow(self, size: int) -> None:
        while len(self._ranks) < size:
            parent_end, child_end = self._context.Pipe()
            process = self._context.Process(target=_serve, args=(len(self._ranks), child_end), daemon=True,
                                            name=f"gloo-rank-{len(self._ranks)}")
            process.start()
            child_end.close()
            self._ranks.append((process, parent_end))

    def _collect(self, world_size: int) -> dict[int, Outcome]:
        outcomes: dict[int, Outcome] = {}
        deadline: Optional[float] = None
        waiting = {connection: rank for rank, (_, connection) in enumerate(self._ranks[:world_size])}
        sentinels = {process.sentinel: rank for rank, (process, _) in enumerate(self._ranks[:world_size])}
        while waiting:
            timeout = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            ready = wait([*waiting, *sentinels], timeout)
            if not ready:  # peers of a failed rank still running after the grace: reported as they are
                break
            for handle in ready:
                if handle in waiting:
                    rank = waiting.pop(handle)
                    sentinels = {s: r for s, r in sentinels.items() if r != rank}
                    try:
                        outcomes[rank] = handle.recv()
                    except EOFError:  # the process ended before it answered
                        self._ranks[rank][0].join(timeout=5)
                        raise RankDied(rank, self._ranks[rank][0].exitcode) from None
                    if outcomes[rank].error is not None and deadline is None:
                        deadline = time.monotonic() + FAILURE_GRACE_S
                elif handle in sentinels:
                    rank = sentinels[handle]
                    raise RankDied(rank, self._ranks[rank][0].exitcode)
        return outcomes

    def close(self) -> None:
        """End every rank process (a rank busy in a collective is killed)."""
        for process, connection in self._ranks:
            try:
                connection.send(None)
            except (BrokenPipeError, OSError):
                pass
            process.join(timeout=2)
            if process.is_alive():
                process.kill()
                process.join()
            connection.close()
        self._ranks = []


def _first_error(outcomes: dict[int, Outcome]) -> str:
    failed = [outcome.error for outcome in outcomes.values() if not outcome.joined and outcome.error]
    return failed[0].strip().splitlines()[-1] if failed else "a rank did not join the process group"


_pool: Optional[RankPool] = None


def shared_rank_pool() -> RankPool:
    """This test process's pool (ended at exit)."""
    global _pool
    if _pool is None:
        import atexit

        _pool = RankPool()
        atexit.register(_pool.close)
    return _pool
