"""Synchronous vs asynchronous training on the demo task, same optimizer steps, on the same 2 CPU cores.

    PYTHONPATH=. python benchmarks/async_modes.py [--steps 40] [--modes ...] [hydra overrides ...]

SFT once (``conf/demo_sft.yaml``), then the demo's GRPO stage (``conf/demo_grpo.yaml``) from that checkpoint in each
mode, one after the other with nothing else of ours running:

- ``sync colocated``  — 2 ranks train (FSDP2) and generate (the hybrid engine; ``make demo``);
- ``sync split``      — 1 trainer rank + a standalone rollout pool of 1 (``rollout.n_gpus=1``);
- ``one_step_off``    — split, the pool generates step k+1 while the trainer trains step k;
- ``bounded η=2``     — split, up to 2 batches generated ahead (``off_policy_correction.kind=auto``: TIS);
- ``bounded η=2 no correction`` — the same without the importance weights (``kind=none``);
- ``one_step_off partial`` / ``bounded η=2 partial`` — with ``async_training.partial_rollout`` (weights land inside a
  generation in flight; ``async/partial_rows`` says how often).

Reports step time (median and mean over the steps after the first), the trainer's and the generator's idle share,
the mean staleness and the held-out accuracy after the last step (200 problems: ±3.5 points of noise at 50 %).
Writes ``benchmarks/results/async_modes.json``.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

import common

SPLIT = ["trainer.n_gpus_per_node=1", "rollout.n_gpus=1"]
MODES = {
    "sync colocated": [],
    "sync split": SPLIT,
    "one_step_off": [*SPLIT, "async_training.mode=one_step_off"],
    "bounded η=2": [*SPLIT, "async_training.mode=bounded", "async_training.max_staleness=2"],
    "bounded η=2 no correction": [*SPLIT, "async_training.mode=bounded", "async_training.max_staleness=2",
                                  "algorithm.off_policy_correction.kind=none"],
    "one_step_off partial": [*SPLIT, "async_training.mode=one_step_off", "async_training.partial_rollout=true"],
    "bounded η=2 partial": [*SPLIT, "async_training.mode=bounded", "async_training.max_staleness=2",
                            "async_training.partial_rollout=true"],
}


def sft_model(workdir: Path) -> str:
    from hybridrl.config import load_config
    from hybridrl.demo import build_base_model
    from hybridrl.trainers.sft_trainer import SFTTrainer

    base = build_base_model(workdir / "base")
    config = load_config([f"model.path={base}", f"trainer.default_local_dir={workdir / 'sft'}"], "demo_sft")
    return str(SFTTrainer(config).fit().export_dir)


def run_mode(workdir: Path, model: str, name: str, steps: int, overrides: list[str]) -> dict:
    from hybridrl.config import load_config
    from hybridrl.trainers.rl_trainer import RLTrainer
    from hybridrl.utils.tracking import read_metrics

    run_dir = workdir / re.sub(r"[^a-z0-9]+", "_", name.replace("η", "eta"))  # Hydra parses ASCII paths only
    config = load_config([f"model.path={model}", f"trainer.default_local_dir={run_dir}", "trainer.logger=[jsonl]",
                          f"trainer.total_training_steps={steps}", "trainer.resume_mode=disable",
                          *MODES[name], *overrides], "demo_grpo")
    trainer = RLTrainer(config)
    started = time.perf_counter()
    step_s = common.fit_with_step_clock(trainer)[1:]
    wall = time.perf_counter() - started
    rows = [row for row in read_metrics(run_dir) if row["step"] > 1]
    first = next(row for row in read_metrics(run_dir) if row["step"] == 0)

    def mean_of(key: str) -> float:
        values = [row[key] for row in rows if key in row]
        return sum(values) / len(values) if values else float("nan")

    return {"step_s_median": common.median(step_s), "step_s_mean": sum(step_s) / len(step_s), "fit_wall_s": wall,
            "accuracy_before": first.get("val/accuracy"), "accuracy_after": trainer_last_accuracy(run_dir),
            "trainer_idle": mean_of("async/trainer_idle_fraction"),
            "generator_idle": mean_of("async/generator_idle_fraction"), "staleness_mean": mean_of(
                "async/staleness_mean"), "partial_rows": mean_of("async/partial_rows"),
            "token_staleness_mean": mean_of("async/token_staleness_mean"), "generate_s": mean_of("timing/generate"),
            "update_actor_s": mean_of("timing/update_actor")}


def trainer_last_accuracy(run_dir: Path) -> float:
    from hybridrl.utils.tracking import read_metrics

    return [row["val/accuracy"] for row in read_metrics(run_dir) if "val/accuracy" in row][-1]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--modes", nargs="*", default=list(MODES), choices=list(MODES))
    args, overrides = parser.parse_known_args(argv)
    machine = common.machine_info()
    results = {}
    with tempfile.TemporaryDirectory(prefix="hybridrl-async-") as tmp:
        workdir = Path(tmp)
        model = sft_model(workdir)
        for name in args.modes:
            print(f"[async_modes] {name} ...", flush=True)
            results[name] = run_mode(workdir, model, name, args.steps, overrides)
    base = results[args.modes[0]]["step_s_mean"]
    rows = [[name, f"{r['step_s_median']:.3f}", f"{r['step_s_mean']:.3f}", f"{base / r['step_s_mean']:.2f}×",
             f"{r['trainer_idle']:.2f}", f"{r['generator_idle']:.2f}", f"{r['staleness_mean']:.2f}",
             f"{r['partial_rows']:.2f} / {r['token_staleness_mean']:.2f}",
             f"{100 * r['accuracy_before']:.1f} → {100 * r['accuracy_after']:.1f} %"] for name, r in results.items()]
    print(common.markdown_table(["mode", "step s (median)", "step s (mean)", f"speed vs {args.modes[0]}",
                                 "trainer idle", "generator idle", "staleness",
                                 "partial rows / token staleness", "held-out accuracy"], rows))
    print(f"machine: {machine['cpu']}, {machine['logical_cpus']} cores, load at start "
          f"{machine['load_average_1m_5m_15m_at_start']}")
    print("wrote", common.write_json("async_modes", {"machine": machine, "steps": args.steps, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
