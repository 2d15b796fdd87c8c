"""hybridrl's side of ``vs_trl.py``: GRPO for a few steps from a JSON spec; writes per-step figures as JSON.

    python benchmarks/vs_trl_hybridrl.py SPEC.json OUT.json     (run by vs_trl.py in a subprocess of its own)

The whole stack runs as a user would run it (``RLTrainer.fit``: Ray controller, FSDP2 actor on ``dp`` CPU ranks,
colocated HF or vLLM rollout). Step wall time = the interval between the ends of consecutive ``train_step`` calls
(the first from the start of the training loop), so it includes the loop's own overhead, as TRL's figure does.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import common

_DTYPES = {"bf16": "bfloat16", "fp32": "float32"}


def overrides(spec: dict, run_dir: Path) -> list[str]:
    """The hybridrl config for ``spec``: same batch, lengths, LR, sampling and precision as the TRL side."""
    dp = spec["dp"]
    if spec["micro_batch"] % dp:
        raise ValueError(f"micro_batch={spec['micro_batch']} (sequences per machine-wide micro-step) must divide by "
                         f"dp={dp}")
    rollout = ["rollout=vllm_cpu"] if spec["rollout"] == "vllm" else ["rollout=hf"]  # the preset's KV budget: auto
    return [
        f"model.path={spec['model_path']}", f"model.dtype={_DTYPES[spec['precision']]}",
        f"data.train_files=[{spec['train_file']}]", "data.synthetic_task=null", "data.val_files=[]", "data.shuffle=false",
        f"data.max_prompt_length={spec['max_prompt_length']}", f"data.max_response_length={spec['max_response_length']}",
        f"data.train_batch_size={spec['prompts']}",
        *rollout, f"rollout.n={spec['n']}", f"rollout.temperature={spec['temperature']}",
        "algorithm.adv_estimator=grpo", "actor.use_kl_loss=false", "actor.loss_agg_mode=token-mean",
        f"actor.ppo_mini_batch_size={spec['prompts']}", f"actor.ppo_micro_batch_size_per_gpu={spec['micro_batch'] // dp}",
        f"actor.optim.lr={spec['lr']}", "actor.optim.weight_decay=0.0", "actor.grad_clip=1.0",
        f"custom_reward_function.path={spec['reward_file']}",
        f"trainer.total_training_steps={spec['steps']}", "trainer.val_before_train=false", "trainer.test_freq=-1",
        "trainer.save_at_end=false", "trainer.logger=[jsonl]", "trainer.resume_mode=disable",
        f"trainer.default_local_dir={run_dir}", "trainer.device=cpu", f"trainer.n_gpus_per_node={dp}",
        f"trainer.seed={spec['seed']}", *spec.get("hybridrl_overrides", []),
    ]


def run(spec: dict, out: Path) -> dict:
    from hybridrl.config import load_config
    from hybridrl.trainers.rl_trainer import RLTrainer
    from hybridrl.utils.tracking import read_metrics

    run_dir = out.parent / (out.stem + "_run")
    trainer = RLTrainer(load_config(overrides(spec, run_dir)))
    started = time.perf_counter()
    step_s = common.fit_with_step_clock(trainer)
    rows = read_metrics(run_dir)
    rows_per_step = spec["prompts"] * spec["n"]
    return {
        "side": f"hybridrl-{spec['rollout']}", "total_s": time.perf_counter() - started,
        "step_s": step_s,
        "reward": [row["critic/score/mean"] for row in rows],
        "generated_tokens": [row["response_length/mean"] * rows_per_step for row in rows],
        "trained_tokens": [row["perf/throughput_tokens_per_s"] * row["timing/step"] for row in rows],
        "phases": [{key[len("timing/"):]: value for key, value in row.items() if key.startswith("timing/")}
                   for row in rows],
        "precision": f"{_DTYPES[spec['precision']]} compute (FSDP2 mixed precision, fp32 master weights and grads)"
        if spec["precision"] == "bf16" else "float32", "dp": spec["dp"],
    }


def main() -> None:
    spec_path, out = Path(sys.argv[1]), Path(sys.argv[2])
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    result = run(json.loads(spec_path.read_text()), out)
    out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
