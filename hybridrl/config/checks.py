"""Primitives every config check uses: record a problem against a key when a condition fails."""

from __future__ import annotations

from typing import Any, Iterable, Optional

from hybridrl.config.errors import ConfigError
from hybridrl.config.schema import TrainConfig


def critic_enabled(config: TrainConfig) -> bool:
    """Whether a value model is trained: ``critic.enable`` if set, else only for GAE."""
    if config.critic.enable is not None:
        return config.critic.enable
    return config.algorithm.adv_estimator == "gae"


def _require(error: ConfigError, key: str, value: Any, ok: bool, message: str) -> None:
    if not ok:
        error.add(key, value, message)


def _positive(error: ConfigError, items: Iterable[tuple[str, Optional[int | float]]], allow_none: bool = True) -> None:
    for key, value in items:
        if value is None and allow_none:
            continue
        _require(error, key, value, value is not None and value > 0, "must be a positive number")


def _choice(error: ConfigError, key: str, value: Any, choices: Iterable[str]) -> None:
    choices = tuple(choices)
    _require(error, key, value, value in choices, f"unknown; expected one of {', '.join(choices)}")


def _fsdp_size(error: ConfigError, key: str, fsdp_size: int, ranks: int) -> None:
    """``fsdp_size`` (HSDP's shard group) is -1 (all ranks) or a divisor of the role's ``ranks``."""
    _require(error, key, fsdp_size, fsdp_size == -1 or (fsdp_size >= 1 and ranks % fsdp_size == 0),
             f"must be -1 (shard over all {ranks} ranks) or divide them: each group of fsdp_size ranks holds one "
             "sharded copy of the model")
