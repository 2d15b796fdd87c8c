"""A pytest plugin that records, for every test phase (set-up, call, teardown), its duration and what it started:
Ray, worker groups (with or without a vLLM engine), whole runs, gloo process spawns, HTTP servers and child
processes. ``benchmarks/suite_cost.py`` loads it (``-p suite_cost_plugin``) and sums the records; it is never loaded
by ``make test``.

What a phase started is counted in the test's own process by wrapping the controller-side entry points (a worker
group is built by the controller, so its start is seen here even though its ranks run elsewhere). Each record goes
back to the controlling pytest process in ``report.user_properties`` (pytest-xdist carries them), and the
controlling process writes them all as JSON lines to ``$HYBRIDRL_SUITE_COST_OUT``.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections import defaultdict
from typing import Any, Callable

import pytest

OUT_ENV = "HYBRIDRL_SUITE_COST_OUT"

_starts: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
"""This process's starts since the last phase ended: kind → [count, seconds inside the starting call]."""


def _count(kind: str, seconds: float) -> None:
    entry = _starts[kind]
    entry[0] += 1
    entry[1] += seconds


def _timed(kind_of: Callable[..., str | None]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Wrap a starting call: ``kind_of(*args, **kwargs)`` names what it starts (``None``: nothing counted)."""

    def wrap(function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def counted(*args: Any, **kwargs: Any) -> Any:
            kind, started = kind_of(*args, **kwargs), time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                if kind is not None:
                    _count(kind, time.perf_counter() - started)

        return counted

    return wrap


def _group_kind(group: Any, worker_cls: type, *args: Any, **kwargs: Any) -> str:
    configs = [value for value in (*kwargs.get("args", ()), *args[1:]) if hasattr(value, "rollout")]
    engine = getattr(getattr(configs[0], "rollout", None), "name", "") if configs else ""
    return "vllm worker group" if engine == "vllm" and "Rollout" in worker_cls.__name__ else "worker group"


def _ray_kind(*args: Any, **kwargs: Any) -> str | None:
    import ray

    return None if ray.is_initialized() else "ray start"


def _popen_kind(popen: Any, args: Any, *rest: Any, **kwargs: Any) -> str | None:
    argv = [str(part) for part in (args if isinstance(args, (list, tuple)) else [args])]
    text = " ".join(argv[:4])
    if "/ray/" in text or "raylet" in text or "gcs_server" in text:  # Ray's own daemons: counted as "ray start"
        return None
    if "hybridrl" in text:
        return "hybridrl child process"
    return "python child process" if "python" in text else "other child process"


def _install() -> None:
    """Wrap the starting calls once per process."""
    import subprocess

    import torch.multiprocessing as torch_mp

    from hybridrl.gateway import app as gateway_app
    from hybridrl.runtime import ray_runtime, worker_group
    from hybridrl.trainers import dpo_trainer, rl_trainer, rm_trainer, sft_trainer

    worker_group.WorkerGroup.__init__ = _timed(_group_kind)(worker_group.WorkerGroup.__init__)
    ray_runtime.start_ray = _timed(_ray_kind)(ray_runtime.start_ray)
    import hybridrl.runtime as runtime_package

    runtime_package.start_ray = ray_runtime.start_ray
    subprocess.Popen.__init__ = _timed(_popen_kind)(subprocess.Popen.__init__)
    torch_mp.start_processes = _timed(lambda *a, **k: "gloo spawn (torch.multiprocessing)")(torch_mp.start_processes)
    for module, name in ((rl_trainer, "RLTrainer"), (sft_trainer, "SFTTrainer"), (dpo_trainer, "DPOTrainer"),
                         (rm_trainer, "RMTrainer")):
        cls = getattr(module, name, None)
        if cls is not None:
            cls.fit = _timed(lambda *a, _n=name, **k: f"whole run ({_n}.fit)")(cls.fit)
    gateway_app.Gateway.__init__ = _timed(lambda *a, **k: "HTTP server")(gateway_app.Gateway.__init__)
    _count_reused_processes()
    _count_pooled_gloo_ranks()


def _count_reused_processes() -> None:
    """A rank given a parked process (``hybridrl.runtime.parked``) instead of a new one."""
    from hybridrl.runtime import executors

    taken = executors._parked_host

    def counted(key: Any) -> Any:
        actor = taken(key)
        if actor is not None:
            _count("worker process reused", 0.0)
        return actor

    executors._parked_host = counted


def _count_pooled_gloo_ranks() -> None:
    """Rank processes the gloo tests' pool (``tests/distributed/gloo_pool.py``) started, when it is importable."""
    try:
        import gloo_pool
    except ImportError:
        return
    grow = gloo_pool.RankPool._grow

    def counted(pool: Any, size: int) -> None:
        new, started = max(size - len(pool._ranks), 0), time.perf_counter()
        grow(pool, size)
        for _ in range(new):
            _count("gloo rank process started", (time.perf_counter() - started) / max(new, 1))

    gloo_pool.RankPool._grow = counted


def pytest_configure(config: pytest.Config) -> None:
    config._suite_cost_records = []  # type: ignore[attr-defined]
    _install()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    started = {kind: list(entry) for kind, entry in _starts.items()}
    _starts.clear()
    item.user_properties.append((f"suite_cost_starts_{call.when}", started))
    yield


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    starts = dict(report.user_properties).get(f"suite_cost_starts_{report.when}", {})
    config = _config
    if config is not None:
        config._suite_cost_records.append({  # type: ignore[attr-defined]
            "nodeid": report.nodeid, "when": report.when, "seconds": report.duration, "outcome": report.outcome,
            "starts": starts,
            "worker": getattr(getattr(report, "node", None), "workerinput", {}).get("workerid", "main")})


_config: pytest.Config | None = None


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    global _config
    _config = session.config


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get(OUT_ENV)
    if not path or hasattr(session.config, "workerinput"):  # only the controlling process writes
        return
    with open(path, "w") as out:
        for record in session.config._suite_cost_records:  # type: ignore[attr-defined]
            out.write(json.dumps(record) + "\n")
