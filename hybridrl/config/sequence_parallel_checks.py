"""Checks of Ulysses sequence parallelism (``actor.`` / ``critic.ulysses_sequence_parallel_size``): the group must
divide the devices and every split model's attention heads, and the features that read each rank's own micro-batch
gradients (partial sums on a split) or that have not been checked with it are refused (docs/training.md, "Sequence
parallelism")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from hybridrl.config.errors import ConfigError
from hybridrl.config.schema import TrainConfig
from hybridrl.config.sizes import world_size

ROLES = ("actor", "critic")


def check_sequence_parallel(config: TrainConfig, error: ConfigError) -> None:
    """Sizes that divide the devices, and no feature that cannot run on split sequences."""
    devices = world_size(config)
    for role in ROLES:
        key, sp = f"{role}.ulysses_sequence_parallel_size", getattr(config, role).ulysses_sequence_parallel_size
        if not isinstance(sp, int) or sp < 1:
            error.add(key, sp, "must be a whole number ≥ 1 (1: each rank holds whole sequences)")
        elif devices % sp:
            error.add(key, sp, f"must divide the {devices} devices (trainer.nnodes × trainer.n_gpus_per_node): the "
                               "ranks of a sequence-parallel group split the same rows")
    splits = [role for role in ROLES if getattr(config, role).ulysses_sequence_parallel_size != 1]
    if splits and config.model.use_torch_compile:
        error.add("model.use_torch_compile", True, f"is not combined with sequence parallelism yet "
                  f"({splits[0]}.ulysses_sequence_parallel_size > 1): the two have not been checked together; "
                  "turn one off")
    actor = config.actor
    if actor.ulysses_sequence_parallel_size != 1 and (actor.log_grad_noise_scale or actor.adaptive_accumulation.enable):
        key = "actor.log_grad_noise_scale" if actor.log_grad_noise_scale else "actor.adaptive_accumulation.enable"
        error.add(key, True, "measures each rank's micro-batch gradients, which are partial sums when ranks split "
                             "sequences (actor.ulysses_sequence_parallel_size > 1): turn one of them off")


def check_sequence_parallel_heads(config: TrainConfig, error: ConfigError) -> None:
    """Each rank of a group attends with ``heads / SP`` heads: ``SP`` must divide the heads of every model that
    splits — the policy and the reference (``model.path``), a distillation teacher, the critic (its own
    ``critic.model_path`` or the policy's backbone) — read from their ``config.json`` where it is at hand."""
    split = {"actor": (config.model.path, config.algorithm.distillation.teacher_path),
             "critic": (config.critic.model_path or config.model.path,)}
    for role, paths in split.items():
        sp = getattr(config, role).ulysses_sequence_parallel_size
        if not isinstance(sp, int) or sp <= 1:
            continue
        for path in filter(None, paths):
            heads = _attention_heads(path)
            if heads is not None and heads % sp:
                error.add(f"{role}.ulysses_sequence_parallel_size", sp,
                          f"must divide the {heads} attention heads (num_attention_heads) of {path}: each rank of a "
                          "sequence-parallel group attends with heads / SP of them")


def _attention_heads(path: str) -> Optional[int]:
    """``num_attention_heads`` of the model at ``path`` (a multimodal config's language model's), or ``None``."""
    try:
        config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # a missing or unreadable model is reported by the path checks
    heads = config.get("text_config", config).get("num_attention_heads")
    return heads if isinstance(heads, int) else None
