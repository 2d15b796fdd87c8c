"""Reward-model training: pairs/s and time per optimizer step vs accumulation steps K at a fixed global batch, and
the gradient reductions each optimizer step issues.

On 2 gloo ranks (spawned, one thread each), a Llama of hidden 256 × 4 layers with a scalar head (FSDP2: one shard group
per layer plus the root) takes optimizer steps of the real path — ``TrainingEngine.optimizer_step`` with a
``BradleyTerryLoss``, as ``RewardModelTrainWorker.update`` runs it: split the rank's pairs into K micro-batches,
all-reduce the global pair count, one forward of chosen + rejected per micro-batch, backward with gradient sync only
on the last, metrics all-reduce, clip, AdamW — over a **fixed** global batch of ``--pairs`` pairs (so the micro-batch
shrinks as K grows: ``pairs = micro × K × 2 ranks``). ``--packed`` runs the packed forward.

Per K: the median (and best) wall time of an optimizer step over ``--repeats`` steps (the slower rank's; a barrier
starts each step), pairs/s = global pairs ÷ median step time, process CPU time summed over ranks (and pairs per CPU
second of a rank, the steadier throughput on a shared machine), and — in a separate
untimed step, counted by wrapping the ``torch.distributed`` collectives as ``grad_accum.py`` does — the reduce-scatters
(gradient reductions: must be one per shard group, i.e. 5, for every K) and the all-reduces. Larger K trades
throughput for memory: smaller micro-batches run the same FLOPs in more, smaller matmuls.

Run from the repository root: ``PYTHONPATH=. python benchmarks/rm_train.py [--pairs 16 --ks 1,2,4,8 --repeats 3 --packed]``.
Writes ``benchmarks/results/rm_train.json``. No timing is asserted anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grad_accum import hardware  # noqa: E402  (the sibling benchmark's machine info)

from hybridrl.config.schema import ModelConfig, OptimConfig  # noqa: E402
from hybridrl.data.preference import PairFields  # noqa: E402
from hybridrl.protocol import Batch  # noqa: E402
from hybridrl.utils.collectives import CollectiveCounter  # noqa: E402
from hybridrl.utils.distributed import find_free_port  # noqa: E402
from hybridrl.utils.tiny_model import TinyModelSpec, save_tiny_model  # noqa: E402
from hybridrl.autotune.grad_noise import NoiseScaleMonitor  # noqa: E402
from hybridrl.engines.base import TrainingEngine  # noqa: E402
from hybridrl.engines.losses import BradleyTerryLoss  # noqa: E402
from hybridrl.engines.micro_batches import DataParallelGroup, MicroBatching  # noqa: E402
from hybridrl.modeling.fsdp import ShardingOptions, shard_model  # noqa: E402
from hybridrl.modeling.model_builder import build_model  # noqa: E402
from hybridrl.engines.optim import build_optimizer, build_scheduler  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "rm_train.json"
WORLD = 2
SPEC = TinyModelSpec(hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=2, intermediate_size=688)
SHARD_GROUPS = SPEC.num_layers + 1
PROMPT, RESPONSE = 32, 96


def make_pairs(num_pairs: int, seed: int) -> Batch:
    """Pairs with a shared left-padded prompt of 16–32 tokens and responses of 32–96 tokens on each side."""
    generator = torch.Generator().manual_seed(seed)
    prompts = torch.randint(16, PROMPT + 1, (num_pairs,), generator=generator)
    tensors = {}
    for side in ("chosen", "rejected"):
        input_ids = torch.randint(4, 80, (num_pairs, PROMPT + RESPONSE), generator=generator)
        mask = torch.zeros_like(input_ids)
        responses = torch.randint(32, RESPONSE + 1, (num_pairs,), generator=generator)
        for row in range(num_pairs):
            mask[row, PROMPT - prompts[row]:PROMPT + responses[row]] = 1
        tensors[f"{side}_input_ids"], tensors[f"{side}_attention_mask"] = input_ids * mask, mask
    tensors[PairFields.MARGIN] = torch.zeros(num_pairs)
    return Batch(tensors=tensors)


def update(engine: TrainingEngine, pairs: Batch, loss: BradleyTerryLoss) -> dict[str, float]:
    """One optimizer step over this rank's pairs, as ``RewardModelTrainWorker.update`` takes it."""
    engine.model.train()
    return engine.optimizer_step(pairs, loss)


def timed_step(engine: TrainingEngine, pairs: Batch, loss: BradleyTerryLoss) -> tuple[float, float]:
    """``(wall seconds of the slower rank, CPU seconds summed over ranks)`` of one optimizer step."""
    dist.barrier()
    start, start_cpu = time.perf_counter(), time.process_time()
    update(engine, pairs, loss)
    wall = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    cpu = torch.tensor([time.process_time() - start_cpu], dtype=torch.float64)
    dist.all_reduce(wall, op=dist.ReduceOp.MAX)
    dist.all_reduce(cpu, op=dist.ReduceOp.SUM)
    return float(wall), float(cpu)


def rank_main(rank: int, model_dir: str, port: int, global_pairs: int, ks: list[int], repeats: int, packed: bool,
              out_path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    from torch.distributed.device_mesh import init_device_mesh

    model = build_model(ModelConfig(path=model_dir), "reward_model")
    shard_model(model, init_device_mesh("cpu", (WORLD,)), ShardingOptions())
    optim = OptimConfig(lr=1e-6)
    optimizer = build_optimizer(model, optim)
    dp = DataParallelGroup(rank=rank, size=WORLD)
    engine = TrainingEngine(model, dp=dp, optimizer=optimizer, scheduler=build_scheduler(optimizer, optim, 10 ** 6),
                            hooks=[NoiseScaleMonitor(model, dp)])
    loss = BradleyTerryLoss(packed=packed)
    local = global_pairs // WORLD
    pairs = make_pairs(local, seed=rank)
    results = []
    for k in ks:
        micro = local // k
        engine.micro_batching = MicroBatching(micro_batch_size=micro)
        update(engine, pairs, loss)  # warm-up
        timings = [timed_step(engine, pairs, loss) for _ in range(repeats)]
        dist.barrier()
        with CollectiveCounter() as counter:
            update(engine, pairs, loss)
        counts = dict(sorted(counter.counts.items()))
        walls = [wall for wall, _ in timings]
        results.append({
            "K": k, "micro_pairs": micro, "global_pairs": global_pairs,
            "tokens_per_rank": int(pairs["chosen_attention_mask"].sum() + pairs["rejected_attention_mask"].sum()),
            "seconds_per_step": statistics.median(walls), "seconds_best": min(walls),
            "cpu_seconds_per_step": statistics.median(cpu for _, cpu in timings),
            "pairs_per_second": global_pairs / statistics.median(walls),
            "pairs_per_cpu_second": global_pairs / (statistics.median(cpu for _, cpu in timings) / WORLD),
            "collectives": counts,
            "gradient_reductions": sum(v for name, v in counts.items() if "reduce_scatter" in name),
            "all_reduces": sum(v for name, v in counts.items() if "all_reduce" in name),
        })
    if rank == 0:
        Path(out_path).write_text(json.dumps(results))
    dist.destroy_process_group()


def print_table(rows: list[dict]) -> None:
    print(f"{'K':>2} {'micro':>5} {'tok/rank':>8} | {'s/step':>7} {'best':>7} {'CPU s':>7} | {'pairs/s':>7} "
          f"{'vs K=1':>6} | {'pairs/CPU-s':>11} {'vs K=1':>6} | grad reductions/step (shard groups = {SHARD_GROUPS})"
          " | all-reduces")
    base, cpu_base = rows[0]["pairs_per_second"], rows[0]["pairs_per_cpu_second"]
    for row in rows:
        ok = "one per shard group" if row["gradient_reductions"] == SHARD_GROUPS else "NOT one per shard group"
        print(f"{row['K']:>2} {row['micro_pairs']:>5} {row['tokens_per_rank']:>8} | {row['seconds_per_step']:>7.3f} "
              f"{row['seconds_best']:>7.3f} {row['cpu_seconds_per_step']:>7.3f} | {row['pairs_per_second']:>7.2f} "
              f"{row['pairs_per_second'] / base:>6.2f} | {row['pairs_per_cpu_second']:>11.2f} "
              f"{row['pairs_per_cpu_second'] / cpu_base:>6.2f} | {row['gradient_reductions']:>3} ({ok}) | "
              f"{row['all_reduces']:>3}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=16, help="global pairs per optimizer step")
    parser.add_argument("--ks", default="1,2,4,8", help="accumulation steps K, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--packed", action="store_true", help="packed forward (model.use_remove_padding)")
    args = parser.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    for k in ks:
        if args.pairs % (WORLD * k):
            parser.error(f"--pairs {args.pairs} is not a multiple of {WORLD} ranks × K={k}")
    machine = hardware()
    with tempfile.TemporaryDirectory() as directory:
        model_dir = str(save_tiny_model(Path(directory) / "model", SPEC))
        out_path = str(Path(directory) / "rows.json")
        mp.start_processes(rank_main, args=(model_dir, find_free_port(), args.pairs, ks, args.repeats, args.packed,
                                            out_path), nprocs=WORLD, join=True, start_method="spawn")
        rows = json.loads(Path(out_path).read_text())
    machine["load_average_1m_at_end"] = os.getloadavg()[0]
    print(f"machine: {machine['cpu']}, {machine['logical_cpus']} logical CPUs, {WORLD} gloo ranks x 1 thread, "
          f"torch {machine['torch']}, load {machine['load_average_1m_at_start']:.1f} -> "
          f"{machine['load_average_1m_at_end']:.1f}; model: hidden {SPEC.hidden_size}, {SPEC.num_layers} layers + "
          f"scalar head ({SHARD_GROUPS} FSDP groups); {args.pairs} pairs/step, {'packed' if args.packed else 'padded'}")
    print_table(rows)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"hardware": machine, "spec": SPEC.__dict__, "packed": args.packed,
                                   "repeats": args.repeats, "rows": rows}, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
