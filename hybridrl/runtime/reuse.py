"""Whether a worker process can serve another group once its worker is stopped (:mod:`hybridrl.runtime.parked`).

A process is fit when what its worker did is gone: no thread or child process it started is still running (a
pool kept for the process's life, :mod:`hybridrl.utils.process_threads`, is not the worker's), and
what a worker may change process-wide is as it was when the process started — environment variables and the
working directory (put back here), torch's default dtype, deterministic-algorithm flag, grad mode and thread count
(checked: a difference means something changed them behind the worker's back). The engine the process loaded is
its *profile*: vLLM's import changes process-wide state that no check here can undo, so such a process only serves
ranks that load vLLM themselves; a process where vLLM's Transformers backend rewrote a model class serves none.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any

import torch

from hybridrl.utils.process_threads import kept

VLLM = "vllm"
PLAIN = ""


@dataclass(frozen=True)
class StopReport:
    """What a rank's ``stop`` leaves: whether the process may serve another group (``reusable``; ``why_not`` says
    what was left) and the engine it loaded (``profile``)."""

    reusable: bool
    profile: str
    why_not: str = ""


@dataclass(frozen=True)
class ProcessState:
    """The process-wide settings a fresh worker process starts with."""

    environ: dict[str, str]
    cwd: str
    threads: frozenset[int]
    torch_settings: tuple[Any, ...]

    @classmethod
    def now(cls) -> "ProcessState":
        return cls(dict(os.environ), os.getcwd(), frozenset(thread.ident for thread in threading.enumerate()),
                   _torch_settings())


def _torch_settings() -> tuple[Any, ...]:
    return (torch.get_default_dtype(), torch.are_deterministic_algorithms_enabled(), torch.is_grad_enabled(),
            torch.get_num_threads())


def profile() -> str:
    """The engine this process has loaded."""
    return VLLM if VLLM in sys.modules else PLAIN


def settle(fresh: ProcessState) -> StopReport:
    """After the worker is closed and dropped: free its memory, put back the environment and working directory, and
    say whether the process is as ``fresh`` left it."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    os.environ.clear()
    os.environ.update(fresh.environ)
    try:
        os.chdir(fresh.cwd)
    except OSError as error:
        return StopReport(False, profile(), f"cannot return to {fresh.cwd}: {error}")
    left = _leftovers(fresh)
    return StopReport(not left, profile(), left)


def _leftovers(fresh: ProcessState) -> str:
    """What the worker left behind, in words; empty when nothing."""
    threads = [thread.name for thread in threading.enumerate()
               if thread.ident not in fresh.threads and thread.is_alive() and not kept(thread.name)]
    if threads:
        return f"threads still running: {', '.join(sorted(threads))}"
    children = _child_processes()
    if children:
        return f"child processes still running: {children}"
    if _torch_settings() != fresh.torch_settings:
        return f"torch settings changed: {fresh.torch_settings} -> {_torch_settings()}"
    rewritten = classes_rewritten_by_vllm()
    if rewritten:
        return f"transformers classes rewritten by vLLM's Transformers backend: {', '.join(rewritten)}"
    return ""


_VLLM_COMPILE_MARK = "_ignore_compile_vllm"
"""The attribute vLLM's ``support_torch_compile`` sets on a class it rewrites in place (its ``__init__`` then needs a
vLLM config, so the class cannot build a plain Hugging Face model in this process again)."""


def classes_rewritten_by_vllm() -> list[str]:
    """Transformers model classes vLLM's Transformers backend decorated in this process (a model vLLM has no
    implementation of, e.g. OLMo-2, is served through it)."""
    rewritten = []
    for name, module in list(sys.modules.items()):
        if not name.startswith("transformers.models.") or module is None:
            continue
        for value in list(vars(module).values()):
            if isinstance(value, type) and value.__module__ == name and _VLLM_COMPILE_MARK in vars(value):
                rewritten.append(value.__name__)
    return sorted(rewritten)


def _child_processes() -> list[int]:
    """Children still running, except Python's resource tracker (one per process, started by the first shared
    memory segment or semaphore, e.g. vLLM's; it lives as long as its parent whatever the worker does)."""
    import psutil

    return [child.pid for child in psutil.Process().children() if child.is_running()
            and not any("multiprocessing.resource_tracker" in part for part in _command_line(child))]


def _command_line(process) -> list[str]:
    try:
        return process.cmdline()
    except Exception:  # gone meanwhile, or not ours to read  # noqa: BLE001
        return []
