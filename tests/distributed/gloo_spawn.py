"""Run a function on N CPU processes joined in a real gloo process group (no Ray) — for FSDP2 exactness tests.
The processes are reused from call to call (``gloo_pool``) unless a call asks for fresh ones."""

from __future__ import annotations

import os
import socket
import tempfile
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessRaisedException

from gloo_pool import JoinFailed, RankDied, shared_rank_pool


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class GlooRankError(RuntimeError):
    """One or more ranks raised; the message holds every failed rank's traceback, the likely cause first."""


def _entry(rank: int, world_size: int, port: int, fn: Callable[..., Any], args: tuple, error_dir: str,
           backend: str = "gloo") -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    try:
        fn(rank, world_size, *args)
    except BaseException:
        Path(error_dir, f"rank{rank}.txt").write_text(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


def run_on_gloo(world_size: int, fn: Callable[..., Any], *args: Any, backend: str = "gloo",
                fresh: bool = False) -> None:
    """Call ``fn(rank, world_size, *args)`` on ``world_size`` processes in one process group; raises if any rank
    fails. gloo calls run on this test process's reused rank processes (``gloo_pool``: each call gets a new group,
    and a process left unclean or failed is replaced); ``fresh=True`` spawns new processes for this call only, as
    ``backend="nccl"`` (one CUDA device per rank, ``cuda:rank``, for the GPU tests) always does.

    A failing rank's exception reaches the caller even when a peer, left waiting in a collective, fails too and is
    noticed first: :class:`GlooRankError` lists every failed rank's traceback, those that are not the fallout of a
    closed connection first. A rank killed by a *signal* (not an exception) is retried once, on new processes and a
    new port: under heavy CPU contention a gloo process has been seen to abort (SIGABRT) during start-up; so is a
    pooled call whose ranks could not join their group (``fn`` never ran). An exception in ``fn`` — a failed
    assertion included — is never retried.
    """
    if backend == "gloo" and not fresh:
        _run_pooled(world_size, fn, args)
        return
    try:
        _spawn(world_size, fn, args, backend)
    except mp.ProcessExitedException as error:
        if error.signal_name is None:
            raise
        warnings.warn(f"gloo rank {error.error_index} died by {error.signal_name}; retrying the spawn once")
        _spawn(world_size, fn, args, backend)


def _run_pooled(world_size: int, fn: Callable[..., Any], args: tuple) -> None:
    pool = shared_rank_pool()
    try:
        failures = pool.run(world_size, fn, args, free_port())
    except (RankDied, JoinFailed) as lost:
        warnings.warn(f"{lost}; retrying once on new processes and a new port")
        failures = pool.run(world_size, fn, args, free_port())
    if failures:
        raise GlooRankError(_failure_report(failures))


def _spawn(world_size: int, fn: Callable[..., Any], args: tuple, backend: str = "gloo") -> None:
    with tempfile.TemporaryDirectory(prefix="gloo_errors_") as error_dir:
        try:
            mp.start_processes(_entry, args=(world_size, free_port(), fn, args, error_dir, backend), nprocs=world_size,
                               join=True, start_method="spawn")
        except ProcessRaisedException as error:  # a rank killed by a signal propagates as is (retried above)
            failures = {int(path.stem[len("rank"):]): path.read_text() for path in Path(error_dir).glob("rank*.txt")}
            if not failures:
                raise
            raise GlooRankError(_failure_report(failures)) from error


_FALLOUT = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Socket Timeout", "timed out")


def _failure_report(failures: dict[int, str]) -> str:
    """Every failed rank's traceback; a rank whose error is a peer's fallout (a closed connection) comes last."""
    def fallout(rank: int) -> bool:
        last_line = failures[rank].strip().splitlines()[-1]
        return any(marker in last_line for marker in _FALLOUT)

    order = sorted(failures, key=lambda rank: (fallout(rank), rank))
    return "\n".join(f"--- rank {rank} ---\n{failures[rank]}" for rank in order)
