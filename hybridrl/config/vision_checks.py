"""Checks of a vision-language policy (a ``model.path`` whose ``config.json`` has a ``vision_config``): its image
processor saved beside it, and the parts of a run that do not read images yet refused, named (docs/training.md,
"Vision-language models")."""

from __future__ import annotations

from pathlib import Path

from hybridrl.config.checks import critic_enabled
from hybridrl.config.errors import ConfigError
from hybridrl.config.schema import TrainConfig

VISION_MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl")
"""The vision-language model types whose images hybridrl reads (:mod:`hybridrl.modeling.multimodal`)."""


def check_vision_policy(config: TrainConfig, model_config: dict, error: ConfigError) -> None:
    """``model_config``: the policy's whole ``config.json``."""
    path = config.model.path
    if not isinstance(model_config.get("vision_config"), dict):
        if config.actor.freeze_vision_tower:
            error.add("actor.freeze_vision_tower", True, f"{path} is a text-only model: it has no vision tower")
        return
    model_type = model_config.get("model_type")
    if model_type not in VISION_MODEL_TYPES:
        error.add("model.path", path, f"is a vision-language model of type {model_type!r}; images are read for "
                                      f"{', '.join(VISION_MODEL_TYPES)} models (their vision tokens and mRoPE "
                                      "positions) — others are not supported yet")
        return
    if not (Path(path) / "preprocessor_config.json").is_file():
        error.add("model.path", path, "is a vision-language model without its image processor: save it beside the "
                                      "weights (preprocessor_config.json, AutoImageProcessor.save_pretrained)")
    if config.rollout.name == "vllm":
        error.add("rollout.name", "vllm", f"{path} takes images, which the vLLM path does not carry yet: generate "
                                          "with rollout.name=hf")
    if critic_enabled(config):
        error.add("critic.enable", True, f"a critic does not read images yet, and {path} takes them: use a "
                                         "critic-free estimator (algorithm=grpo, rloo, …)")
    if config.data.replay.enable:
        error.add("data.replay.enable", True, f"replays prompts without their images; {path} takes images: turn "
                                              "prompt replay off")
    if config.algorithm.distillation.teacher_path:
        error.add("algorithm.distillation.teacher_path", config.algorithm.distillation.teacher_path,
                  f"a teacher for a vision-language policy ({path}) is not supported yet: it would need the images")
    if config.actor.ulysses_sequence_parallel_size > 1:
        error.add("actor.ulysses_sequence_parallel_size", config.actor.ulysses_sequence_parallel_size,
                  f"does not split a vision-language model's sequences yet ({path} feeds its decoder image "
                  "embeddings, not token ids)")
