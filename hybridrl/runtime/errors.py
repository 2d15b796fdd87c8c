"""Errors the controller raises about worker groups: each names the role, the rank and the node it came from.

The hierarchy lets a controller catch broadly (``WorkerError``) or narrowly:

- ``WorkerError`` — a worker method (or a worker's ``__init__``) raised; carries the remote traceback text.
- ``WorkerDiedError`` — a worker process died (crash, OOM kill, ``SIGKILL``, node loss); the group is stopped.
- ``WorkerTimeoutError`` — a call took longer than its timeout; the group is stopped (its ranks may be stuck).
- ``WorkerGroupStoppedError`` — a call on a group that an earlier failure (or ``shutdown()``) stopped.
- ``ResourceUnavailableError`` — a resource pool's placement groups could not be placed in time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class RankLocation:
    """Where one rank of a group runs: enough to find its logs (``pid`` on ``node_ip``)."""

    rank: int
    node_ip: str
    node_id: str
    pid: int

    def describe(self) -> str:
        node = f"node {self.node_ip}" + (f" (id {self.node_id[:12]})" if self.node_id else "")
        return f"{node}, pid {self.pid}"


class WorkerError(RuntimeError):
    """A worker of group ``role`` failed at ``rank`` while running ``method``.

    ``remote_traceback`` is the worker-side traceback text (empty when the process died before it could send one).
    When the original exception could be rebuilt on the controller it is chained as ``__cause__``.
    """

    what = "raised an exception"

    def __init__(self, role: str, rank: Optional[int], method: str, location: Optional[RankLocation],
                 detail: str = "", remote_traceback: str = "") -> None:
        self.role, self.rank, self.method = role, rank, method
        self.location, self.detail, self.remote_traceback = location, detail, remote_traceback
        super().__init__(self._message())

    def _message(self) -> str:
        where = f"worker group '{self.role}'"
        if self.rank is not None:
            where += f" rank {self.rank}"
        if self.location is not None:
            where += f" on {self.location.describe()}"
        text = f"{where} {self.what} in {self.method}()"
        if self.detail:
            text += f": {self.detail}"
        if self.remote_traceback:
            text += "\n--- worker traceback ---\n" + self.remote_traceback.rstrip()
        return text

    def __reduce__(self):  # keep the fields when an error crosses a process boundary
        return (type(self), (self.role, self.rank, self.method, self.location, self.detail, self.remote_traceback))


class WorkerDiedError(WorkerError):
    """The worker process is gone (crash, OOM kill, ``os._exit``, ``SIGKILL``, lost node)."""

    what = "died"


class WorkerTimeoutError(WorkerError, TimeoutError):
    """A call did not finish within its timeout; ``rank`` is the first rank still running."""

    what = "timed out"


class WorkerGroupStoppedError(WorkerError):
    """The group was stopped (by an earlier failure or ``shutdown()``) and takes no more calls."""

    what = "is stopped; cannot run"


class ResourceUnavailableError(RuntimeError):
    """A resource pool could not be placed: the cluster lacks the devices, or they stayed busy past the timeout."""
