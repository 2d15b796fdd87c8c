"""SIGTERM stops a run the way Ctrl-C does: through the run's own clean-up (workers, Ray, partial checkpoints).

Ray's driver start-up leaves SIGTERM to a handler that exits at once (its C++ one aborts the process, status -6,
with a stack dump): the workers' clean-up never runs. :func:`stop_on_sigterm` replaces it, after ``ray.init``, with
one that raises :class:`TerminationRequested` in the main thread — a ``KeyboardInterrupt``, so every ``finally`` and
``except KeyboardInterrupt`` written for Ctrl-C handles it too.
"""

from __future__ import annotations

import signal
import threading


class TerminationRequested(KeyboardInterrupt):
    """SIGTERM arrived (``kill PID``, a job scheduler's stop, ``docker stop``)."""


def _raise_termination(signum, frame) -> None:
    raise TerminationRequested(f"signal {signum}")


def stop_on_sigterm() -> bool:
    """Install the SIGTERM handler (main thread only, where Python delivers signals); whether it was installed."""
    if threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(signal.SIGTERM, _raise_termination)
    return True
