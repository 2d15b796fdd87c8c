"""Per-group sync intervals (``hybridrl.workers.local_sgd``) vs syncing every step: bytes communicated and loss.

2 spawned gloo ranks each train a replica of a tiny Llama (char tokenizer) on its own stream of arithmetic SFT
examples (``"23+45="`` → ``"68"``), AdamW, the same seed and steps for every schedule:

- ``every_step``: every group at interval 1 (= plain DDP gradient all-reduce);
- ``proposed``: intervals proposed by ``profile_gradient_change`` + ``propose_intervals`` from the first steps;
- ``issue_example``: attention every 2, MLP every 5, embeddings every 10, norms every step;
- ``uniform_4`` / ``uniform_10``: every group at 4 / 10 (plain local SGD).

Reported per schedule: payload bytes per rank handed to all-reduce (and the reduction vs ``every_step``), the mean
training loss of the last 10 steps, and the held-out loss of the rank-averaged model every ``--eval-every`` steps.
Nothing is asserted; the table is the result — including where fewer bytes cost loss.

    PYTHONPATH=. python benchmarks/local_sgd.py [--steps 150 --batch 16 --lr 3e-3]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hybridrl.data.sft import encode_sft_examples
from hybridrl.data.synthetic import ArithmeticTask
from hybridrl.utils.tiny_model import TinyModelSpec, build_char_tokenizer, build_tiny_model
from hybridrl.workers.local_sgd import PeriodicSync, default_group_of, profile_gradient_change, propose_intervals
from hybridrl.modeling.sequences import response_log_probs

SPEC = TinyModelSpec(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128)
RESPONSE = 4


def batches(rank: int, steps: int, batch: int, tokenizer) -> list:
    """This rank's encoded SFT batches (rank ``r`` reads its own slice of the task's training stream)."""
    task = ArithmeticTask(seed=3, max_digits=2, operators="+-")
    out = []
    for step in range(steps):
        start = (step * 2 + rank) * batch
        out.append(encode_sft_examples(tokenizer, task.sft_examples(batch, start), RESPONSE))
    return out


def nll(model, encoded) -> torch.Tensor:
    log_prob, _ = response_log_probs(model, encoded["input_ids"], encoded["attention_mask"], RESPONSE)
    mask = encoded["response_mask"].float()
    return -(log_prob * mask).sum() / mask.sum()


def fresh_model(tokenizer):
    return build_tiny_model(SPEC, len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                            eos_token_id=tokenizer.eos_token_id, seed=0)


def averaged_eval(model, held_out) -> float:
    """Held-out loss of the rank-averaged weights (the model a sync would produce); the replica is left as it was."""
    saved = [param.detach().clone() for param in model.parameters()]
    with torch.no_grad():
        for param in model.parameters():
            dist.all_reduce(param.data)
            param.data /= dist.get_world_size()
        loss = float(nll(model, held_out))
        for param, value in zip(model.parameters(), saved):
            param.copy_(value)
    return loss


def train(rank: int, args, intervals: dict[str, int], tokenizer, data, held_out) -> dict:
    torch.manual_seed(0)
    model = fresh_model(tokenizer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    sync = PeriodicSync(model, intervals)
    losses, curve = [], []
    for step, encoded in enumerate(data):
        optimizer.zero_grad(set_to_none=True)
        loss = nll(model, encoded)
        loss.backward()
        sync.before_step()
        optimizer.step()
        sync.after_step()
        losses.append(float(loss.detach()))
        if (step + 1) % args.eval_every == 0:
            curve.append(averaged_eval(model, held_out))
    local = torch.tensor(losses)
    dist.all_reduce(local)
    return {"bytes": sync.stats.total_bytes, "per_group_bytes": sync.stats.per_group_bytes,
            "train_loss_last10": float(local[-10:].mean()) / dist.get_world_size(), "eval_curve": curve}


def schedules(args, tokenizer, data) -> dict[str, dict[str, int]]:
    groups = sorted({default_group_of(name) for name, _ in fresh_model(tokenizer).named_parameters()})
    model = fresh_model(tokenizer)  # profile on one process, on the first steps of rank 0's data, training as it goes
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    rates = profile_gradient_change(model, [lambda e=e: nll(model, e) for e in data[:args.profile_steps]],
                                    optimizer=optimizer)
    example = {group: 2 if group.startswith("attn") else 5 if group.startswith("mlp") else 10
               if group == "embed" else 1 for group in groups}
    return {"every_step": {group: 1 for group in groups}, "proposed": propose_intervals(rates),
            "issue_example": example, "uniform_4": {group: 4 for group in groups},
            "uniform_10": {group: 10 for group in groups}, "_rates": rates}


def rank_main(rank: int, world: int, port: int, args, out_path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    tokenizer = build_char_tokenizer()
    data = batches(rank, args.steps, args.batch, tokenizer)
    held_out = encode_sft_examples(tokenizer, ArithmeticTask(seed=3).sft_examples(64, start=10**6), RESPONSE)
    plans = schedules(args, tokenizer, batches(0, args.profile_steps, args.batch, tokenizer))
    rates = plans.pop("_rates")
    results = {}
    for name, intervals in plans.items():
        started = time.perf_counter()
        results[name] = train(rank, args, intervals, tokenizer, data, held_out)
        results[name].update(intervals=intervals, seconds=time.perf_counter() - started)
    if rank == 0:
        Path(out_path).write_text(json.dumps({"rates": rates, "results": results, "args": vars(args)}, indent=1))
    dist.destroy_process_group()


def report(payload: dict) -> None:
    results = payload["results"]
    base = results["every_step"]["bytes"]
    print("gradient change rate per group (profiling):",
          ", ".join(f"{group} {rate:.2f}" for group, rate in sorted(payload["rates"].items())))
    print(f"{'schedule':<14} {'MiB/rank':>9} {'vs every':>9} {'train(last10)':>14} {'held-out curve':<40}")
    for name, result in results.items():
        curve = " ".join(f"{value:.3f}" for value in result["eval_curve"])
        print(f"{name:<14} {result['bytes'] / 2**20:9.2f} {result['bytes'] / base:9.3f} "
              f"{result['train_loss_last10']:14.4f} {curve}")
    print("proposed intervals:", results["proposed"]["intervals"])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--eval-every", type=int, default=30)
    parser.add_argument("--profile-steps", type=int, default=8)
    args = parser.parse_args(argv)
    out = Path("benchmarks/results/local_sgd.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.start_processes(rank_main, args=(2, port, args, str(out)), nprocs=2, join=True, start_method="spawn")
    payload = json.loads(out.read_text())
    payload["loadavg"] = os.getloadavg()
    out.write_text(json.dumps(payload, indent=1))
    report(payload)


if __name__ == "__main__":
    sys.exit(main())
