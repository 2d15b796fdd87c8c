"""Running untrusted generated code (code tasks) in a subprocess with time, memory, output and network limits.

``run_untrusted_python(code, stdin)`` runs ``code`` in a fresh ``python -I`` process, in an empty temporary working
directory, with a minimal environment (no tokens, no ``HOME``), in its own session (a timeout kills the whole process
group), and under ``setrlimit`` limits: address space (``memory_mb``), CPU seconds, size of any file it writes
(which also bounds its captured output) and open files. ``score_code`` turns that into a reward: the fraction of
``(stdin, expected stdout)`` cases a program passes. Call it from a custom reward function.

What "no network" guarantees — honestly:

- ``network="namespace"`` (used when ``unshare --user --net`` works, as on most Linux hosts): the process and every
  child it starts live in a new, empty network namespace whose loopback is down. The kernel enforces it: there is
  no interface to reach anything, whatever the code does (raw syscalls, ctypes, subprocesses included).
- ``network="audit_hook"`` (the fallback): a ``sys.addaudithook`` hook installed before the code runs refuses socket
  creation, subprocesses, ``os.system``/``exec``/``fork`` and loading native libraries with ``ctypes``. That stops
  ordinary and accidental network use by Python code, but it is **not a security boundary**: audit hooks live in
  the process they guard, and hostile code can find ways around them. Use it for model-generated solutions to
  programming puzzles, not for adversarial input; for that, run the reward workers in a container or VM.

Neither mode restricts reading files the user running the trainer can read (the working directory is empty and the
environment minimal, but ``open("/etc/passwd")`` works): run trainers that score untrusted code as a low-privilege
user. ``RLIMIT_NPROC`` is not set: it counts every process of the user, not of the sandbox.
"""

from __future__ import annotations

import functools
import math
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

__all__ = ["SandboxLimits", "SandboxResult", "network_isolation", "run_untrusted_python", "score_code"]

# Installed before the untrusted code runs in the fallback mode (see the module docstring for what it does not stop).
_AUDIT_GUARD = '''
import sys
_BLOCKED = ("socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "subprocess.Popen", "os.system",
            "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "ctypes.dlopen", "ctypes.dlsym")
def _guard(event, args):
    if event.startswith(_BLOCKED):
        raise PermissionError(f"blocked by the hybridrl sandbox: {event}")
sys.addaudithook(_guard)
del _guard
'''


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one run. ``timeout_s`` is wall-clock; the CPU limit is that rounded up plus one second."""

    timeout_s: float = 5.0
    memory_mb: int = 512
    """Address-space limit (``RLIMIT_AS``) in MiB; an allocation beyond it raises ``MemoryError`` in the code."""
    max_output_bytes: int = 1 << 20
    """Most bytes kept of stdout and of stderr; also the largest file the code may write (``RLIMIT_FSIZE``)."""
    max_open_files: int = 64


@dataclass(frozen=True)
class SandboxResult:
    """``status``: ``ok`` (exit 0), ``error`` (non-zero exit), ``timeout``, ``memory`` (``MemoryError``) or
    ``killed`` (a signal, e.g. the CPU or file-size limit). ``network``: how the network was cut off."""

    status: str
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    network: str


@functools.lru_cache(maxsize=1)
def network_isolation() -> str:
    """``namespace`` if an unprivileged user + network namespace can be created here, else ``audit_hook``."""
    try:
        probe = subprocess.run(["unshare", "--user", "--map-root-user", "--net", "--", "true"],
                               capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "audit_hook"
    return "namespace" if probe.returncode == 0 else "audit_hook"


def run_untrusted_python(code: str, stdin: str = "", limits: SandboxLimits = SandboxLimits(),
                         network: str | None = None) -> SandboxResult:
    """Run ``code`` as a Python program with ``stdin`` as its input, under ``limits`` and without network
    (``network``: ``namespace`` or ``audit_hook``; default: the strongest this machine offers)."""
    network = network or network_isolation()
    if network not in ("namespace", "audit_hook"):
        raise ValueError(f"network={network!r}: expected 'namespace' or 'audit_hook'")
    with tempfile.TemporaryDirectory(prefix="hybridrl-sandbox-") as workdir:
        work = Path(workdir)
        program = work / "main.py"
        program.write_text((_AUDIT_GUARD if network == "audit_hook" else "") + "\n" + code, encoding="utf-8")
        command = [sys.executable, "-I", "-S", str(program)]
        if network == "namespace":
            command = ["unshare", "--user", "--map-root-user", "--net", "--", *command]
        stdout_path, stderr_path = work / "stdout", work / "stderr"
        started = time.monotonic()
        with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
            process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=out, stderr=err, cwd=work,
                                       env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8"},
                                       start_new_session=True, preexec_fn=functools.partial(_apply_limits, limits))
            timed_out = _wait(process, stdin, limits.timeout_s)
        seconds = time.monotonic() - started
        stdout, stderr = (_read(path, limits.max_output_bytes) for path in (stdout_path, stderr_path))
    return SandboxResult(_status(process.returncode, timed_out, stderr), process.returncode, stdout, stderr,
                         seconds, network)


def score_code(code: str, cases: Sequence[tuple[str, str]], limits: SandboxLimits = SandboxLimits()) -> float:
    """The fraction of ``(stdin, expected stdout)`` cases whose output matches (trailing whitespace ignored)."""
    if not cases:
        raise ValueError("score_code needs at least one (stdin, expected stdout) case")
    passed = 0
    for stdin, expected in cases:
        result = run_untrusted_python(code, stdin, limits)
        passed += result.status == "ok" and result.stdout.rstrip() == expected.rstrip()
    return passed / len(cases)


def _apply_limits(limits: SandboxLimits) -> None:
    """Runs in the child between fork and exec."""
    memory = limits.memory_mb << 20
    cpu = math.ceil(limits.timeout_s) + 1
    for kind, value in ((resource.RLIMIT_AS, memory), (resource.RLIMIT_CPU, cpu),
                        (resource.RLIMIT_FSIZE, limits.max_output_bytes), (resource.RLIMIT_NOFILE, limits.max_open_files),
                        (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(kind, (value, value))


def _wait(process: subprocess.Popen, stdin: str, timeout_s: float) -> bool:
    """Feed ``stdin`` and wait; on timeout kill the whole process group. Returns whether it timed out."""
    try:
        process.communicate(stdin.encode("utf-8"), timeout=timeout_s)
        return False
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
        return True
    except BrokenPipeError:  # the program exited without reading its input
        process.wait()
        return False


def _read(path: Path, limit: int) -> str:
    with open(path, "rb") as file:
        return file.read(limit).decode("utf-8", errors="replace")


def _status(returncode: int, timed_out: bool, stderr: str) -> str:
    if timed_out:
        return "timeout"
    if returncode == 0:
        return "ok"
    if "MemoryError" in stderr:
        return "memory"
    return "killed" if returncode < 0 else "error"
