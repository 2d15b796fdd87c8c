"""How long ``hybridrl demo`` takes from the command to GRPO's first step, for two checkouts side by side.

Each run is ``python -m hybridrl.cli demo trainer.total_training_steps=1`` in a fresh directory, with the checkout
first on ``PYTHONPATH`` (its Ray workers inherit it). The clock starts when the command is started and stops when
the GRPO run's ``metrics.jsonl`` first holds step 1 (the step's row is written when it ends); the printed lines are
time-stamped, so the phases come from the same run: SFT done, GRPO's workers started. The sides alternate
(A B A B …) so a machine's slow minute falls on both. ::

    git worktree add /tmp/before <commit>
    .venv/bin/python benchmarks/demo_startup.py --before /tmp/before --after . --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS_DIR, machine_info  # noqa: E402

PHASES = {"sft_done": re.compile(r"\[demo\] 2/3 SFT done"), "grpo_workers_started": re.compile(r"workers started in")}


def first_step_seen(metrics: Path) -> bool:
    if not metrics.is_file():
        return False
    for line in metrics.read_text().splitlines():
        try:
            if json.loads(line).get("step") == 1:
                return True
        except json.JSONDecodeError:  # a row being written
            return False
    return False


def run_once(checkout: Path, extra: list[str]) -> dict[str, float]:
    """One demo run from ``checkout``; seconds from the command to each phase and to GRPO's first step."""
    with tempfile.TemporaryDirectory(prefix="demo_startup_") as work:
        env = {**os.environ, "PYTHONPATH": str(checkout.resolve())}
        command = [sys.executable, "-m", "hybridrl.cli", "demo", "trainer.total_training_steps=1", *extra]
        started = time.perf_counter()
        child = subprocess.Popen(command, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True)
        seen: dict[str, float] = {}
        reader = threading.Thread(target=_read_phases, args=(child, started, seen), daemon=True)
        reader.start()
        metrics = Path(work, "runs", "demo", "grpo", "metrics.jsonl")
        while child.poll() is None and "first_step" not in seen:
            if first_step_seen(metrics):
                seen["first_step"] = time.perf_counter() - started
            time.sleep(0.05)
        child.wait()
        reader.join(timeout=10)
        seen["whole_command"] = time.perf_counter() - started
        if child.returncode != 0 or "first_step" not in seen:
            raise RuntimeError(f"{checkout}: the demo failed (exit {child.returncode}): {seen.get('tail', '')}")
        seen.pop("tail", None)
        return seen


def _read_phases(child: subprocess.Popen, started: float, seen: dict) -> None:
    tail: list[str] = []
    for line in child.stdout:  # type: ignore[union-attr]
        tail = (tail + [line])[-20:]
        for phase, pattern in PHASES.items():
            if phase not in seen and pattern.search(line):
                seen[phase] = time.perf_counter() - started
    seen["tail"] = "".join(tail)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="the checkout measured first in each round")
    parser.add_argument("--after", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("overrides", nargs="*", help="extra overrides for the GRPO stage")
    args = parser.parse_args()
    sides = {"before": args.before, "after": args.after}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    print(f"[demo_startup] {machine_info()}", flush=True)
    for round_index in range(args.rounds):
        for name, checkout in sides.items():
            figures = run_once(checkout, args.overrides)
            runs[name].append(figures)
            print(f"round {round_index + 1} {name:6s} " + "  ".join(f"{key} {value:6.1f} s"
                                                                 for key, value in figures.items()), flush=True)
    print("\nmedians (s):")
    keys = ["sft_done", "grpo_workers_started", "first_step", "whole_command"]
    print(f"  {'':22s}" + "".join(f"{name:>10s}" for name in sides) + "   after/before")
    for key in keys:
        medians = {name: statistics.median(run[key] for run in runs[name] if key in run) for name in sides}
        print(f"  {key:22s}" + "".join(f"{medians[name]:10.1f}" for name in sides)
              + f"   {medians['after'] / medians['before']:.2f}")
    RESULTS_DIR.mkdir(exist_ok=True)
    (RESULTS_DIR / "demo_startup.json").write_text(json.dumps({"machine": machine_info(), "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
