"""A real pretrained model learns on CPU — hybridrl and TRL side by side, scored on problems neither trained on.

    PYTHONPATH=. python benchmarks/smollm2_learns.py [--steps 150] [--sides hybridrl,trl]

SmolLM2-135M-Instruct (converted once from the GGUF wheel: ``recipes/smollm2_word_problems_cpu.sh``), GRPO on the
arithmetic word problems of :mod:`hybridrl.data.word_problems`. hybridrl runs the recipe as a user would
(``hybridrl train --config-name grpo_smollm2_word_problems_cpu``); TRL's ``GRPOTrainer`` (``vs_trl_trl.py`` in
``.venv-trl``) runs the same steps from the same prompts in the same order, with the same batch (prompts × responses),
sampling temperature, lengths, learning rate (constant AdamW, no weight decay, clip 1.0), token-mean loss, no KL,
group-std advantages, bf16 compute with fp32 master weights, and the same reward code (``word_problems_task.py``
calls hybridrl's GSM8K-style scorer). Both final models, and the base model, are then scored by one evaluator:
greedy decoding with transformers (bf16, ``max_response_length`` tokens) on the 200 held-out problems, accuracy =
the scorer's ``acc`` (the right number, with or without ``####``). Sides run one after the other, never together.

Writes ``benchmarks/results/smollm2_learns.json`` and ``…/smollm2_learns.png`` (training reward per step on both
sides, hybridrl's own validation curve, and the held-out accuracies).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CONFIG_NAME = "grpo_smollm2_word_problems_cpu"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: the recipe's)")
    parser.add_argument("--sides", default="hybridrl,trl")
    parser.add_argument("--trl-python", default=str(REPO / ".venv-trl/bin/python"))
    parser.add_argument("--timeout", type=float, default=5400.0, help="seconds per side")
    parser.add_argument("--name", default="smollm2_learns")
    return parser.parse_args()


def recipe(steps: int | None) -> Any:
    from hybridrl.config import load_config

    return load_config([f"trainer.total_training_steps={steps}"] if steps else [], config_name=CONFIG_NAME)


def held_out_accuracy(model_dir: Path, val_rows: list[dict[str, Any]], max_new_tokens: int) -> float:
    """Greedy accuracy of the HF model in ``model_dir`` on ``val_rows`` (one evaluator for every model)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybridrl.rewards import default_compute_score

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    right = 0.0
    for start in range(0, len(val_rows), 50):
        chunk = val_rows[start:start + 50]
        texts = [tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
                 for row in chunk]
        encoded = tokenizer(texts, return_tensors="pt", padding=True)
        with torch.no_grad():
            output = model.generate(**encoded, max_new_tokens=max_new_tokens, do_sample=False,
                                    pad_token_id=tokenizer.pad_token_id)
        for row, sequence in zip(chunk, output[:, encoded.input_ids.shape[1]:]):
            response = tokenizer.decode(sequence, skip_special_tokens=True)
            right += default_compute_score(row["data_source"], response, row["reward_model"]["ground_truth"])["acc"]
    return right / len(val_rows)


def run_hybridrl(config: Any, workdir: Path, timeout: float) -> dict[str, Any]:
    run_dir, export_dir = workdir / "hybridrl", workdir / "hybridrl-hf"
    command = [str(REPO / ".venv/bin/hybridrl"), "train", "--config-name", CONFIG_NAME,
               f"trainer.total_training_steps={config.trainer.total_training_steps}",
               f"trainer.default_local_dir={run_dir}", "trainer.logger=[console,jsonl]", "trainer.resume_mode=disable"]
    started = time.perf_counter()
    code, memory, tail = common.run_measured(command, timeout)
    minutes = (time.perf_counter() - started) / 60
    if code != 0:
        sys.exit(f"[smollm2_learns] hybridrl failed (exit {code}):\n{tail}")
    subprocess.run([str(REPO / ".venv/bin/hybridrl"), "export", str(run_dir), str(export_dir)], check=True,
                   capture_output=True)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {"minutes": minutes, "peak_rss_mib": memory["peak_rss_mib"], "model_dir": export_dir,
            "reward": [row["critic/score/mean"] for row in rows if "critic/score/mean" in row],
            "validation": [(row["step"], row["val/accuracy"]) for row in rows if "val/accuracy" in row]}


def run_trl(config: Any, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    from hybridrl.data.io import read_rows

    train_file = workdir / "train.jsonl"
    steps, prompts, n = config.trainer.total_training_steps, config.data.train_batch_size, config.rollout.n
    rows = [source.row for source in read_rows(REPO / config.data.train_files[0]).rows][:steps * prompts]
    train_file.write_text("".join(json.dumps(row) + "\n" for row in rows))
    micro = config.actor.ppo_micro_batch_size_per_gpu
    spec = {"model_path": str((REPO / config.model.path).resolve()), "train_file": str(train_file), "steps": steps,
            "prompts": prompts, "n": n, "max_prompt_length": config.data.max_prompt_length,
            "max_response_length": config.data.max_response_length, "lr": config.actor.optim.lr,
            "temperature": config.rollout.temperature, "micro_batch": micro, "accumulation": prompts * n // micro,
            "precision": "bf16", "seed": config.trainer.seed, "reward_file": str(HERE / "word_problems_task.py"),
            "data_source": "arithmetic_word_problems", "save_dir": str(workdir / "trl-hf")}
    spec_path, out = workdir / "trl_spec.json", workdir / "trl.json"
    spec_path.write_text(json.dumps(spec))
    started = time.perf_counter()
    code, memory, tail = common.run_measured([args.trl_python, str(HERE / "vs_trl_trl.py"), str(spec_path),
                                                str(out)], args.timeout)
    if code != 0 or not out.is_file():
        sys.exit(f"[smollm2_learns] TRL failed (exit {code}):\n{tail}")
    result = json.loads(out.read_text())
    return {"minutes": (time.perf_counter() - started) / 60, "peak_rss_mib": memory["peak_rss_mib"],
            "model_dir": workdir / "trl-hf", "reward": result["reward"], "versions": result.get("versions")}


def plot(results: dict[str, Any], base: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for side, result in results.items():
        rewards = result["reward"]
        window = 10
        smooth = [sum(rewards[max(0, i - window + 1):i + 1]) / len(rewards[max(0, i - window + 1):i + 1])
                  for i in range(len(rewards))]
        left.plot(range(1, len(rewards) + 1), smooth, label=f"{side} (mean of {window} steps)")
    left.set(xlabel="step", ylabel="training reward", title="GRPO training reward")
    left.legend()
    if "hybridrl" in results:
        steps, accuracy = zip(*results["hybridrl"]["validation"])
        right.plot(steps, accuracy, marker="o", label="hybridrl's own validation (vLLM, greedy)")
    for side, result in results.items():
        right.scatter([len(result["reward"])], [result["held_out"]], label=f"{side} final (one evaluator)", zorder=3)
    right.axhline(base, linestyle="--", color="grey", label="base model")
    right.set(xlabel="step", ylabel="held-out accuracy", title="200 held-out word problems", ylim=(0, 1))
    right.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    args = parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    sides = [side for side in args.sides.split(",") if side]
    config = recipe(args.steps)
    from hybridrl.data.io import read_rows

    val_rows = [source.row for source in read_rows(REPO / config.data.val_files[0]).rows]
    max_new = config.data.max_response_length
    machine = common.machine_info()
    base = held_out_accuracy(REPO / config.model.path, val_rows, max_new)
    print(f"[smollm2_learns] base model: held-out accuracy {base:.3f}", flush=True)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="smollm2_learns_") as tmp:
        for side in sides:
            runner = run_hybridrl(config, Path(tmp), args.timeout) if side == "hybridrl" else \
                run_trl(config, Path(tmp), args)
            runner["held_out"] = held_out_accuracy(runner.pop("model_dir"), val_rows, max_new)
            results[side] = runner
            print(f"[smollm2_learns] {side}: {runner['minutes']:.1f} min, held-out {base:.3f} -> "
                  f"{runner['held_out']:.3f}", flush=True)
    common.RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    plot(results, base, common.RESULTS_DIR / f"{args.name}.png")
    report = {"benchmark": "smollm2_learns", "machine": machine, "steps": config.trainer.total_training_steps,
              "base_held_out": base, "results": results}
    print(common.markdown_table(["side", "minutes", "held-out before", "held-out after", "points"],
                                [[side, f"{r['minutes']:.1f}", f"{base:.3f}", f"{r['held_out']:.3f}",
                                  f"{100 * (r['held_out'] - base):+.1f}"] for side, r in results.items()]))
    print(f"[smollm2_learns] wrote {common.write_json(args.name, report)}")


if __name__ == "__main__":
    main()
