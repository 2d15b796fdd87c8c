"""One run per run directory: an OS lock held for the life of the run.

Two runs writing one directory corrupt each other silently — the second resumes from the first's checkpoints while
they are being written, and both append to one ``metrics.jsonl``. The lock is ``flock`` on
``<run dir>/.hybridrl.lock``: the kernel drops it when the process exits, however it exits (a SIGKILL, an OOM kill),
so a stale lock never blocks the next run. Its descriptor is not inheritable and every child hybridrl starts execs
(Ray's processes, ``spawn``ed reward workers, the sandbox), so no child ever holds it; reading the file elsewhere in
the process does not release it (a POSIX record lock would be). The file says who holds it — pid, host, start time and
command line — for the message the next run shows.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

LOCK_FILE = ".hybridrl.lock"
_held: set[Path] = set()


class RunDirectoryInUse(ValueError):
    """Another run holds the run directory (a user error: exit 2 with the message)."""


@contextmanager
def run_directory_lock(run_dir: str | Path, key: str = "trainer.default_local_dir") -> Iterator[Path]:
    """Hold ``run_dir`` (created if missing) for the block; refuse at once if another run holds it.

    Raises ``RunDirectoryInUse`` naming the directory and the other run's process, or ``ValueError`` naming ``key``
    when the directory cannot be created or written (a regular file in the way, no permission).
    """
    directory = Path(run_dir).resolve()
    if directory in _held:
        raise RunDirectoryInUse(f"{key}={str(run_dir)!r} is already used by another run in this process; give each "
                                "run its own directory")
    descriptor = _open_lock_file(directory, key)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno not in (errno.EACCES, errno.EAGAIN, errno.EWOULDBLOCK):
                raise
            raise RunDirectoryInUse(f"{key}={str(run_dir)!r} is in use by another run ({_holder(directory)}); wait "
                                    f"for it to finish, stop it, or choose another {key}") from None
        _write_holder(descriptor)
        _held.add(directory)
        try:
            yield directory
        finally:
            _held.discard(directory)
    finally:
        os.close(descriptor)  # closing drops the lock


def _open_lock_file(directory: Path, key: str) -> int:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        return os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except FileExistsError:
        raise ValueError(f"{key}={str(directory)!r}: a file (not a directory) is in the way") from None
    except NotADirectoryError:
        raise ValueError(f"{key}={str(directory)!r}: a part of the path is a regular file, not a directory") from None
    except PermissionError as error:
        raise ValueError(f"{key}={str(directory)!r}: not writable ({error.strerror}); choose a directory you can "
                         "write") from None
    except OSError as error:
        raise ValueError(f"{key}={str(directory)!r}: cannot be used as a run directory ({error.strerror})") from None


def _write_holder(descriptor: int) -> None:
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
              "command": " ".join(sys.argv)[:300]}
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, json.dumps(holder).encode(), 0)


def _holder(directory: Path) -> str:
    """Who holds the lock, in words (read by the refused run, which does not hold it)."""
    try:
        holder = json.loads((directory / LOCK_FILE).read_text() or "{}")
    except (OSError, ValueError):
        holder = {}
    if not holder:
        return "its process did not say who it is"
    return (f"pid {holder.get('pid')} on {holder.get('host')}, started {holder.get('started')}: "
            f"{holder.get('command', '?')}")
