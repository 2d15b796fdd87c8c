"""How an RL run is set up beyond its groups (their pools and placement: ``hybridrl/replicas/placement.py``): the KL
controller."""

from __future__ import annotations

from hybridrl.algorithms import build_kl_controller
from hybridrl.config.schema import TrainConfig


def kl_controller_for(config: TrainConfig, total_steps: int):
    """The KL controller ``algorithm.kl_ctrl`` names (fixed, adaptive or scheduled over the run's samples)."""
    kl = config.algorithm.kl_ctrl
    if kl.type == "fixed":
        return build_kl_controller("fixed", kl_coef=kl.kl_coef)
    if kl.type == "adaptive":
        return build_kl_controller("adaptive", init_kl_coef=kl.kl_coef, target_kl=kl.target_kl, horizon=kl.horizon)
    return build_kl_controller("scheduled", init_kl_coef=kl.kl_coef, target_kl_coef=kl.target_kl_coef,
                               total_steps=total_steps * config.data.train_batch_size * config.rollout.n)
