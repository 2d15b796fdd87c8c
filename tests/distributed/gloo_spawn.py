"""Run a function on N CPU processes joined in a real gloo process group (no Ray) — for FSDP2 exactness tests."""

from __future__ import annotations

import os
import socket
import warnings
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _entry(rank: int, world_size: int, port: int, fn: Callable[..., Any], args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()


def run_on_gloo(world_size: int, fn: Callable[..., Any], *args: Any) -> None:
    """Call ``fn(rank, world_size, *args)`` on ``world_size`` spawned processes; raises if any rank fails.

    A rank killed by a *signal* (not an exception) is retried once, with a new port: under heavy CPU contention a
    gloo process has been seen to abort (SIGABRT) during start-up (issue noted for investigation). An exception in
    ``fn`` — a failed assertion included — is never retried.
    """
    try:
        _spawn(world_size, fn, args)
    except mp.ProcessExitedException as error:
        if error.signal_name is None:
            raise
        warnings.warn(f"gloo rank {error.error_index} died by {error.signal_name}; retrying the spawn once")
        _spawn(world_size, fn, args)


def _spawn(world_size: int, fn: Callable[..., Any], args: tuple) -> None:
    mp.start_processes(_entry, args=(world_size, free_port(), fn, args), nprocs=world_size, join=True,
                       start_method="spawn")
