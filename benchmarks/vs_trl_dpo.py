"""DPO against a peer: ``hybridrl dpo`` vs TRL's ``DPOTrainer``, same checkpoint, pairs, loss, optimizer and precision —
the loss curve step by step and pairs/s, measured in one run.

    PYTHONPATH=. python benchmarks/vs_trl_dpo.py [--pairs 32 --steps 12 --rounds 2 --model DIR]

TRL is the ``test`` extra's (it installs beside the project's pins). Both sides read the same plain-text pairs (the
demo's synthetic arithmetic pairs, the shorter answer preferred; no chat template), tokenise them to the same ids
(checked: each side writes its sequences), and train ``--steps`` optimizer steps of **all** ``--pairs`` pairs in one
micro-batch (so the order each side draws them in cannot matter) with DPO (β = ``--beta``), AdamW (lr ``--lr``, no
weight decay, constant schedule, clip 1.0), fp32, one process (hybridrl: one rank), the reference's log-probs
computed once before training on both sides (TRL's ``precompute_ref_log_probs``). ``--model``: a Hugging Face model
directory (default: the tiny demo model, built here).

Reported: each side's loss per step and the largest difference between them (the same weights, data and update
rule: they agree to rounding), the median step time over the steps after the first, pairs/s, and TRL ÷ hybridrl
(> 1: hybridrl is faster). Each side runs in its own process, ``--rounds`` times, alternating which goes first.
Writes ``benchmarks/results/vs_trl_dpo.json``. No timing is asserted anywhere.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

HERE = Path(__file__).resolve().parent
SIDES = ("trl", "hybridrl")


def write_pairs(path: Path, count: int) -> None:
    """The demo's synthetic pairs (arithmetic, the shorter answer preferred) as plain-text JSON lines."""
    from hybridrl.data.synthetic import build_synthetic_task
    from hybridrl.data.synthetic_preference import synthetic_pairs

    task = build_synthetic_task("arithmetic", seed=1, operators="+", max_first_operand=29, max_second_operand=9)
    rows = [row for row, _ in zip(task.train_rows(), range(count))]
    pairs = synthetic_pairs(rows, "shorter", seed=1, spread=3)
    with path.open("w") as out:
        for pair in pairs:
            prompt = pair.prompt if isinstance(pair.prompt, str) else pair.prompt[-1]["content"]
            out.write(json.dumps({"prompt": prompt + " ", "chosen": pair.chosen, "rejected": pair.rejected}) + "\n")


def run_trl(args, pairs_file: Path, out: Path) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    rows = [json.loads(line) for line in pairs_file.read_text().splitlines()]
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    config = DPOConfig(output_dir=str(out / "trl"), beta=args.beta, loss_type=["sigmoid"], learning_rate=args.lr,
                       lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=1.0, max_steps=args.steps,
                       per_device_train_batch_size=len(rows), gradient_accumulation_steps=1, logging_steps=1,
                       report_to=[], use_cpu=True, bf16=False, max_length=None, precompute_ref_log_probs=True,
                       save_strategy="no", seed=1, disable_tqdm=True)
    times = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *unused, **kwargs):
            times.append([time.perf_counter()])

        def on_step_end(self, *unused, **kwargs):
            times[-1].append(time.perf_counter())
    trainer = DPOTrainer(model=AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32),
                         ref_model=AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32),
                         args=config, processing_class=tokenizer, train_dataset=Dataset.from_list(rows),
                         callbacks=[StepTimer()])
    batch = next(iter(trainer.get_train_dataloader()))
    sequences = sorted(ids[mask.bool()].tolist() for ids, mask in zip(batch["input_ids"], batch["attention_mask"]))
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return {"losses": losses, "step_seconds": [end - start for start, end in times], "sequences": sequences}


def run_hybridrl(args, pairs_file: Path, out: Path) -> dict:
    from transformers import AutoTokenizer

    from hybridrl.config import load_config
    from hybridrl.data.preference import read_preference_pairs, encode_pairs
    from hybridrl.trainers.dpo_trainer import DPOTrainer
    from hybridrl.utils.tracking import read_metrics

    count = len(pairs_file.read_text().splitlines())
    config = load_config([
        f"model.path={args.model}", "model.dtype=float32", f"data.train_files=[{pairs_file}]",
        f"data.val_files=[{pairs_file}]", "data.apply_chat_template=false", f"data.train_batch_size={count}",
        f"data.micro_batch_size_per_gpu={count}", f"data.val_batch_size={count}", "data.max_prompt_length=64",
        "data.max_response_length=16", f"loss.beta={args.beta}", f"optim.lr={args.lr}", "optim.weight_decay=0.0",
        "loss.grad_clip=1.0", f"trainer.total_training_steps={args.steps}",
        "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.n_gpus_per_node=1", "trainer.device=cpu",
        "trainer.logger=[jsonl]", "trainer.resume_mode=disable", f"trainer.default_local_dir={out / 'hybridrl'}",
        "trainer.ray.num_cpus=2"], "dpo_trainer")
    DPOTrainer(config).fit()
    rows = [row for row in read_metrics(out / "hybridrl") if "dpo/loss" in row]
    elapsed = [row["time/elapsed_s"] for row in rows]
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    pairs = encode_pairs(tokenizer, read_preference_pairs([str(pairs_file)]), 16, apply_chat_template=False)
    sequences = sorted(ids[mask.bool()].tolist() for side in ("chosen", "rejected")
                       for ids, mask in zip(pairs[f"{side}_input_ids"], pairs[f"{side}_attention_mask"]))
    return {"losses": [row["dpo/loss"] for row in rows],
            "step_seconds": [later - earlier for earlier, later in zip(elapsed, elapsed[1:])], "sequences": sequences}


def one_side(args) -> None:
    out = Path(args.out)
    result = (run_trl if args.side == "trl" else run_hybridrl)(args, Path(args.pairs_file), out)
    (out / f"{args.side}.json").write_text(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=32)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--model", default=None)
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--pairs-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        return one_side(args)
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        if args.model is None:
            from hybridrl.utils.tiny_model import save_tiny_model
            args.model = str(save_tiny_model(root / "model"))
        pairs_file = root / "pairs.jsonl"
        write_pairs(pairs_file, args.pairs)
        runs = {side: [] for side in SIDES}
        for round_index in range(args.rounds):
            order = SIDES if round_index % 2 == 0 else SIDES[::-1]
            for side in order:
                out = root / f"{side}_{round_index}"
                out.mkdir()
                command = [sys.executable, __file__, "--side", side, "--out", str(out), "--pairs-file", str(pairs_file),
                           "--steps", str(args.steps), "--beta", str(args.beta), "--lr", str(args.lr),
                           "--model", args.model]
                subprocess.run(command, check=True, cwd=HERE.parent)
                runs[side].append(json.loads((out / f"{side}.json").read_text()))
        report(args, runs)


def report(args, runs: dict) -> None:
    trl, ours = runs["trl"][0], runs["hybridrl"][0]
    same_tokens = trl["sequences"] == ours["sequences"]
    differences = [abs(a - b) for a, b in zip(trl["losses"], ours["losses"])]
    medians = {side: statistics.median(seconds for run in runs[side] for seconds in run["step_seconds"][1:])
               for side in SIDES}
    summary = {
        "machine": common.machine_info(), "settings": {key: getattr(args, key) for key in
                                                       ("pairs", "steps", "rounds", "beta", "lr")},
        "same_token_ids": same_tokens, "losses": {side: runs[side][0]["losses"] for side in SIDES},
        "max_loss_difference": max(differences), "median_step_s": medians,
        "pairs_per_s": {side: args.pairs / medians[side] for side in SIDES},
        "trl_over_hybridrl_step_time": medians["trl"] / medians["hybridrl"]}
    print(f"same token ids on both sides: {same_tokens}")
    print("step  TRL loss    hybridrl loss")
    for step, (a, b) in enumerate(zip(trl["losses"], ours["losses"]), start=1):
        print(f"{step:4d}  {a:.6f}    {b:.6f}")
    print(f"largest loss difference: {max(differences):.2e}")
    for side in SIDES:
        print(f"{side:9s} median step {medians[side]:.3f} s  {args.pairs / medians[side]:.1f} pairs/s")
    print(f"TRL step time / hybridrl step time: {summary['trl_over_hybridrl_step_time']:.2f}")
    common.RESULTS_DIR.mkdir(exist_ok=True)
    (common.RESULTS_DIR / "vs_trl_dpo.json").write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
