"""What does the gradient-accumulation path cost per optimizer step, and how many collectives does it issue?

On 2 gloo ranks (spawned, one thread each), a Llama of hidden 256 × 4 layers (FSDP2: one shard group per layer plus
the root) takes one optimizer step over ``K × m`` sequences per rank with the actor's PPO loss, four ways:

- ``accumulate``  — ``TrainingEngine.optimizer_step``: split into K micro-batches of m, all-reduce the global token
  count, backward each with gradient sync only on the last, all-reduce the metrics, clip, step (what the actor runs
  with ``fsdp.grad_sync=step``, the default);
- ``accumulate micro_batch`` — the same with ``fsdp.grad_sync=micro_batch``: a reduce-scatter after every
  micro-batch into the sharded gradients (K per group per step; less memory, more communication);
- ``bare no-sync`` — the same K forward/backwards and sync pattern, written as a bare loop on pre-split micro-batches
  with a precomputed normaliser and no metrics: the floor for this sync pattern;
- ``bare sync-each`` — the bare loop with FSDP2's default, a gradient reduce-scatter after *every* backward: K
  separate steps' worth of forward/backward (the baseline without accumulation logic).

Every path ends with the same clip + AdamW step. ``ratio`` = accumulate ÷ baseline (target ≤ 1.05), from the medians
from the best of ``--repeats`` (paths interleaved), and from process CPU time summed over the ranks. A step's wall time
is the slower rank's (a barrier starts each step). On a shared machine wall time mostly measures the neighbours; CPU
time (the work the path does, waits excluded) is the steadier overhead figure, while wall time also sees the
collectives' latency.
Collectives are counted in a separate untimed step by wrapping the ``torch.distributed`` functions (and the functional
collectives DTensor uses) in the worker processes only; ``peak MiB`` is the live-tensor peak of that step on rank 0
(``LiveTensorPeak``), which shows FSDP2's unsharded gradient buffers held during no-sync accumulation.
``micro_batch ratio`` = accumulate micro_batch ÷ accumulate: what the extra reduce-scatters cost here (gloo on
loopback: memory copies, no network — a lower bound for a real interconnect).

Run from the repository root: ``PYTHONPATH=. python benchmarks/grad_accum.py [--micro 4 --ks 1,2,4,8 --repeats 5]``.
Writes ``benchmarks/results/grad_accum.json``. No timing is asserted anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hybridrl.config.schema import ModelConfig, OptimConfig
from hybridrl.protocol import Batch
from hybridrl.utils.collectives import CollectiveCounter
from hybridrl.utils.distributed import find_free_port
from hybridrl.utils.tiny_model import TinyModelSpec, save_tiny_model
from hybridrl.engines.base import TrainingEngine
from hybridrl.engines.losses import PolicyLoss, SequenceForward, global_normalizer
from hybridrl.engines.micro_batches import DataParallelGroup, MicroBatching
from hybridrl.modeling.fsdp import ShardingOptions, set_gradient_sync, shard_model
from hybridrl.autotune.memory_sizing import LiveTensorPeak
from hybridrl.modeling.model_builder import build_model
from hybridrl.engines.optim import build_optimizer, build_scheduler, clipped_step

RESULTS = Path(__file__).resolve().parent / "results" / "grad_accum.json"
WORLD = 2
SPEC = TinyModelSpec(hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=2, intermediate_size=688)
PROMPT, RESPONSE = 32, 96
PATHS = ("accumulate", "accumulate micro_batch", "bare no-sync", "bare sync-each")


def hardware() -> dict:
    model = "unknown"
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {"cpu": model, "logical_cpus": os.cpu_count(), "threads_per_rank": 1, "ranks": WORLD,
            "backend": "gloo (CPU, loopback)", "load_average_1m_at_start": os.getloadavg()[0],
            "python": platform.python_version(), "torch": torch.__version__}


def make_rows(num_rows: int, seed: int) -> Batch:
    """PPO-shaped rows: left-padded prompts of 16–32 tokens, right-padded responses of 32–96 tokens."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(4, 80, (num_rows, PROMPT + RESPONSE), generator=generator)
    attention_mask = torch.zeros_like(input_ids)
    prompts = torch.randint(16, PROMPT + 1, (num_rows,), generator=generator)
    responses = torch.randint(32, RESPONSE + 1, (num_rows,), generator=generator)
    for row in range(num_rows):
        attention_mask[row, PROMPT - prompts[row]:PROMPT + responses[row]] = 1
    response_mask = attention_mask[:, PROMPT:].clone()
    return Batch(tensors=dict(input_ids=input_ids * attention_mask, attention_mask=attention_mask,
                              responses=(input_ids * attention_mask)[:, PROMPT:], response_mask=response_mask,
                              advantages=torch.randn(num_rows, RESPONSE, generator=generator) * response_mask,
                              old_log_probs=-4.4 * response_mask.float()))


def run_path(path: str, engine: TrainingEngine, loss: PolicyLoss, batch: Batch, micro: int, dp: DataParallelGroup,
             prepared: tuple) -> None:
    """One optimizer step over ``batch`` the way ``path`` does it (bare loops use the ``prepared`` normaliser and
    micro-batches)."""
    if path.startswith("accumulate"):
        engine.micro_batching = MicroBatching(micro_batch_size=micro,
                                              grad_sync=path.split(" ")[1] if " " in path else "step")
        engine.optimizer_step(batch, loss)
        return
    normalizer, micro_batches = prepared
    for index, micro_batch in enumerate(micro_batches):
        set_gradient_sync(engine.model, path == "bare sync-each" or index == len(micro_batches) - 1)
        share, _ = loss(engine.model, micro_batch, normalizer)
        (share * dp.size).backward()
    clipped_step(engine.model, engine.optimizer, engine.scheduler, 1.0)


def timed_step(path, engine, loss, batch, micro, dp, prepared) -> tuple[float, float]:
    """``(wall seconds of the slower rank, CPU seconds summed over ranks)`` of one step."""
    dist.barrier()
    start, start_cpu = time.perf_counter(), time.process_time()
    run_path(path, engine, loss, batch, micro, dp, prepared)
    wall = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    cpu = torch.tensor([time.process_time() - start_cpu], dtype=torch.float64)
    dist.all_reduce(wall, op=dist.ReduceOp.MAX)  # the step ends when the slower rank ends
    dist.all_reduce(cpu, op=dist.ReduceOp.SUM)
    return float(wall), float(cpu)


def rank_main(rank: int, model_dir: str, port: int, micro: int, ks: list[int], repeats: int, out_path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    from torch.distributed.device_mesh import init_device_mesh

    model = build_model(ModelConfig(path=model_dir), "actor")
    shard_model(model, init_device_mesh("cpu", (WORLD,)), ShardingOptions())
    optim = OptimConfig(lr=1e-6)
    optimizer = build_optimizer(model, optim)
    dp = DataParallelGroup(rank=rank, size=WORLD)
    engine = TrainingEngine(model, dp=dp, optimizer=optimizer, scheduler=build_scheduler(optimizer, optim, 10 ** 6),
                            grad_clip=1.0)
    loss = PolicyLoss(forward=SequenceForward(), temperature=1.0, loss_scale_factor=float(RESPONSE))
    results = []
    for k in ks:
        batch = make_rows(k * micro, seed=1000 * k + rank)
        prepared = (global_normalizer(batch, "token-mean", dp), batch.split([micro] * k))
        run_path("accumulate", engine, loss, batch, micro, dp, prepared)  # warm-up
        times, cpu_times = {path: [] for path in PATHS}, {path: [] for path in PATHS}
        for repeat in range(repeats):
            for offset in range(len(PATHS)):  # rotate the order so drift and neighbours hit every path alike
                path = PATHS[(repeat + offset) % len(PATHS)]
                wall, cpu = timed_step(path, engine, loss, batch, micro, dp, prepared)
                times[path].append(wall)
                cpu_times[path].append(cpu)
        row = {"K": k, "micro_batch_size": micro, "tokens_per_rank": int(batch["attention_mask"].sum()),
               "seconds": {path: statistics.median(values) for path, values in times.items()},
               "seconds_best": {path: min(values) for path, values in times.items()},
               "cpu_seconds": {path: statistics.median(values) for path, values in cpu_times.items()},
               "collectives": {}, "peak_mib_rank0": {}}
        for path in PATHS:
            dist.barrier()
            with CollectiveCounter() as counter, LiveTensorPeak() as tracker:
                run_path(path, engine, loss, batch, micro, dp, prepared)
            row["collectives"][path] = dict(sorted(counter.counts.items()))
            row["peak_mib_rank0"][path] = tracker.peak_bytes / 2 ** 20
        results.append(row)
    if rank == 0:
        Path(out_path).write_text(json.dumps(results))
    dist.destroy_process_group()


RATIOS = (  # (name, numerator path, denominator path)
    ("acc/no-sync", "accumulate", "bare no-sync"),
    ("acc/sync-each", "accumulate", "bare sync-each"),
    ("mb/acc", "accumulate micro_batch", "accumulate"),
    ("mb/sync-each", "accumulate micro_batch", "bare sync-each"),
)


def add_ratios(row: dict) -> None:
    """``row["ratios"][name] = {"wall", "best", "cpu"}``: numerator ÷ denominator of each of ``RATIOS``."""
    row["ratios"] = {name: {kind: row[key][top] / row[key][bottom]
                            for kind, key in (("wall", "seconds"), ("best", "seconds_best"), ("cpu", "cpu_seconds"))}
                     for name, top, bottom in RATIOS}


def format_ratios(ratios: dict) -> str:
    return ", ".join(f"{ratios[kind]:.3f}" for kind in ("wall", "best", "cpu"))


def print_table(rows: list[dict]) -> None:
    counted = ("reduce_scatter", "all_gather", "all_reduce")
    print(f"{'K':>2} {'m':>2} {'tok/rank':>8} | " + " | ".join(f"{path:>22}" for path in PATHS)
          + " | " + " | ".join(f"{name} wall/best/CPU" for name, _, _ in RATIOS)
          + " | per step: reduce-scatters, all-gathers, all-reduces (" + " / ".join(PATHS) + ") | peak MiB")
    for row in rows:
        counts = {kind: " / ".join(str(sum(value for name, value in row["collectives"][path].items() if kind in name))
                                   for path in PATHS) for kind in counted}
        ratios = " | ".join(f"{format_ratios(row['ratios'][name]):>26}" for name, _, _ in RATIOS)
        print(f"{row['K']:>2} {row['micro_batch_size']:>2} {row['tokens_per_rank']:>8} | "
              + " | ".join(f"{row['seconds'][path] * 1e3:>19.1f} ms" for path in PATHS) + f" | {ratios} | "
              + ", ".join(counts[kind] for kind in counted) + " | "
              + " / ".join(f"{row['peak_mib_rank0'][path]:.1f}" for path in PATHS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--micro", type=int, default=4, help="sequences per micro-batch (m)")
    parser.add_argument("--ks", default="1,2,4,8", help="micro-batches per optimizer step (K), comma-separated")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    machine = hardware()
    with tempfile.TemporaryDirectory() as directory:
        model_dir = str(save_tiny_model(Path(directory) / "model", SPEC))
        out_path = str(Path(directory) / "rows.json")
        mp.start_processes(rank_main, args=(model_dir, find_free_port(), args.micro, ks, args.repeats, out_path),
                           nprocs=WORLD, join=True, start_method="spawn")
        rows = json.loads(Path(out_path).read_text())
    for row in rows:
        add_ratios(row)
    machine["load_average_1m_at_end"] = os.getloadavg()[0]
    print(f"machine: {machine['cpu']}, {machine['logical_cpus']} logical CPUs, {WORLD} gloo ranks x 1 thread, "
          f"torch {machine['torch']}; model: hidden {SPEC.hidden_size}, {SPEC.num_layers} layers (5 FSDP groups)")
    print_table(rows)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"hardware": machine, "spec": SPEC.__dict__, "prompt": PROMPT,
                                   "response": RESPONSE, "repeats": args.repeats, "rows": rows}, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
