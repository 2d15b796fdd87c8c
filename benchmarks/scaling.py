"""How step time grows with work: the demo's GRPO step at ×1, ×2, ×4 the batch, and at 1 vs 2 data-parallel workers.

    PYTHONPATH=. python benchmarks/scaling.py [--base-prompts 8 --scales 1,2,4 --steps 4 --warmup 1]

The demo's config (``conf/demo_grpo.yaml``, tiny model, 8 responses per prompt, HF rollout) with
``data.train_batch_size`` = base × scale and one optimizer step per step (``ppo_mini_batch_size`` = the batch),
micro-batches of ``--micro`` sequences per rank; batch scaling on 2 ranks, DP scaling (1 → 2 ranks, one thread each)
at the ``--dp-scale`` batch. Reading it: ``cost ratio`` = step(×k) ÷ step(×1) against the work ratio k (below k:
fixed costs are being amortised; equal: cost proportional to work); ``DP speed-up`` = step(1 rank) ÷ step(2 ranks)
(2 would be perfect; on a shared 2-core box the second core is also someone else's). Median of the post-warm-up steps.
Writes ``benchmarks/results/scaling.json``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

import common
from step_breakdown import demo_trainer


def measure(workdir: Path, prompts: int, dp: int, micro: int, steps: int, warmup: int) -> dict[str, Any]:
    from hybridrl.utils.tracking import read_metrics

    trainer = demo_trainer(workdir, steps, [f"data.train_batch_size={prompts}", f"actor.ppo_mini_batch_size={prompts}",
                                            f"actor.ppo_micro_batch_size_per_gpu={micro}",
                                            f"trainer.n_gpus_per_node={dp}"])
    step_s = common.fit_with_step_clock(trainer)[warmup:]
    rows = read_metrics(workdir / "run")[warmup:]
    rows_per_step = prompts * trainer.config.rollout.n
    step = common.median(step_s)
    tokens = common.median([row["perf/throughput_tokens_per_s"] * row["timing/step"] for row in rows])
    phases = {name: common.median([row[f"timing/{name}"] for row in rows])
              for name in ("generate", "log_probs_and_values", "update_actor")}
    return {"prompts": prompts, "sequences": rows_per_step, "dp": dp, "median_step_s": step, "step_s": step_s,
            "sequences_per_s": rows_per_step / step, "tokens_per_s": tokens / step, "phases_s": phases}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-prompts", type=int, default=8)
    parser.add_argument("--scales", default="1,2,4")
    parser.add_argument("--dp-scale", type=int, default=2)
    parser.add_argument("--micro", type=int, default=32, help="sequences per micro-batch per rank")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    machine = common.machine_info()
    scales = [int(scale) for scale in args.scales.split(",")]
    results: dict[str, Any] = {"batch": [], "dp": []}
    with tempfile.TemporaryDirectory(prefix="scaling_") as tmp:
        for scale in scales:
            results["batch"].append({"scale": scale, **measure(Path(tmp) / f"b{scale}", args.base_prompts * scale, 2,
                                                                args.micro, args.steps, args.warmup)})
            print(f"[scaling] batch ×{scale}: {results['batch'][-1]['median_step_s']:.2f} s", flush=True)
        results["dp"].append({"scale": args.dp_scale, **measure(Path(tmp) / "dp1", args.base_prompts * args.dp_scale,
                                                                1, args.micro, args.steps, args.warmup)})
    same_batch = next((row for row in results["batch"] if row["scale"] == args.dp_scale), None)
    if same_batch is not None:
        results["dp"].append(same_batch)
    print_tables(results)
    print(f"[scaling] wrote {common.write_json('scaling', {'machine': machine, 'args': vars(args), **results})}")


def print_tables(results: dict[str, Any]) -> None:
    base = results["batch"][0]
    rows = [[f"×{row['scale']}", row["sequences"], f"{row['median_step_s']:.2f} s",
             f"{row['median_step_s'] / base['median_step_s']:.2f} (work {row['scale'] / base['scale']:g})",
             f"{row['sequences_per_s']:.0f}", f"{row['tokens_per_s']:.0f}",
             " / ".join(f"{seconds:.2f}" for seconds in row["phases_s"].values())] for row in results["batch"]]
    print("\nscaling: batch (2 ranks)")
    print(common.markdown_table(["batch", "sequences", "step (median)", "cost ratio", "sequences/s", "tokens/s",
                                 "generate / log-prob / update s"], rows))
    if len(results["dp"]) == 2:
        one, two = results["dp"]
        print(f"\nscaling: DP at batch ×{one['scale']} ({one['sequences']} sequences)")
        print(common.markdown_table(["ranks", "step (median)", "sequences/s", "generate / log-prob / update s"], [
            [row["dp"], f"{row['median_step_s']:.2f} s", f"{row['sequences_per_s']:.0f}",
             " / ".join(f"{seconds:.2f}" for seconds in row["phases_s"].values())] for row in (one, two)]))
        print(f"DP speed-up 1 → 2 ranks: {one['median_step_s'] / two['median_step_s']:.2f}× (perfect: 2)")


if __name__ == "__main__":
    main()
