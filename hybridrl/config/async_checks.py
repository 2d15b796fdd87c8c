"""Checks of ``async_training`` and ``algorithm.off_policy_correction`` (called by ``validate_config``)."""

from __future__ import annotations

from hybridrl.config.async_schema import ASYNC_MODES, CORRECTION_KINDS, CORRECTION_LEVELS
from hybridrl.config.checks import _choice, _require
from hybridrl.config.errors import ConfigError
from hybridrl.config.schema import TrainConfig



def check_async_training(config: TrainConfig, error: ConfigError) -> None:
    """``async_training.*``: a known mode, a staleness bound >= 0 that the mode uses (a bound above the default
    with ``mode=sync`` would be ignored), the standalone pool it needs, and what partial rollout does not combine
    with (named, with the reason)."""
    settings = config.async_training
    _choice(error, "async_training.mode", settings.mode, ASYNC_MODES)
    _require(error, "async_training.max_staleness", settings.max_staleness, settings.max_staleness >= 0,
             "must be >= 0 (optimizer steps a sample's weights may lag the trainer's; 0 = sync)")
    if settings.mode == "one_step_off" and settings.max_staleness != 1:
        error.add("async_training.max_staleness", settings.max_staleness,
                  "one_step_off is bounded staleness with η = 1; for another bound set async_training.mode=bounded")
    if settings.mode == "sync" and settings.max_staleness > 1:  # 1 is the default, so not told apart from unset
        error.add("async_training.max_staleness", settings.max_staleness,
                  "has no effect with async_training.mode=sync (η = 0: every sample is generated with the newest "
                  "weights); set async_training.mode=bounded to let samples lag up to this many steps, or drop "
                  "async_training.max_staleness")
    if settings.partial_rollout:
        _check_partial_rollout(config, error)
    if settings.mode == "sync" or settings.mode not in ASYNC_MODES:
        return
    if config.rollout.n_gpus == 0:
        error.add("async_training.mode", settings.mode,
                  "overlaps generation with training on the standalone rollout pool: set rollout.n_gpus > 0 "
                  "(colocated engines share the trainer's devices and cannot generate while it trains)")


def _check_partial_rollout(config: TrainConfig, error: ConfigError) -> None:
    """Partial rollout needs generation ahead of training, one-rank replicas and single-turn rows."""
    key = "async_training.partial_rollout"
    if config.async_training.staleness_bound == 0:
        error.add(key, True, "needs async_training.mode=one_step_off or bounded with max_staleness >= 1 (in sync "
                             "every generation already uses the newest weights)")
    if config.rollout.tensor_model_parallel_size > 1:
        error.add(key, True, "needs rollout.tensor_model_parallel_size=1 (the ranks of a replica would have to agree "
                             "on the engine step at which new weights land)")
    if config.rollout.multi_turn.enable:
        error.add(key, True, "is not built for multi-turn episodes (rollout.multi_turn.enable)")
    if config.algorithm.adv_estimator == "remax":
        error.add(key, True, "not with algorithm.adv_estimator=remax: the greedy baseline, generated behind its batch, "
                             "could take newer weights mid-generation than the rows it is the baseline of")


def check_off_policy_correction(config: TrainConfig, error: ConfigError) -> None:
    """``algorithm.off_policy_correction.*``: kind, level and bounds (cap > 0, 0 <= low <= 1 <= high)."""
    correction, prefix = config.algorithm.off_policy_correction, "algorithm.off_policy_correction"
    _choice(error, f"{prefix}.kind", correction.kind, CORRECTION_KINDS)
    _choice(error, f"{prefix}.level", correction.level, CORRECTION_LEVELS)
    kind = correction.resolved_kind(config.async_training.staleness_bound)
    if kind == "tis":
        _require(error, f"{prefix}.cap", correction.cap, correction.cap > 0, "must be > 0 (the largest weight)")
    if kind == "mis":
        _require(error, f"{prefix}.low", correction.low, 0 <= correction.low <= 1, "must lie in [0, 1]")
        _require(error, f"{prefix}.high", correction.high, correction.high >= 1, "must be >= 1")

