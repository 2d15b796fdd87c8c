"""Derived batch sizes — computed from the config, never written back into it (docs/architecture.md §3).

Algorithm sizes are global and counted in prompts; the worker multiplies by the rows a prompt brings
(:func:`trained_rows_per_prompt`: ``rollout.n``, times ``rollout.multi_turn.agent_max_sequences`` for a user's agent)
and divides by the number of data-parallel ranks. The identity ``global sequences = micro × accumulation × world`` must hold exactly, or the
config is refused: a silently rounded mini-batch changes the optimisation, not just the speed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Union

from hybridrl.config.errors import ConfigError
from hybridrl.config.schema import TrainConfig

# ``*.ppo_micro_batch_size_per_gpu: auto``: the worker sizes the micro-batch from memory when it starts.
AUTO_MICRO_BATCH = "auto"


@dataclass(frozen=True)
class BatchPlan:
    """How one role's optimizer steps are cut into per-device micro-batches.

    Attributes:
        num_data_parallel_ranks: ranks that each hold a distinct slice of the mini-batch.
        num_mini_batches: optimizer steps per PPO epoch (``train_batch_size // ppo_mini_batch_size``).
        mini_batch_sequences: sequences per optimizer step over all ranks (prompts × n).
        local_mini_batch_sequences: sequences per optimizer step on one rank.
        micro_batch_size_per_gpu: sequences per forward/backward, or ``None`` under a token budget.
        grad_accum_steps: micro-batches per optimizer step on one rank, or ``None`` under a token budget
            (then the count varies per mini-batch and is chosen by the partitioner).
        auto_micro_batch: the micro-batch is ``auto``: ``None`` (with ``grad_accum_steps``) until the worker sizes it
            from memory and calls :meth:`with_micro_batch_size`.
    """

    num_data_parallel_ranks: int
    num_mini_batches: int
    mini_batch_sequences: int
    local_mini_batch_sequences: int
    micro_batch_size_per_gpu: Optional[int]
    grad_accum_steps: Optional[int]
    auto_micro_batch: bool = False

    def with_micro_batch_size(self, micro_batch_size: int) -> "BatchPlan":
        """This plan with a chosen micro-batch and the accumulation steps that follow from it."""
        if micro_batch_size < 1 or self.local_mini_batch_sequences % micro_batch_size:
            raise ValueError(f"micro-batch of {micro_batch_size} sequences does not divide the per-rank mini-batch "
                             f"of {self.local_mini_batch_sequences}")
        return replace(self, micro_batch_size_per_gpu=micro_batch_size,
                       grad_accum_steps=self.local_mini_batch_sequences // micro_batch_size)


def plan_batches(
    *,
    role: str,
    train_batch_size: int,
    responses_per_prompt: int,
    ppo_mini_batch_size: int,
    ppo_micro_batch_size_per_gpu: Optional[Union[int, str]],
    use_dynamic_bsz: bool,
    num_data_parallel_ranks: int,
) -> BatchPlan:
    """Derive one role's batch plan, or raise ``ConfigError`` naming every key that breaks the identity.

    ``role`` is the config prefix used in messages, e.g. ``"actor"`` or ``"critic"``. An ``auto`` micro-batch leaves
    the micro-batch and accumulation steps to the worker (``auto_micro_batch=True``).
    """
    error = ConfigError()
    mini_key, micro_key = f"{role}.ppo_mini_batch_size", f"{role}.ppo_micro_batch_size_per_gpu"
    if ppo_mini_batch_size > train_batch_size:
        error.add(mini_key, ppo_mini_batch_size, f"exceeds data.train_batch_size={train_batch_size} (both count prompts)")
    elif train_batch_size % ppo_mini_batch_size:
        error.add(mini_key, ppo_mini_batch_size, f"must divide data.train_batch_size={train_batch_size}")
    mini_batch_sequences = ppo_mini_batch_size * responses_per_prompt
    if mini_batch_sequences % num_data_parallel_ranks:
        error.add(
            mini_key,
            ppo_mini_batch_size,
            f"× {_per_prompt(responses_per_prompt)} = {mini_batch_sequences} sequences cannot be split evenly over "
            f"{num_data_parallel_ranks} data-parallel ranks (trainer.nnodes × trainer.n_gpus_per_node)",
        )
    local_sequences = mini_batch_sequences // num_data_parallel_ranks
    grad_accum_steps: Optional[int] = None
    auto = not use_dynamic_bsz and ppo_micro_batch_size_per_gpu == AUTO_MICRO_BATCH
    micro = None if use_dynamic_bsz or auto else ppo_micro_batch_size_per_gpu
    if not use_dynamic_bsz and not auto and not error:
        if ppo_micro_batch_size_per_gpu is None:
            error.add(micro_key, None, f"is required unless {role}.use_dynamic_bsz=true")
        elif local_sequences % ppo_micro_batch_size_per_gpu:
            error.add(
                micro_key,
                ppo_micro_batch_size_per_gpu,
                f"must divide the per-rank mini-batch of {local_sequences} sequences "
                f"({mini_key}={ppo_mini_batch_size} × {_per_prompt(responses_per_prompt)} ÷ {num_data_parallel_ranks} ranks); "
                f"global = micro × accumulation × world must hold exactly",
            )
        else:
            grad_accum_steps = local_sequences // ppo_micro_batch_size_per_gpu
    error.raise_if_any()
    return BatchPlan(
        num_data_parallel_ranks=num_data_parallel_ranks,
        num_mini_batches=train_batch_size // ppo_mini_batch_size,
        mini_batch_sequences=mini_batch_sequences,
        local_mini_batch_sequences=local_sequences,
        micro_batch_size_per_gpu=micro,
        grad_accum_steps=grad_accum_steps,
        auto_micro_batch=auto,
    )


def world_size(config: TrainConfig) -> int:
    """Devices in the job: ``trainer.nnodes × trainer.n_gpus_per_node``."""
    return config.trainer.nnodes * config.trainer.n_gpus_per_node


def shard_group_ranks(fsdp_size: int, world: int) -> int:
    """Ranks one copy of a model is sharded over: ``fsdp_size`` (HSDP's shard group), or all ``world`` for -1."""
    return world if fsdp_size == -1 else fsdp_size


def _per_prompt(rows: int) -> str:
    return f"{rows} sequences per prompt (rollout.n, × rollout.multi_turn.agent_max_sequences for an agent)"


def trained_rows_per_prompt(config: TrainConfig) -> int:
    """Rows one prompt brings to the updates: ``rollout.n`` responses, each ``rollout.multi_turn.agent_max_sequences``
    rows when a user's agent plays them (an episode's training sequences, ``hybridrl/agents/episode_rows.py``)."""
    multi_turn = config.rollout.multi_turn
    per_response = multi_turn.agent_max_sequences if multi_turn.enable and multi_turn.agent else 1
    return config.rollout.n * max(per_response, 1)


def role_plan(config: TrainConfig, role: str) -> BatchPlan:
    """The ``BatchPlan`` of ``role`` (``"actor"`` or ``"critic"``); raises ``ConfigError`` if its sizes do not divide."""
    role_config = getattr(config, role)
    return plan_batches(
        role=role,
        train_batch_size=config.data.train_batch_size,
        responses_per_prompt=trained_rows_per_prompt(config),
        ppo_mini_batch_size=role_config.ppo_mini_batch_size,
        ppo_micro_batch_size_per_gpu=role_config.ppo_micro_batch_size_per_gpu,
        use_dynamic_bsz=role_config.use_dynamic_bsz,
        num_data_parallel_ranks=data_parallel_size(config, role),
    )


def data_parallel_size(config: TrainConfig, role: str) -> int:
    """Ranks of ``role`` (``"actor"`` or ``"critic"``) that hold different rows: the world over the ranks that split
    each sequence (``ulysses_sequence_parallel_size``; one that does not divide the world is refused by validation
    and counts as 1 here)."""
    world, sp = world_size(config), getattr(config, role).ulysses_sequence_parallel_size
    return world // sp if sp >= 1 and world % sp == 0 else world


def reuses_update_log_probs(config: TrainConfig) -> bool:
    """Whether the actor update may stand in for the old-log-prob forward (``actor.old_log_prob=auto``): exactly one
    optimizer step on fresh rollouts — one PPO epoch over one mini-batch, no adaptive accumulation (which re-cuts
    the mini-batch) — no consumer of old log-probs before the update (KL in the reward, an off-policy correction,
    a distillation teacher's per-token KL) and samples from the weights being trained (``async_training`` staleness
    bound 0)."""
    actor = config.actor
    return (actor.old_log_prob == "auto" and actor.ppo_epochs == 1
            and actor.ppo_mini_batch_size == config.data.train_batch_size
            and not actor.adaptive_accumulation.enable and not config.algorithm.use_kl_in_reward
            and config.async_training.staleness_bound == 0 and not config.algorithm.distillation.teacher_path
            and config.algorithm.off_policy_correction.resolved_kind(0) == "none")


def gathers_once(setting: Union[bool, str], device_type: str, world_size: int) -> bool:
    """``*.fsdp.gather_once`` resolved for a role's ``world_size`` workers on ``device_type``. ``auto`` is on for CPU
    workers (gloo all-gathers are slow, memory is plentiful) and for a single accelerator (nothing to gather or to
    overlap: per-layer FSDP2 groups only add casts, copies and hooks to every micro-batch — measured 1.7× faster PPO
    steps on one H200), off for several accelerators (FSDP2 overlaps the all-gathers with compute)."""
    if setting == "auto":
        return device_type == "cpu" or world_size == 1
    return bool(setting)
