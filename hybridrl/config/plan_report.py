"""A human-readable account of how a config's batches are cut: what the worker will actually do per step."""

from __future__ import annotations

from typing import Any

from hybridrl.config.schema import TrainConfig
from hybridrl.config.sizes import role_plan, trained_rows_per_prompt


def batch_plan_report(config: TrainConfig, include_critic: bool) -> str:
    """Lines like ``actor: 64 prompts × 4 = 256 seq/step → 4 optimizer steps of 64 seq; per rank 32 = 8 micro × 4``."""
    lines = []
    per_prompt = trained_rows_per_prompt(config)
    sequences_per_step = config.data.train_batch_size * per_prompt
    for role in ["actor"] + (["critic"] if include_critic else []):
        plan = role_plan(config, role)
        if plan.auto_micro_batch:
            sizing = getattr(config, role).micro_batch_sizing
            budget = "the free device memory" if sizing.memory_budget_mb is None else f"{sizing.memory_budget_mb} MiB"
            per_rank = (f"micro-batch sized from memory at start-up (auto: largest fitting {budget} with "
                        f"{sizing.headroom:.0%} headroom) × the accumulation steps that follow")
        elif plan.grad_accum_steps is None:
            per_rank = f"token budget {getattr(config, role).ppo_max_token_len_per_gpu} tokens per micro-batch"
        else:
            per_rank = f"{plan.micro_batch_size_per_gpu} per micro-batch × {plan.grad_accum_steps} accumulation steps"
        lines.append(
            f"# {role}: {config.data.train_batch_size} prompts × {_per_prompt_words(config, per_prompt)} = {sequences_per_step} "
            "sequences per step"
            f" → {plan.num_mini_batches} optimizer step(s) per epoch of {plan.mini_batch_sequences} sequences;"
            f" per rank ({plan.num_data_parallel_ranks} ranks{_split_words(config, role)}) "
            f"{plan.local_mini_batch_sequences} = {per_rank}"
        )
    return "\n".join(lines)


def _split_words(config: Any, role: str) -> str:
    sp = getattr(config, role).ulysses_sequence_parallel_size
    return f", each a group of {sp} devices splitting its sequences" if sp > 1 else ""


def job_plan_report(config: Any, unit: str) -> str:
    """The SFT / reward-model trainers' one line (their configs have no rollout and no critic): ``unit`` per
    optimizer step, then per rank ``micro × accumulation``. ``validate_*_config`` has checked the sizes divide."""
    data, trainer = config.data, config.trainer
    devices = trainer.nnodes * trainer.n_gpus_per_node
    per_rank = data.train_batch_size // devices
    return (f"# {data.train_batch_size} {unit} per optimizer step; per rank ({devices} ranks) {per_rank} = "
            f"{data.micro_batch_size_per_gpu} per micro-batch × {per_rank // data.micro_batch_size_per_gpu} "
            "accumulation steps")


def _per_prompt_words(config: TrainConfig, per_prompt: int) -> str:
    """``n=4``, or ``n=4 × 2 sequences per episode`` when an agent's episodes take several rows."""
    if per_prompt == config.rollout.n:
        return f"n={config.rollout.n}"
    return f"n={config.rollout.n} × {per_prompt // config.rollout.n} sequences per episode"
