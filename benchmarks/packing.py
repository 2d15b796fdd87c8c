"""Padding waste on a skewed length distribution: padded vs packed (padding removed) vs token-budget micro-batching.

One mini-batch of ``--batch`` RL rows whose response lengths are log-normal (median ``--median``, σ ``--sigma``,
clipped to ``[8, --max-response]``) and prompt lengths uniform in ``[16, 64]``. As in the rollout output, every row is
``[left-padded prompt | right-padded response]`` of the batch's width ``T = max prompt + max response``. One
forward/backward of the whole mini-batch with the actor's PPO loss (``TrainingEngine.accumulate_gradients``, single
process, one thread), four ways:

- ``padded, m``        — micro-batches of ``m`` rows, each row computed at full width ``T``;
- ``packed, m``        — the same micro-batches with padding removed (``model.use_remove_padding``: one packed row);
- ``budget, padded``   — Karmarkar–Karp micro-batches under a ``--max-tokens`` budget of real tokens, still padded;
- ``budget, packed``   — the same micro-batches, packed: what ``use_dynamic_bsz`` + ``use_remove_padding`` run.

``pad %`` = 1 − real tokens ÷ token positions computed; ``tokens/s`` = real tokens ÷ median step time;
``speed-up`` = padded step time ÷ this one; ``imbalance`` = largest micro-batch's real tokens ÷ the mean (1 = even);
``largest`` = token positions of the largest micro-batch (what sizes the activation memory peak). In one process the
budget's balance buys bounded memory, not throughput; across DP ranks it also removes stragglers.
Note: under ``sdpa`` a packed micro-batch of ``N`` tokens attends through an ``[N, N]`` block-diagonal mask, so its
attention cost is quadratic in the *packed* length (``flash_attention_2`` varlen, GPU only, avoids that).

Run from the repository root: ``PYTHONPATH=. python benchmarks/packing.py [--batch 64 --micro 8 --max-tokens 1024]``.
Writes ``benchmarks/results/packing.json``. No timing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from hybridrl.data.partition import partition_stats
from hybridrl.protocol import Batch
from hybridrl.utils.tiny_model import TinyModelSpec, build_tiny_model
from hybridrl.engines.base import TrainingEngine
from hybridrl.engines.losses import PolicyLoss, SequenceForward
from hybridrl.engines.micro_batches import DataParallelGroup, MicroBatching, split_micro_batches

RESULTS = Path(__file__).resolve().parent / "results" / "packing.json"
SPEC = TinyModelSpec(hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=2, intermediate_size=688)
VOCAB = 84


def hardware() -> dict:
    model = "unknown"
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {"cpu": model, "logical_cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "load_average_1m_at_start": os.getloadavg()[0], "python": platform.python_version(),
            "torch": torch.__version__}


def skewed_batch(num_rows: int, median: float, sigma: float, max_response: int, seed: int = 0) -> Batch:
    """PPO rows with log-normal response lengths (see the module docstring)."""
    generator = torch.Generator().manual_seed(seed)
    responses = (median * torch.exp(sigma * torch.randn(num_rows, generator=generator))).round().long()
    responses = responses.clamp(8, max_response)
    prompts = torch.randint(16, 65, (num_rows,), generator=generator)
    prompt_width, response_width = int(prompts.max()), int(responses.max())
    input_ids = torch.randint(4, VOCAB, (num_rows, prompt_width + response_width), generator=generator)
    attention_mask = torch.zeros_like(input_ids)
    for row in range(num_rows):
        attention_mask[row, prompt_width - prompts[row]:prompt_width + responses[row]] = 1
    input_ids = input_ids * attention_mask
    response_mask = attention_mask[:, prompt_width:].clone()
    return Batch(tensors=dict(input_ids=input_ids, attention_mask=attention_mask, responses=input_ids[:, prompt_width:],
                              response_mask=response_mask,
                              advantages=torch.randn(num_rows, response_width, generator=generator) * response_mask,
                              old_log_probs=-4.4 * response_mask.float()))


def computed_positions(micro_batches: list[Batch], packed: bool) -> int:
    """Token positions the forward runs over: real tokens when packed, rows × width when padded."""
    if packed:
        return sum(int(micro["attention_mask"].sum()) for micro in micro_batches)
    return sum(micro["attention_mask"].numel() for micro in micro_batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=64, help="rows in the mini-batch")
    parser.add_argument("--micro", type=int, default=8, help="rows per fixed micro-batch (m)")
    parser.add_argument("--max-tokens", type=int, default=1024, help="token budget per micro-batch")
    parser.add_argument("--median", type=float, default=64, help="median response length (tokens)")
    parser.add_argument("--sigma", type=float, default=0.8, help="log-normal sigma of response lengths")
    parser.add_argument("--max-response", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    machine = hardware()
    model = build_tiny_model(SPEC, VOCAB, pad_token_id=0, eos_token_id=1).train()
    batch = skewed_batch(args.batch, args.median, args.sigma, args.max_response)
    lengths = batch["attention_mask"].sum(-1).tolist()
    real_tokens = int(sum(lengths))
    dp = DataParallelGroup()
    modes = {f"padded, m={args.micro}": (MicroBatching(micro_batch_size=args.micro), False),
             f"packed, m={args.micro}": (MicroBatching(micro_batch_size=args.micro), True),
             f"budget {args.max_tokens}, padded": (MicroBatching(max_tokens=args.max_tokens), False),
             f"budget {args.max_tokens}, packed": (MicroBatching(max_tokens=args.max_tokens), True)}
    engine = TrainingEngine(model, dp=dp)
    scale = float(batch["response_mask"].shape[-1])
    rows, times = [], {name: [] for name in modes}
    for repeat in range(args.repeats + 1):  # the first round is a warm-up
        for name, (micro_batching, packed) in modes.items():
            engine.micro_batching = micro_batching
            loss = PolicyLoss(forward=SequenceForward(packed=packed), temperature=1.0, loss_scale_factor=scale)
            start = time.perf_counter()
            engine.accumulate_gradients(batch, loss)
            elapsed = time.perf_counter() - start
            model.zero_grad(set_to_none=True)
            if repeat:
                times[name].append(elapsed)
    for name, (micro_batching, packed) in modes.items():
        micro_batches, _ = split_micro_batches(batch, micro_batching, dp)
        parts, start = [], 0
        for micro in micro_batches:  # real-token sums per micro-batch (lengths of its rows)
            parts.append(list(range(start, start + len(micro))))
            start += len(micro)
        ordered = [int(length) for micro in micro_batches for length in micro["attention_mask"].sum(-1).tolist()]
        stats = partition_stats(ordered, parts)
        positions = computed_positions(micro_batches, packed)
        # the memory driver: the largest micro-batch's computed positions (real tokens packed; rows × T padded)
        largest = max(computed_positions([micro], packed) for micro in micro_batches)
        seconds = statistics.median(times[name])
        rows.append({"mode": name, "micro_batches": len(micro_batches), "pad_fraction": 1 - real_tokens / positions,
                     "computed_positions": positions, "seconds": seconds, "seconds_best": min(times[name]),
                     "tokens_per_s": real_tokens / seconds, "imbalance": stats["imbalance_ratio"],
                     "largest_micro_batch_positions": largest})
    baseline = rows[0]["seconds"]
    for row in rows:
        row["speed_up"] = baseline / row["seconds"]
    machine["load_average_1m_at_end"] = os.getloadavg()[0]
    width = batch["attention_mask"].shape[-1]
    print(f"machine: {machine['cpu']}, {machine['logical_cpus']} logical CPUs, 1 thread, torch {machine['torch']}")
    print(f"batch: {args.batch} rows, width T={width}, {real_tokens} real tokens (mean {real_tokens / args.batch:.0f},"
          f" max {max(lengths)}); responses log-normal(median {args.median:g}, sigma {args.sigma:g})")
    print(f"{'mode':<22} {'micro':>5} {'pad %':>6} {'imbalance':>9} {'largest':>7} {'step s':>8} {'tokens/s':>9} "
          f"{'speed-up':>8}")
    for row in rows:
        print(f"{row['mode']:<22} {row['micro_batches']:>5} {100 * row['pad_fraction']:>6.1f} "
              f"{row['imbalance']:>9.2f} {row['largest_micro_batch_positions']:>7} {row['seconds']:>8.3f} "
              f"{row['tokens_per_s']:>9.0f} {row['speed_up']:>8.2f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"hardware": machine, "spec": SPEC.__dict__, "args": vars(args),
                                   "batch_width": width, "real_tokens": real_tokens, "rows": rows}, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
