"""Where a step of the demo goes: generation, log-prob passes, updates, sync — and the controller's own overhead.

    PYTHONPATH=. python benchmarks/step_breakdown.py [--steps 6 --warmup 1] [--profile] [hydra overrides ...]

Runs the demo's GRPO stage (``conf/demo_grpo.yaml``: Ray controller, FSDP2 actor on 2 CPU ranks, colocated vLLM
rollout) from the demo's tiny model for a few steps, then splits each step's wall time:

- per phase, the controller's wall time (``timing/<phase>``) and the time *inside the workers* for that phase's calls
  (``timing_worker/<method>``: the slowest rank's time in the method, from ``TimedResult``); their difference is the
  **dispatch overhead** of the phase: splitting the batch, the object store, (de)serialisation, transfer, concat;
- **controller compute**: phases that run on the driver (reward scoring, advantages) and the loop's work outside
  the phases (balancing, metrics, tracking: step wall − Σ phases).

``controller overhead`` = Σ dispatch overhead ÷ step wall time (target < 5 %). The demo's model is random here (no SFT
first): responses run to the full 4 tokens, so the figures are those of the demo's shapes, not its learning.
``--profile`` adds a cProfile of one step in local mode (``trainer.ray.local_mode=true``, 1 rank: the workers run in
this process, so the profile sees the compute) and prints the top functions by own time.
Writes ``benchmarks/results/step_breakdown.json``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import tempfile
from pathlib import Path
from typing import Any

import common

PHASE_METHODS = {
    "generate": ("generate_sequences",),
    "log_probs_and_values": ("compute_log_prob", "compute_ref_log_prob", "compute_values"),
    "update_critic": ("update_critic",),
    "update_actor": ("update_actor",),
    "weight_sync": ("sync_rollout_weights",),
}
"""Each worker-call phase of ``RLTrainer.train_step`` and the worker methods it calls."""


def demo_trainer(workdir: Path, steps: int, overrides: list[str]):
    from hybridrl.config import load_config
    from hybridrl.trainers.rl_trainer import RLTrainer
    from hybridrl.demo import build_base_model

    base = build_base_model(workdir / "base")
    config = load_config([f"model.path={base}", f"trainer.default_local_dir={workdir / 'run'}",
                          f"trainer.total_training_steps={steps}", "trainer.val_before_train=false",
                          "trainer.test_freq=-1", "trainer.save_at_end=false", "trainer.logger=[jsonl]",
                          "trainer.resume_mode=disable", *overrides], "demo_grpo")
    return RLTrainer(config)


def breakdown(rows: list[dict[str, Any]], step_s: list[float], warmup: int) -> dict[str, Any]:
    """Median seconds per phase, inside workers, dispatch overhead and controller compute over post-warm-up steps."""
    rows, step_s = rows[warmup:], step_s[warmup:]
    phases: dict[str, dict[str, float]] = {}
    for phase in sorted({key[len("timing/"):] for row in rows for key in row if key.startswith("timing/")} - {"step"}):
        wall = common.median([row.get(f"timing/{phase}", 0.0) for row in rows])
        methods = PHASE_METHODS.get(phase, ())
        inside = common.median([sum(row.get(f"timing_worker/{m}", 0.0) for m in methods) for row in rows])
        phases[phase] = {"wall_s": wall, "inside_workers_s": inside if methods else 0.0,
                         "dispatch_overhead_s": max(wall - inside, 0.0) if methods else 0.0,
                         "controller_compute_s": 0.0 if methods else wall}
    step = common.median(step_s)
    outside = common.median([wall - row["timing/step"] for row, wall in zip(rows, step_s)])
    phases["(loop, outside phases)"] = {"wall_s": outside, "inside_workers_s": 0.0, "dispatch_overhead_s": 0.0,
                                        "controller_compute_s": outside}
    overhead = sum(p["dispatch_overhead_s"] for p in phases.values())
    compute = sum(p["controller_compute_s"] for p in phases.values())
    return {"median_step_s": step, "phases": phases, "dispatch_overhead_s": overhead,
            "controller_overhead_share": overhead / step, "controller_compute_share": compute / step,
            "inside_workers_share": sum(p["inside_workers_s"] for p in phases.values()) / step}


def profile_one_step(workdir: Path, overrides: list[str], top: int = 18) -> str:
    """cProfile of the second step of a local-mode, single-rank run (the first warms up), top functions by own time.
    One torch thread, as in a Ray CPU worker (``cpu_threads_per_worker``): local mode keeps the process's own count."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    trainer = demo_trainer(workdir / "profile", 2, ["trainer.ray.local_mode=true", "trainer.n_gpus_per_node=1",
                                                    *overrides])
    profiler = cProfile.Profile()
    train_step = trainer.train_step
    calls: list[int] = []

    def profiled():
        calls.append(1)
        if len(calls) < 2:
            return train_step()
        profiler.enable()
        try:
            return train_step()
        finally:
            profiler.disable()

    trainer.train_step = profiled
    try:
        trainer.fit()
    finally:
        torch.set_num_threads(threads)
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--profile", action="store_true")
    args, overrides = parser.parse_known_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from hybridrl.utils.tracking import read_metrics

    machine = common.machine_info()
    with tempfile.TemporaryDirectory(prefix="step_breakdown_") as tmp:
        trainer = demo_trainer(Path(tmp), args.steps, overrides)
        step_s = common.fit_with_step_clock(trainer)
        result = breakdown(read_metrics(Path(tmp) / "run"), step_s, args.warmup)
        profile = profile_one_step(Path(tmp), overrides) if args.profile else None
    result.update(machine=machine, steps=args.steps, warmup=args.warmup, overrides=overrides, step_s=step_s,
                  profile_local_mode_one_rank=profile)
    print_table(result)
    if profile:
        print("\ncProfile of one step (local mode, 1 rank, top by own time):\n" + profile)
    print(f"[step_breakdown] wrote {common.write_json('step_breakdown', result)}")


def print_table(result: dict[str, Any]) -> None:
    step = result["median_step_s"]
    rows = [[phase, f"{p['wall_s'] * 1e3:.1f}", f"{100 * p['wall_s'] / step:.1f}", f"{p['inside_workers_s'] * 1e3:.1f}",
             f"{p['dispatch_overhead_s'] * 1e3:.1f}", f"{100 * p['dispatch_overhead_s'] / step:.1f}"]
            for phase, p in sorted(result["phases"].items(), key=lambda item: -item[1]["wall_s"])]
    print(f"\nstep_breakdown: demo GRPO, median step {step * 1e3:.0f} ms over {result['steps'] - result['warmup']} "
          f"steps (load average {result['machine']['load_average_1m_5m_15m_at_start'][0]:.1f})")
    print(common.markdown_table(["phase", "wall ms", "% of step", "inside workers ms", "dispatch overhead ms",
                                 "overhead % of step"], rows))
    print(f"controller overhead (dispatch/collect/serialisation): {100 * result['controller_overhead_share']:.1f} % "
          f"of step (target < 5 %); controller compute (reward, advantages, loop): "
          f"{100 * result['controller_compute_share']:.1f} %; inside workers: {100 * result['inside_workers_share']:.1f} %")


if __name__ == "__main__":
    sys.exit(main())
