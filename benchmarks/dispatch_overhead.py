"""Dispatch overhead: what a controller pays to send a batch through a worker group and get it back.

For each size, a Batch of ``B`` sequences × ``T`` tokens (``input_ids`` int64 and ``log_probs`` float32, i.e.
``12 · B · T`` bytes) goes through ``group.call(Echo.echo, batch)`` on a 2-worker CPU group whose method returns its
chunk unchanged (``DP_SPLIT``: pad/chunk, object store in, worker, object store out, concat). The baseline is copying
the same bytes in-process (``torch.clone`` of both tensors). Also measured: the fixed cost of an empty ``ONE_TO_ALL``
call, and worker-group start-up (2 Ray actors + gloo process group + device meshes).

Run: ``python benchmarks/dispatch_overhead.py [--repeats N] [--quick]``. Prints a table and writes
``benchmarks/results/dispatch_overhead.json``. Reading it: ``ratio`` = round trip ÷ in-process copy. On one machine
the round trip moves each byte several times (serialise into the object store, copy out in the worker — Ray's
buffers are read-only —, store the result, copy out and concatenate on the driver), and every ``ray.put`` also has a
fixed cost of a few milliseconds on a small machine, so small batches show ratios in the hundreds and the ratio
falls as batches grow. The empty-call time is the floor of any call.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing

import torch  # noqa: E402

from hybridrl.config.ray import RayConfig  # noqa: E402
from hybridrl.runtime import (PoolSpec, ResourcePool, Worker, WorkerGroup, dp_split, one_to_all,  # noqa: E402
                                 start_ray)
from hybridrl.protocol import Batch  # noqa: E402

SIZES = [(256, 1024), (256, 2048), (1024, 1024), (1024, 2048)]
RESULTS = REPO / "benchmarks" / "results" / "dispatch_overhead.json"


class Echo(Worker):
    """A worker whose methods do nothing, so only dispatch is timed."""

    @dp_split
    def echo(self, batch: Batch) -> Batch:
        return batch

    @one_to_all
    def ping(self) -> None:
        return None


def make_batch(batch_size: int, seq_len: int) -> Batch:
    return Batch(tensors={
        "input_ids": torch.randint(0, 50_000, (batch_size, seq_len), dtype=torch.int64),
        "log_probs": torch.randn(batch_size, seq_len, dtype=torch.float32),
    })


def median_seconds(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_startup(runtime: Any, repeats: int) -> dict[str, float]:
    """Seconds from nothing to a usable 2-worker group (placement group, actors, gloo init, meshes)."""
    times = []
    for attempt in range(repeats):
        start = time.perf_counter()
        pool = ResourcePool.create(PoolSpec(f"startup{attempt}", devices_per_node=2, device="cpu"), runtime)
        group = WorkerGroup(Echo, pool, name="echo")
        group.call(Echo.ping)
        times.append(time.perf_counter() - start)
        group.shutdown()
        pool.release()
    return {"median_s": statistics.median(times), "min_s": min(times), "runs": len(times)}


def measure_sizes(group: WorkerGroup[Echo], sizes: list[tuple[int, int]], repeats: int) -> list[dict[str, Any]]:
    rows = []
    for batch_size, seq_len in sizes:
        batch = make_batch(batch_size, seq_len)
        out = group.call(Echo.echo, batch)
        assert torch.equal(out["input_ids"], batch["input_ids"]) and torch.equal(out["log_probs"], batch["log_probs"])
        round_trip = median_seconds(lambda: group.call(Echo.echo, batch), repeats)
        copy = median_seconds(lambda: [t.clone() for t in batch.tensors.values()], repeats * 4)
        nbytes = batch.nbytes
        rows.append({"batch_size": batch_size, "seq_len": seq_len, "megabytes": nbytes / 2**20,
                     "round_trip_ms": round_trip * 1e3, "clone_ms": copy * 1e3, "ratio": round_trip / copy,
                     "round_trip_gb_per_s": nbytes / round_trip / 1e9})
    return rows


def print_table(startup: dict[str, float], ping_ms: float, rows: list[dict[str, Any]]) -> None:
    print(f"\nworker-group start-up (2 workers, gloo init, meshes): median {startup['median_s']:.2f} s, "
          f"min {startup['min_s']:.2f} s over {startup['runs']} runs")
    print(f"empty ONE_TO_ALL call on 2 workers: {ping_ms:.2f} ms\n")
    header = f"{'B':>6} {'T':>6} {'MiB':>8} {'round trip ms':>14} {'clone ms':>10} {'ratio':>7} {'GB/s':>7}"
    print(header)
    print("-" * len(header))
    for row in rows:
        print(f"{row['batch_size']:>6} {row['seq_len']:>6} {row['megabytes']:>8.1f} {row['round_trip_ms']:>14.1f} "
              f"{row['clone_ms']:>10.2f} {row['ratio']:>7.1f} {row['round_trip_gb_per_s']:>7.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed repetitions per size (median reported)")
    parser.add_argument("--quick", action="store_true", help="smallest size only, 3 repeats (a smoke run)")
    options = parser.parse_args()
    sizes, repeats = (SIZES[:1], 3) if options.quick else (SIZES, options.repeats)
    torch.set_num_threads(1)
    with start_ray(RayConfig(num_cpus=4, object_store_memory_mb=400)) as runtime:
        startup = measure_startup(runtime, repeats=2 if options.quick else 3)
        pool = ResourcePool.create(PoolSpec("bench", devices_per_node=2, device="cpu"), runtime)
        with WorkerGroup(Echo, pool, name="echo") as group:
            ping_ms = median_seconds(lambda: group.call(Echo.ping), repeats * 5) * 1e3
            rows = measure_sizes(group, sizes, repeats)
        pool.release()
    print_table(startup, ping_ms, rows)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "benchmark": "dispatch_overhead", "workers": 2, "device": "cpu", "repeats": repeats,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__},
        "startup": startup, "empty_call_ms": ping_ms, "sizes": rows,
    }, indent=2))
    print(f"\nwrote {RESULTS.relative_to(REPO)}")


if __name__ == "__main__":
    main()
