"""How long does a weight sync into a standalone rollout pool take, per transport, against copying the model once?

    PYTHONPATH=. python benchmarks/pool_weight_sync.py [--size medium] [--syncs 5] [--rounds 2]

For each transport of ``rollout.weight_transfer`` — ``shared_memory`` (the trainer writes one host-shared copy that
the replica reads in place), ``object_store`` (the trainer puts its rows into Ray's object store and the replica
fetches them) and ``collective`` (the trainer sends its rows to the replica over a gloo group, TCP; NCCL on GPU) —
the last two are the cross-node transports, here on one node — a 1-rank FSDP2 trainer and a 1-rank vLLM (CPU) pool are
started as ``RLTrainer`` starts them, and ``Generation.sync_weights`` (publish on the trainer, load into the engine,
fingerprints checked) is timed ``--syncs`` times after one warm-up. The transports' order reverses round by round, in a
fresh pair of groups each, so a change of machine load hits them alike. The floor is ``copy M``: one
``dst.copy_(src)`` of the model's bytes in the engine's dtype, in this process; ``ratio = sync / copy M``.

``publish`` is the trainer's side (its copy of the rows and their fingerprints, and the call), ``load`` the
replica's as timed inside it (receiving or mapping, fingerprints, vLLM's load); the rest of a sync is the calls.
Every sync includes vLLM's own reload of the weights into its CPU model (the same work either way). Writes
``benchmarks/results/pool_weight_sync.json``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import common
import torch

from hybridrl.utils.tiny_model import TinyModelSpec, save_tiny_model

SIZES = {
    "tiny": TinyModelSpec(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=256),
    "medium": TinyModelSpec(hidden_size=512, num_layers=8, num_heads=16, num_kv_heads=4, intermediate_size=1408),
}
TRANSPORTS = ("shared_memory", "object_store", "collective")


def split_config(model_dir: Path, transport: str):
    from hybridrl.config import load_config

    return load_config([f"model.path={model_dir}", "model.dtype=bfloat16", "trainer.n_gpus_per_node=1",
                        "rollout=vllm_cpu", "rollout.n_gpus=1", f"rollout.weight_transfer={transport}",
                        "data.train_batch_size=4", "rollout.n=2", "actor.ppo_mini_batch_size=4",
                        "actor.ppo_micro_batch_size_per_gpu=4", "data.max_response_length=8",
                        "rollout.kv_cache_memory_mb=64"])


def time_syncs(runtime, model_dir: Path, transport: str, syncs: int) -> dict:
    """Start the trainer and the pool for ``transport``, sync once to warm up, then time ``syncs`` syncs."""
    from hybridrl.replicas import role_pools, start_generators
    from hybridrl.trainers.generation import Generation

    config = split_config(model_dir, transport)
    pools = role_pools(config)
    pools.create(runtime)
    generators = start_generators(config, pools, total_steps=10, with_reference=False)
    try:
        generation = Generation(generators.replicas, generators.transfer)
        generation.sync_weights()
        seconds, loads, publishes = [], [], []
        for _ in range(syncs):
            started = time.perf_counter()
            metrics = generation.sync_weights()
            seconds.append(time.perf_counter() - started)
            loads.append(metrics["weight_sync/seconds"])
            publishes.append(metrics["weight_sync/publish_seconds"])
        return {"sync_s": common.median(seconds), "best_sync_s": min(seconds), "load_s": common.median(loads),
                "publish_s": common.median(publishes), "fetched_bytes": metrics["weight_sync/bytes"]}
    finally:
        generators.shutdown()
        pools.release()


def copy_floor(model_dir: Path, repeats: int = 7) -> tuple[float, int]:
    """Best time of one in-memory copy of the model's bf16 bytes (one thread), and the byte count."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    numel = sum(param.numel() for param in model.parameters())
    source, target = torch.randn(numel).to(torch.bfloat16), torch.empty(numel, dtype=torch.bfloat16)
    torch.set_num_threads(1)
    target.copy_(source)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        target.copy_(source)
        best = min(best, time.perf_counter() - started)
    return best, numel * 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="medium", choices=sorted(SIZES))
    parser.add_argument("--syncs", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    from hybridrl.config.ray import RayConfig
    from hybridrl.runtime import start_ray

    machine = common.machine_info()
    with tempfile.TemporaryDirectory() as workdir:
        model_dir = save_tiny_model(Path(workdir) / "model", SIZES[args.size])
        floor_s, model_bytes = copy_floor(model_dir)
        runs: dict[str, list[dict]] = {transport: [] for transport in TRANSPORTS}
        with start_ray(RayConfig(num_cpus=4)) as runtime:
            for round_index in range(args.rounds):
                order = TRANSPORTS if round_index % 2 == 0 else TRANSPORTS[::-1]
                for transport in order:
                    runs[transport].append(time_syncs(runtime, model_dir, transport, args.syncs))
                    print(f"round {round_index + 1} {transport}: {runs[transport][-1]}", flush=True)
    rows = []
    for transport, results in runs.items():
        sync_s = common.median([result["sync_s"] for result in results])
        rows.append({"transport": transport, "sync_ms": 1e3 * sync_s, "load_ms": 1e3 * common.median(
            [result["load_s"] for result in results]), "publish_ms": 1e3 * common.median(
            [result["publish_s"] for result in results]), "ratio_to_copy": sync_s / floor_s,
            "fetched_MB": results[-1]["fetched_bytes"] / 2**20})
    print(f"\nmodel {args.size}: {model_bytes / 2**20:.1f} MiB in bf16; copy M = {1e3 * floor_s:.2f} ms "
          f"(best of 7, one thread); load average at start {machine['load_average_1m_5m_15m_at_start']}")
    for row in rows:
        print(f"{row['transport']:>14}: sync {row['sync_ms']:8.1f} ms (publish {row['publish_ms']:6.1f} ms as the "
              f"controller waits for it, load on the replica {row['load_ms']:7.1f} ms), "
              f"{row['ratio_to_copy']:6.1f}x one copy, fetched {row['fetched_MB']:.1f} MiB")
    common.write_json("pool_weight_sync", {"machine": machine, "size": args.size, "model_bytes": model_bytes,
                                              "copy_floor_s": floor_s, "rows": rows, "runs": runs})


if __name__ == "__main__":
    main()
