"""Rollout engines behind one protocol (``base.RolloutEngine``), selected by ``rollout.name``.

``build_rollout_engine(name, inputs)`` is what the worker calls; each backend module is imported inside its builder,
so choosing ``hf`` never imports vLLM. Recipes can add an engine with ``@ROLLOUT_ENGINES.register("mine")``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from torch import nn

from hybridrl.config.schema import RolloutConfig
from hybridrl.protocol.rollout_layout import assemble_rollout, response_mask_from_eos
from hybridrl.rollout.base import RolloutEngine, SamplingParams
from hybridrl.utils.registry import Registry

__all__ = ["ROLLOUT_ENGINES", "EngineInputs", "RolloutEngine", "SamplingParams", "assemble_rollout",
           "build_rollout_engine", "holds_own_weights", "response_mask_from_eos"]


@dataclass(frozen=True)
class EngineInputs:
    """What an engine may need from the worker that builds it.

    Attributes:
        rollout: the ``rollout.*`` config.
        pad_token_id / eos_token_ids: the tokenizer's pad id and the ids that end a response.
        model: the actor's module (``hf`` generates with it; FSDP2-sharded or not).
        model_path: the Hugging Face directory the engine loads its own copy from (``vllm``).
        tokenizer_path: its tokenizer directory (``model.tokenizer_path``); ``None`` = ``model_path``.
        max_model_len: prompt + response tokens (``data.max_prompt_length + data.max_response_length``).
        dtype: compute dtype name (``model.dtype``).
        seed: engine seed when ``rollout.seed`` is null (``trainer.seed``).
        micro_batch_size: ``hf``: sequences per ``generate`` call (``None`` = all at once), rounded down to whole
            prompts (``rollout.n`` sequences each; at least one prompt).
    """

    rollout: RolloutConfig
    pad_token_id: int
    eos_token_ids: Sequence[int]
    model: Optional[nn.Module] = None
    model_path: Optional[str] = None
    tokenizer_path: Optional[str] = None
    max_model_len: int = 0
    dtype: str = "bfloat16"
    seed: int = 0
    micro_batch_size: Optional[int] = None


ROLLOUT_ENGINES: Registry[Callable[[EngineInputs], RolloutEngine]] = Registry("rollout engine")


def holds_own_weights(name: str) -> bool:
    """Whether engine ``name`` (``rollout.name``) generates from a copy of the weights that each update must be
    synced into (``vllm``), rather than from the actor's own module (``hf``)."""
    return name != "hf"


def build_rollout_engine(name: str, inputs: EngineInputs) -> RolloutEngine:
    """The engine registered as ``name`` (``rollout.name``), built from ``inputs``."""
    return ROLLOUT_ENGINES[name](inputs)


@ROLLOUT_ENGINES.register("hf")
def _build_hf(inputs: EngineInputs) -> RolloutEngine:
    from hybridrl.rollout.hf import HFRollout

    if inputs.model is None:
        raise ValueError("rollout.name=hf generates with the actor's module: EngineInputs.model is required")
    return HFRollout(inputs.model, pad_token_id=inputs.pad_token_id, eos_token_ids=inputs.eos_token_ids,
                     micro_batch_size=inputs.micro_batch_size)


@ROLLOUT_ENGINES.register("vllm")
def _build_vllm(inputs: EngineInputs) -> RolloutEngine:
    from hybridrl.rollout.vllm_engine import VLLMRollout, VLLMSettings

    if not inputs.model_path:
        raise ValueError("rollout.name=vllm loads its own copy of the model: EngineInputs.model_path (model.path) "
                         "is required")
    settings = VLLMSettings.from_config(inputs.rollout, max_model_len=inputs.max_model_len, dtype=inputs.dtype,
                                        seed=inputs.seed)
    return VLLMRollout(inputs.model_path, pad_token_id=inputs.pad_token_id, eos_token_ids=inputs.eos_token_ids,
                       settings=settings, tokenizer_path=inputs.tokenizer_path)
