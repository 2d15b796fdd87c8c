"""Helpers shared by the benchmark scripts: the machine they ran on, the matmul ceiling, process-tree memory, tables.

Imports only torch and the standard library (``psutil`` lazily), so a script in another virtual environment can use it.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional, Sequence

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def machine_info() -> dict[str, Any]:
    """CPU model (``lscpu``), logical cores, load average now, Python and torch versions."""
    import torch

    model = ""
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        model = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name")), "")
    except (OSError, subprocess.SubprocessError):
        pass
    return {"cpu": model or platform.processor(), "logical_cpus": os.cpu_count(),
            "load_average_1m_5m_15m_at_start": list(os.getloadavg()), "python": platform.python_version(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads()}


def matmul_flops_per_s(dtype_name: str, size: int = 1024, repeats: int = 7) -> float:
    """Best-of-``repeats`` rate of one ``[size, size] @ [size, size]`` matmul in ``dtype_name`` (``float32`` /
    ``bfloat16``), FLOP/s, with this process's torch threads: the compute ceiling a step's FLOPs are divided by.
    Best, not median: on a shared machine the best run is the nearest to the hardware."""
    import torch

    dtype = getattr(torch, dtype_name)
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    torch.matmul(a, b)  # warm-up (kernel selection, page faults)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best


def matmul_parameters(model_path: str) -> int:
    """Parameters that take part in a matmul per token (every ``nn.Linear``, the LM head included, the input embedding
    lookup excluded), counted on the meta device without reading the weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_path))
    return sum(module.weight.numel() for module in model.modules() if isinstance(module, torch.nn.Linear))


class TreeMemorySampler:
    """Peak memory of a process and all its descendants (e.g. Ray's raylet and workers), sampled on a thread while the
    process runs, two ways:

    - ``peak_mib``: the peak of the tree's summed RSS (every ``interval_s``). Pages several processes share (the
      torch libraries each Python process maps) count once per process, so a tree of many processes reads high;
    - ``peak_pss_mib``: the peak of the summed PSS (every ``pss_every``-th sample: reading ``smaps`` costs more),
      which splits each shared page among the processes that map it: what the tree takes from the machine.

    ``rss_by_role_mib``: the RSS peak split into the measured process itself (``driver``), Ray's actors (``workers``),
    Ray's own daemons (``ray``) and anything else (``other``: e.g. reward-scoring subprocesses). ``seen``: every
    process of the tree it sampled."""

    def __init__(self, pid: int, interval_s: float = 0.2, pss_every: int = 5) -> None:
        self.pid, self.interval_s, self.pss_every = pid, interval_s, pss_every
        self.peak_bytes = self.peak_pss_bytes = 0
        self.rss_by_role_mib: dict[str, float] = {}
        self.seen: dict[int, Any] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        samples = 0
        while not self._stop.is_set():
            try:
                root = psutil.Process(self.pid)
                tree = [root, *root.children(recursive=True)]
            except psutil.Error:
                return
            self._sample(tree, with_pss=samples % self.pss_every == 0)
            samples += 1
            self._stop.wait(self.interval_s)

    def _sample(self, tree: list[Any], *, with_pss: bool) -> None:
        import psutil

        by_role: dict[str, int] = {}
        pss = 0
        for process in tree:
            self.seen.setdefault(process.pid, process)
            try:
                memory = process.memory_full_info() if with_pss else process.memory_info()
                role = _role_of(process, self.pid)
            except psutil.Error:
                continue
            by_role[role] = by_role.get(role, 0) + memory.rss
            pss += getattr(memory, "pss", 0)
        if sum(by_role.values()) > self.peak_bytes:
            self.peak_bytes = sum(by_role.values())
            self.rss_by_role_mib = {role: size / 2**20 for role, size in sorted(by_role.items())}
        self.peak_pss_bytes = max(self.peak_pss_bytes, pss)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak_mib

    @property
    def peak_mib(self) -> float:
        return self.peak_bytes / 2**20

    @property
    def peak_pss_mib(self) -> float:
        return self.peak_pss_bytes / 2**20

    def summary(self) -> dict[str, Any]:
        """The figures a benchmark reports: ``peak_rss_mib``, ``peak_pss_mib``, ``rss_by_role_mib``."""
        return {"peak_rss_mib": self.peak_mib, "peak_pss_mib": self.peak_pss_mib,
                "rss_by_role_mib": self.rss_by_role_mib}


_RAY_DAEMONS = ("ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent")


def _role_of(process: Any, root_pid: int) -> str:
    """``driver`` (the measured process), ``workers`` (Ray actors), ``ray`` (Ray's own processes) or ``other``."""
    if process.pid == root_pid:
        return "driver"
    command = " ".join(process.cmdline())
    if command.startswith("ray::") and not command.startswith(_RAY_DAEMONS):
        return "workers"
    return "ray" if "/ray/" in command or command.startswith("ray::") else "other"


def run_measured(command: Sequence[str], timeout_s: float,
                 env: Optional[dict[str, str]] = None) -> tuple[int, dict[str, Any], str]:
    """Run ``command``; returns (exit code, its tree's memory figures (:meth:`TreeMemorySampler.summary`), the last
    3000 characters of its output). Returns once every process of its tree has exited (up to 60 s: Ray's daemons
    outlive the driver by a moment), so the next side measured does not share the cores with this one's leftovers."""
    process = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, **(env or {})})
    sampler = TreeMemorySampler(process.pid)
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        output += f"\n[timed out after {timeout_s:.0f} s]"
    sampler.stop()
    _wait_for_exit(list(sampler.seen.values()), timeout_s=60.0)
    return process.returncode, sampler.summary(), output[-3000:]


def _wait_for_exit(processes: list[Any], timeout_s: float) -> None:
    import psutil

    _, alive = psutil.wait_procs(processes, timeout=timeout_s)
    if alive:
        print(f"[benchmarks] {len(alive)} process(es) of the last run still alive after {timeout_s:.0f} s: "
              f"{[process.pid for process in alive]}", file=sys.stderr)


def fit_with_step_clock(trainer: Any) -> list[float]:
    """Run ``trainer.fit()`` (a hybridrl ``RLTrainer``) and return each step's wall seconds: the interval between the
    ends of consecutive training steps (``train_step``, every mode), the first from the start of the first one. Includes the loop's own work between steps (tracking, validation if
    configured), as a user's clock would."""
    edges: list[float] = []

    def clocked(step_method):
        def timed_step(*args: Any) -> Any:
            if not edges:
                edges.append(time.perf_counter())
            metrics = step_method(*args)
            edges.append(time.perf_counter())
            return metrics
        return timed_step

    trainer.train_step = clocked(trainer.train_step)  # an instance attribute over the real method
    trainer.fit()
    return [end - start for start, end in zip(edges, edges[1:])]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def write_json(name: str, payload: dict[str, Any]) -> Path:
    """``benchmarks/results/<name>.json`` (git-ignored), with the load average at the end added to ``machine``."""
    if "machine" in payload:
        payload["machine"]["load_average_1m_5m_15m_at_end"] = list(os.getloadavg())
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(payload, indent=1))
    return path
