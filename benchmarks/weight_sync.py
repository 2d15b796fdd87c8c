"""How long does a weight sync (FSDP2 training layout → rollout layout) take, compared with copying the model once?

For each model size, a tiny Llama is saved, loaded on 2 gloo processes and sharded with FSDP2 (fp32 master), and
every rank drains ``WeightResharder.stream()`` (cast to bf16 on the way) for:

- ``t_g=1 gather`` — full tensors via in-place all-gathers, one per parameter (``method="gather"``);
- ``t_g=1 plan``   — full tensors via the point-to-point plan (same bytes; the default, ``method="auto"``);
- ``t_g=2 plan``   — each rank receives its TP slices only (the 3D-HybridEngine case);
- ``… checked``     — the same with ``rollout.verify_weight_sync``: fingerprints on both sides and the comparison
  (``WeightResharder.stream(checked=True)`` + ``verify()``), so ``checked ÷ unchecked`` is the check's share.

The sync time of one repeat is the slowest rank's time (ranks start together after a barrier); the median and best
of ``--repeats`` (after one warm-up) are reported. The floor is ``copy M``: ``dst.copy_(src)`` of the model's bf16
bytes M in one process with one thread (each rank also has one thread), so ``ratio = sync / copy M`` (1 = a single
memcpy of the whole model; t_g=2 ranks each hold M/2, so their ratio can approach 0.5 only if the wire were free);
``best/best`` divides the best sync by the best copy (less sensitive to other load on a shared machine).
The consumer does nothing with the tensors (``update_weights`` cost is the engine's, not measured here).

Writes ``benchmarks/results/weight_sync.json``. Run from the repository root:
``PYTHONPATH=. python benchmarks/weight_sync.py [--sizes tiny,medium,large] [--bucket-mb 256,16] [--repeats 5]``.
"""

from __future__ import annotations

import argparse
import itertools
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

from hybridrl.hybrid_engine import WeightResharder, bucket_bytes_from_mb
from hybridrl.utils.distributed import find_free_port
from hybridrl.utils.tiny_model import TinyModelSpec, save_tiny_model

RESULTS = Path(__file__).resolve().parent / "results" / "weight_sync.json"
WORLD = 2
SIZES = {
    "tiny": TinyModelSpec(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=256),
    "medium": TinyModelSpec(hidden_size=512, num_layers=8, num_heads=16, num_kv_heads=4, intermediate_size=1408),
    "large": TinyModelSpec(hidden_size=1024, num_layers=8, num_heads=32, num_kv_heads=8, intermediate_size=2816),
}
CONFIGS = (("t_g=1 gather", 1, "gather", False), ("t_g=1 plan", 1, "plan", False),
           ("t_g=1 checked", 1, "plan", True), ("t_g=2 plan", 2, "plan", False), ("t_g=2 checked", 2, "plan", True),
           ("t_g=1 shared", 1, "shared", False), ("t_g=1 sh+check", 1, "shared", True),
           ("t_g=2 shared", 2, "shared", False), ("t_g=2 sh+check", 2, "shared", True))


def time_copy(nbytes: int, repeats: int) -> dict[str, float]:
    """Median/best seconds of one in-memory copy of ``nbytes`` (bf16), one thread: the physical floor."""
    torch.set_num_threads(1)
    src = torch.randn(nbytes // 2).to(torch.bfloat16)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - start)
    return {"median": statistics.median(times), "best": min(times)}


def time_sync(resharder: WeightResharder, repeats: int, checked: bool = False) -> dict[str, float]:
    """Median/best over repeats of the slowest rank's time to drain one stream (after one warm-up); ``checked``:
    with the fingerprints and their comparison."""
    times = []
    for repeat in range(repeats + 1):
        dist.barrier()
        start = time.perf_counter()
        for _name, _tensor in resharder.stream(checked):
            pass
        if checked:
            resharder.verify()
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        if repeat:
            times.append(float(elapsed))
    return {"median": statistics.median(times), "best": min(times)}


def rank_main(rank: int, port: int, model_dir: str, bucket_mbs: list[float], repeats: int, out_path: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoModelForCausalLM

    from hybridrl.modeling.fsdp import ShardingOptions, shard_model

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        model = shard_model(AutoModelForCausalLM.from_pretrained(model_dir), init_device_mesh("cpu", (WORLD,)),
                            ShardingOptions())
        rows = []
        for (label, tp_size, method, checked), bucket_mb in itertools.product(CONFIGS, bucket_mbs):
            resharder = WeightResharder(model, tp_size=tp_size, bucket_bytes=bucket_bytes_from_mb(bucket_mb),
                                        dtype=torch.bfloat16, method=method)
            timing = time_sync(resharder, repeats, checked)
            stats = resharder.last_stats
            rows.append(dict(config=label, tp_size=tp_size, method=method, bucket_mb=bucket_mb, seconds=timing,
                             received_bytes=stats.received_bytes, sent_bytes=stats.sent_bytes,
                             peak_buffer_bytes=stats.peak_buffer_bytes, bound_bytes=resharder.buffer_bound_bytes,
                             buckets=stats.num_buckets, messages=stats.num_messages,
                             model_bytes=resharder.plan.total_bytes()))
            resharder.close()
        if rank == 0:
            Path(out_path).write_text(json.dumps(rows))
    finally:
        dist.destroy_process_group()


def bench_size(name: str, spec: TinyModelSpec, bucket_mbs: list[float], repeats: int, workdir: Path) -> dict:
    model_dir = save_tiny_model(workdir / name, spec)
    out_path = workdir / f"{name}.json"
    mp.start_processes(rank_main, args=(find_free_port(), str(model_dir), bucket_mbs, repeats, str(out_path)),
                       nprocs=WORLD, join=True, start_method="spawn")
    rows = json.loads(out_path.read_text())
    model_bytes = rows[0]["model_bytes"]
    copy = time_copy(model_bytes, max(repeats, 5))
    for row in rows:
        row["ratio_to_copy"] = row["seconds"]["median"] / copy["median"]
        row["ratio_best_to_best"] = row["seconds"]["best"] / copy["best"]
    return dict(size=name, spec=vars(spec), model_bytes_bf16=model_bytes, copy_seconds=copy, syncs=rows)


def print_table(results: list[dict]) -> None:
    header = (f"{'model':<8} {'M (MB)':>8} {'config':<14} {'bucket':>7} {'sync ms':>9} {'copy M ms':>9} "
              f"{'ratio':>7} {'best/best':>9} {'recv MB/rank':>12} {'peak buf MB':>11} {'buckets':>7} {'msgs':>5}")
    print(header)
    print("-" * len(header))
    for result in results:
        copy_ms = result["copy_seconds"]["median"] * 1e3
        for row in result["syncs"]:
            print(f"{result['size']:<8} {result['model_bytes_bf16'] / 1e6:>8.1f} {row['config']:<14} "
                  f"{row['bucket_mb']:>5g}MB "
                  f"{row['seconds']['median'] * 1e3:>9.2f} {copy_ms:>9.2f} "
                  f"{row['ratio_to_copy']:>7.1f} {row['ratio_best_to_best']:>9.1f} "
                  f"{row['received_bytes'] / 1e6:>12.2f} {row['peak_buffer_bytes'] / 1e6:>11.2f} "
                  f"{row['buckets']:>7} {row['messages']:>5}")


def hardware() -> dict:
    cpu = "unknown"
    if Path("/proc/cpuinfo").exists():
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), cpu)
    return dict(cpu=cpu, logical_cpus=os.cpu_count(), platform=platform.platform(), torch=torch.__version__,
                backend="gloo (CPU, loopback)", ranks=WORLD, threads_per_rank=1,
                load_average_at_start=os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="tiny,medium", help=f"comma-separated subset of {sorted(SIZES)}")
    parser.add_argument("--bucket-mb", default="256,16", help="comma-separated rollout.weight_sync_bucket_mb values")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    bucket_mbs = [float(value) for value in args.bucket_mb.split(",")]
    machine = hardware()
    with tempfile.TemporaryDirectory() as workdir:
        results = [bench_size(name, SIZES[name], bucket_mbs, args.repeats, Path(workdir))
                   for name in args.sizes.split(",")]
    print(f"hardware: {machine['cpu']}, {machine['logical_cpus']} CPUs, {WORLD} gloo ranks × 1 thread, "
          f"torch {machine['torch']}, load average at start {machine['load_average_at_start'][0]:.1f}; "
          f"fp32 master → bf16 on the wire; bucket in MiB")
    print_table(results)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(dict(hardware=machine, bucket_mb=bucket_mbs, repeats=args.repeats,
                                       results=results), indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
