"""Where generation runs: engines in the actor's processes or in their own, colocated or standalone, tensor-parallel
or data-parallel replicas — on the same 2 CPU cores.

    PYTHONPATH=. python benchmarks/placement.py [--steps 6 --warmup 1 --rounds 2] [hydra overrides ...]

Runs the demo's GRPO stage (``conf/demo_grpo.yaml``, vLLM CPU build, the demo's tiny model untrained so every response
runs to full length) for each layout, alternating the layouts round by round so that a change of machine load hits
them alike, and reports median step time, the generation phase (and its rate: response tokens generated per second), the
weight sync and the peak PSS of this process's tree (Ray's daemons and every worker):

- ``colocated t_g=1``  — the hybrid engine: 2 ranks train (FSDP2) and each generates as its own replica;
- ``colocated t_g=2``  — the same 2 ranks form one tensor-parallel vLLM replica;
- ``own process t_g=1`` / ``own process t_g=2`` — the same devices, but each replica's engine in processes of its
  own beside the actor's ranks (``rollout.engine_process=own``): weights published through host shared memory and
  loaded by the replicas, as a standalone pool's are;
- ``standalone 1+1``   — split placement: 1 trainer rank, a rollout pool of 1 (``rollout.n_gpus=1``), weights
  published through host shared memory after every update.

Synchronous training cannot overlap the pool's generation with the trainer's update, so on two cores the standalone
layout only moves work from two processes to one each; what it is for is the asynchronous modes built on it.
Writes ``benchmarks/results/placement.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import common
from step_breakdown import demo_trainer

LAYOUTS = {
    "colocated t_g=1": ["rollout=vllm_cpu"],
    "colocated t_g=2": ["rollout=vllm_cpu", "rollout.tensor_model_parallel_size=2"],
    "own process t_g=1": ["rollout=vllm_cpu", "rollout.engine_process=own"],
    "own process t_g=2": ["rollout=vllm_cpu", "rollout.engine_process=own", "rollout.tensor_model_parallel_size=2"],
    "standalone 1+1": ["rollout=vllm_cpu", "trainer.n_gpus_per_node=1", "rollout.n_gpus=1"],
}
PHASES = ("generate", "update_actor", "log_probs_and_values", "weight_sync")


def run_layout(workdir: Path, name: str, steps: int, warmup: int, overrides: list[str]) -> dict:
    from hybridrl.utils.tracking import read_metrics

    trainer = demo_trainer(workdir, steps, [*LAYOUTS[name], *overrides])
    sampler = common.TreeMemorySampler(os.getpid())  # this process, Ray's daemons and every worker it starts
    step_s = common.fit_with_step_clock(trainer)[warmup:]
    memory = sampler.stop()
    rows = read_metrics(workdir / "run")[warmup:]
    result = {"step_s": common.median(step_s), "peak_pss_mib": sampler.peak_pss_mib, "peak_rss_mib": memory}
    for phase in PHASES:
        result[f"{phase}_s"] = common.median([row.get(f"timing/{phase}", 0.0) for row in rows])
    tokens = [row.get("response_length/mean", 0.0) for row in rows]
    result["response_tokens_mean"] = common.median(tokens)
    rows_per_step = trainer.config.data.train_batch_size * trainer.config.rollout.n
    result["generated_tokens_per_s"] = common.median([
        row.get("response_length/mean", 0.0) * rows_per_step / row["timing/generate"] for row in rows
        if row.get("timing/generate")])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2, help="times each layout runs (alternating)")
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help="comma-separated subset")
    args, overrides = parser.parse_known_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    machine = common.machine_info()
    names = args.layouts.split(",")
    runs: dict[str, list[dict]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="placement_") as tmp:
        for round_index in range(args.rounds):
            for name in names if round_index % 2 == 0 else reversed(names):
                workdir = Path(tmp) / f"{name.replace(' ', '_').replace('=', '')}_{round_index}"
                runs[name].append(run_layout(workdir, name, args.steps, args.warmup, overrides))
                print(f"[placement] round {round_index + 1}: {name}: step {runs[name][-1]['step_s'] * 1e3:.0f} ms",
                      flush=True)
    summary = {name: {key: common.median([run[key] for run in results]) for key in results[0]}
               for name, results in runs.items()}
    reference = summary[names[0]]["step_s"]
    rows = [[name, f"{s['step_s'] * 1e3:.0f}", f"{s['step_s'] / reference:.2f}",
             *(f"{s[f'{phase}_s'] * 1e3:.0f}" for phase in PHASES), f"{s['generated_tokens_per_s']:.0f}",
             f"{s['peak_pss_mib']:.0f}"]
            for name, s in summary.items()]
    print(f"\nplacement: demo GRPO, median of {args.rounds} alternating runs × {args.steps - args.warmup} steps "
          f"(load average at start {machine['load_average_1m_5m_15m_at_start'][0]:.1f})")
    print(common.markdown_table(["layout", "step ms", f"÷ {names[0]}", *(f"{phase} ms" for phase in PHASES),
                                 "generated tok/s", "peak PSS MiB"], rows))
    path = common.write_json("placement", dict(machine=machine, steps=args.steps, warmup=args.warmup,
                                               rounds=args.rounds, overrides=overrides, runs=runs, summary=summary))
    print(f"[placement] wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
