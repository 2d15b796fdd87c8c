"""How much does moving a Batch through Ray cost, compared with copying its bytes in process?

Builds a Batch of ``B x T`` tensors (int64 ``input_ids``, int64 ``attention_mask``, float32 ``old_log_probs``,
bfloat16 ``ref_log_probs``) plus one string per sample, and times each method ``--repeats`` times after a warm-up
(median and best are reported: the object store is noisy on a small machine):

- ``torch.clone``        — cloning every tensor in process: the floor, one memcpy of the bytes;
- ``pickle5 round trip`` — ``pickle.dumps(protocol=5, buffer_callback)`` + ``loads``: the Batch's own encoding cost;
- ``ray.put + ray.get``  — through the local object store in the same process (store copy in, one copy out);
- ``ray task round trip`` — the Batch as the argument of a task in a worker process that returns ``len(batch)``:
  what a controller-to-worker dispatch pays.

The ratio column is each median over the ``torch.clone`` median. Writes ``benchmarks/results/batch_transfer.json``.

Run from the repository root: ``PYTHONPATH=. python benchmarks/batch_transfer.py [--batch-size 512 --seq-len 2048]``
(``PYTHONPATH`` is not needed once the package is installed with ``pip install -e .``).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import time
from collections.abc import Callable
from pathlib import Path

for _name, _value in (
    ("RAY_AUTH_MODE", "disabled"),
    ("RAY_USAGE_STATS_ENABLED", "0"),
    ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0"),
):
    os.environ.setdefault(_name, _value)

import ray  # noqa: E402
import torch  # noqa: E402

from hybridrl.protocol import Batch, Fields  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "batch_transfer.json"


def build_batch(batch_size: int, seq_len: int) -> Batch:
    """A rollout-shaped Batch: ``[B, T]`` int64 ids and mask, ``[B, T]`` float32 and bfloat16 log-probs, B strings."""
    generator = torch.Generator().manual_seed(0)
    return Batch(
        tensors={
            Fields.INPUT_IDS: torch.randint(0, 50_000, (batch_size, seq_len), generator=generator),
            Fields.ATTENTION_MASK: torch.ones(batch_size, seq_len, dtype=torch.int64),
            Fields.OLD_LOG_PROBS: torch.randn(batch_size, seq_len, generator=generator),
            Fields.REF_LOG_PROBS: torch.randn(batch_size, seq_len, generator=generator).bfloat16(),
        },
        non_tensors={Fields.UID: [f"prompt-{i}" for i in range(batch_size)]},
        meta={"temperature": 1.0},
    )


def time_seconds(action: Callable[[], object], repeats: int) -> dict[str, float]:
    """Median and best wall time of ``action`` in seconds over ``repeats`` runs, after one warm-up run."""
    action()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return {"median": statistics.median(times), "best": min(times)}


def pickle_round_trip(batch: Batch) -> Batch:
    buffers: list[pickle.PickleBuffer] = []
    stream = pickle.dumps(batch, protocol=5, buffer_callback=buffers.append)
    return pickle.loads(stream, buffers=buffers)


@ray.remote
def batch_length(batch: Batch) -> int:
    return len(batch)


def measure(batch: Batch, repeats: int) -> dict[str, dict[str, float]]:
    """Median and best seconds per method (see the module docstring)."""
    return {
        "torch.clone": time_seconds(lambda: [t.clone() for t in batch.tensors.values()], repeats),
        "pickle5 round trip": time_seconds(lambda: pickle_round_trip(batch), repeats),
        "ray.put + ray.get": time_seconds(lambda: ray.get(ray.put(batch)), repeats),
        "ray task round trip": time_seconds(lambda: ray.get(batch_length.remote(batch)), repeats),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()

    torch.set_num_threads(1)
    batch = build_batch(args.batch_size, args.seq_len)
    ray.init(
        address="local", num_cpus=1, include_dashboard=False, object_store_memory=512 * 2**20, logging_level="warning"
    )
    try:
        seconds = measure(batch, args.repeats)
    finally:
        ray.shutdown()

    megabytes = batch.nbytes / 2**20
    baseline = seconds["torch.clone"]["median"]
    ratios = {name: value["median"] / baseline for name, value in seconds.items()}
    print(f"Batch {args.batch_size} x {args.seq_len}: {megabytes:.1f} MiB of tensors, {args.repeats} repeats")
    print(f"{'method':<22}{'median ms':>11}{'best ms':>10}{'GiB/s':>8}{'x clone':>9}")
    for name, value in seconds.items():
        median, best = value["median"], value["best"]
        gib_per_s = megabytes / 1024 / median
        print(f"{name:<22}{median * 1e3:>11.1f}{best * 1e3:>10.1f}{gib_per_s:>8.2f}{ratios[name]:>9.2f}")

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "batch_size": args.batch_size,
        "seq_len": args.seq_len,
        "repeats": args.repeats,
        "tensor_bytes": batch.nbytes,
        "seconds": seconds,
        "median_ratio_to_clone": ratios,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
    }
    RESULTS.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
