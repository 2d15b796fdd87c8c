"""Checks of MoE routing replay (``actor.router_replay.mode``): a known mode, an engine that records routing, and a
mixture-of-experts model (docs/training.md, "MoE routing replay")."""

from __future__ import annotations

from hybridrl.config.checks import _choice
from hybridrl.config.errors import ConfigError
from hybridrl.config.schema import ROUTER_REPLAY_MODES, TrainConfig

KEY = "actor.router_replay.mode"
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts")
"""``config.json`` keys that give the experts per layer of an MoE model whose routers transformers writes as top-k
router modules returning their choice (``MixtralTopKRouter``, ``Qwen3MoeTopKRouter``, OLMoE, Qwen2-MoE, …): what
routing replay hooks (:mod:`hybridrl.modeling.routing_replay`)."""


def check_router_replay(config: TrainConfig, error: ConfigError) -> None:
    """A known mode; on, an engine that returns routed experts."""
    mode = config.actor.router_replay.mode
    _choice(error, KEY, mode, ROUTER_REPLAY_MODES)
    if mode == "disabled" or mode not in ROUTER_REPLAY_MODES:
        return
    if config.rollout.name != "hf":
        error.add(KEY, mode, f"needs the rollout's routed experts, which only rollout.name=hf returns (records its "
                             f"own routers); rollout.name={config.rollout.name!r} does not: vLLM returns them only "
                             "from its GPU model runner (enable_return_routed_experts), not wired here yet")


def check_router_replay_model(config: TrainConfig, model_config: dict, error: ConfigError) -> None:
    """On, ``model.path`` must be a mixture-of-experts model (``model_config``: its ``config.json``, the language
    model's part of a multimodal one)."""
    mode = config.actor.router_replay.mode
    if mode == "disabled" or mode not in ROUTER_REPLAY_MODES:
        return
    if any(isinstance(model_config.get(key), int) and model_config[key] > 1 for key in EXPERT_COUNT_KEYS):
        return
    if isinstance(model_config.get("n_routed_experts"), int):
        error.add(KEY, mode, f"does not hook {config.model.path}'s DeepSeek-style routers yet (n_routed_experts: the "
                             "router returns scores and the MoE block chooses); Mixtral- and Qwen-MoE-style top-k "
                             "routers are supported")
        return
    error.add(KEY, mode, f"needs a mixture-of-experts model, but {config.model.path} is dense (its config.json has "
                         f"none of {', '.join(EXPERT_COUNT_KEYS)}): a dense model routes nothing; set {KEY}=disabled")
