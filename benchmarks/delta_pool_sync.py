"""A delta weight sync beside a whole one, in one run: real replicas, real updates, the same model and steps.

    bash recipes/setup_smollm2.sh          # once: models/smollm2-135m-instruct (bf16, from the local wheel)
    .venv/bin/python benchmarks/delta_pool_sync.py [--model models/smollm2-135m-instruct] [--steps 10] [--lr 1e-6]

Two trainer + replica pairs live side by side in one Ray instance (a 1-rank FSDP2 trainer and a 1-rank vLLM CPU
replica each, ``rollout.weight_transfer=object_store``, bf16): one with ``rollout.weight_delta=true``, one without.
Each step, for each pair — the order alternating step by step — the replica generates a batch, the trainer takes a
policy-gradient step on it (fixed advantages, AdamW at ``--lr``: the update an RL step makes) and the weights are
synced into the replica through ``Generation.sync_weights``, timed as the controller waits for it, with the bytes
the replica fetched. Every load is checked against the trainer's fingerprints (``rollout.verify_weight_sync``): a
wrong delta would stop the run naming the parameter. The first sync of the delta pair is whole (nothing to diff);
its later ones are deltas unless over half the values changed.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

import common

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["What is 12 + 34?", "Name a prime number above 50.", "What is 7 times 8?", "Spell 'delta' backwards."]


def pair_config(model_dir: Path, delta: bool, lr: float):
    from hybridrl.config import load_config

    return load_config([f"model.path={model_dir}", "model.dtype=bfloat16", "trainer.n_gpus_per_node=1",
                        "rollout=vllm_cpu", "rollout.n_gpus=1", "rollout.weight_transfer=object_store",
                        f"rollout.weight_delta={str(delta).lower()}", "rollout.weight_delta_full_every=1000",
                        "data.train_batch_size=4", "rollout.n=2", "actor.ppo_mini_batch_size=4",
                        "actor.ppo_micro_batch_size_per_gpu=4", f"actor.optim.lr={lr}",
                        "data.max_response_length=16", "rollout.kv_cache_memory_mb=256"])


def prompt_batch(model_dir: Path):
    from transformers import AutoTokenizer

    from hybridrl.protocol import Batch, Fields
    from hybridrl.utils.tiny_model import encode_chat

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    encoded = tokenizer.pad({"input_ids": encode_chat(tokenizer, PROMPTS)}, return_tensors="pt")
    return Batch(tensors={Fields.INPUT_IDS: encoded["input_ids"], Fields.ATTENTION_MASK: encoded["attention_mask"]},
                 non_tensors={Fields.UID: [f"p{index}" for index in range(len(PROMPTS))]})


class Pair:
    """A started trainer + replica (``hybridrl.replicas.start_generators``) and its ``Generation``."""

    def __init__(self, runtime, config) -> None:
        from hybridrl.replicas import role_pools, start_generators
        from hybridrl.trainers.generation import Generation

        self.pools = role_pools(config)
        self.pools.create(runtime)
        self.generators = start_generators(config, self.pools, total_steps=100, with_reference=False)
        self.generation = Generation(self.generators.replicas, self.generators.transfer)

    def step(self, prompts, step: int, seed: int) -> dict:
        """Generate, update the trainer, sync; the sync's controller-side seconds and the bytes fetched."""
        from hybridrl.protocol import Fields
        from hybridrl.rollout.base import SamplingParams
        from hybridrl.workers.actor_worker import ActorRolloutRefWorker

        actor = self.generators.actor
        rollout = self.generation.generate(prompts, SamplingParams(n=2, max_new_tokens=16, temperature=1.0,
                                                                   seed=seed))
        rollout = rollout.union(actor.call(ActorRolloutRefWorker.compute_log_prob, rollout, 1.0).select(
            Fields.OLD_LOG_PROBS))
        width = rollout[Fields.RESPONSES].shape[1]
        rollout[Fields.ADVANTAGES] = torch.linspace(-1, 1, len(rollout)).unsqueeze(1).expand(
            len(rollout), width).contiguous()
        actor.call(ActorRolloutRefWorker.update_actor, rollout, step=step, temperature=1.0)
        started = time.perf_counter()
        metrics = self.generation.sync_weights(step + 1)
        return {"sync_s": time.perf_counter() - started, "fetched_bytes": metrics["weight_sync/bytes"],
                "load_s": metrics["weight_sync/seconds"], "publish_s": metrics["weight_sync/publish_seconds"],
                "delivered_bytes": metrics["weight_sync/delivered_bytes"]}

    def close(self) -> None:
        self.generators.shutdown()
        self.pools.release()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "smollm2-135m-instruct")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--object-store-mb", type=int, default=2048,
                        help="the local Ray instance's object store (trainer.ray.object_store_memory_mb; its default, "
                             "200 MiB, is smaller than one whole publication of SmolLM2: 269 MB)")
    args = parser.parse_args()
    if not (args.model / "config.json").is_file():
        raise SystemExit(f"{args.model}: no model here; run `bash recipes/setup_smollm2.sh` first (or --model DIR)")
    from hybridrl.config.ray import RayConfig
    from hybridrl.runtime import start_ray

    machine = common.machine_info()
    prompts = prompt_batch(args.model)
    steps: dict[str, list[dict]] = {"delta": [], "whole": []}
    with start_ray(RayConfig(num_cpus=4, object_store_memory_mb=args.object_store_mb)) as runtime:
        pairs = {"delta": Pair(runtime, pair_config(args.model, True, args.lr)),
                 "whole": Pair(runtime, pair_config(args.model, False, args.lr))}
        try:
            for step in range(args.steps):
                order = ("delta", "whole") if step % 2 == 0 else ("whole", "delta")
                for name in order:
                    steps[name].append(pairs[name].step(prompts, step, seed=1000 + step))
                print(f"step {step + 1}: " + "; ".join(
                    f"{name} {1e3 * steps[name][-1]['sync_s']:7.1f} ms, {steps[name][-1]['fetched_bytes'] / 1e6:7.2f} MB"
                    for name in ("delta", "whole")), flush=True)
        finally:
            for pair in pairs.values():
                pair.close()
    report(steps, machine, args)


def report(steps: dict[str, list[dict]], machine: dict, args) -> None:
    """Medians over the steps after the first (the delta pair's first sync is whole by design)."""
    later = {name: results[1:] for name, results in steps.items()}
    medians = {name: {key: common.median([result[key] for result in results]) for key in results[0]}
               for name, results in later.items()}
    delta, whole = medians["delta"], medians["whole"]
    print(f"\n{args.model.name}, bf16, lr {args.lr:g}, {args.steps} steps, steps 2-{args.steps} (medians): "
          f"delta sync {1e3 * delta['sync_s']:.1f} ms against whole {1e3 * whole['sync_s']:.1f} ms "
          f"({delta['sync_s'] / whole['sync_s']:.2f}x); bytes fetched {delta['fetched_bytes'] / 1e6:.2f} MB against "
          f"{whole['fetched_bytes'] / 1e6:.2f} MB ({100 * delta['fetched_bytes'] / whole['fetched_bytes']:.2f} %); "
          f"publish {1e3 * delta['publish_s']:.1f} / {1e3 * whole['publish_s']:.1f} ms, replica's load "
          f"{1e3 * delta['load_s']:.1f} / {1e3 * whole['load_s']:.1f} ms; object store {args.object_store_mb} MiB; "
          f"load average at start "
          f"{machine['load_average_1m_5m_15m_at_start']}")
    common.write_json("delta_pool_sync", {"machine": machine, "model": str(args.model), "lr": args.lr,
                                             "object_store_mb": args.object_store_mb,
                                             "steps": steps, "medians_after_first": medians})


if __name__ == "__main__":
    main()
