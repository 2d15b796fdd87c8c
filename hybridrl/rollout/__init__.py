"""Rollout engines behind one protocol (``base.RolloutEngine``), selected by ``rollout.name``.

The registry holds engine *classes*. Each declares what it is on the class — ``generates_with_actor_module``: it
samples from the actor's own training module, so there are no weights to sync (``hf``); otherwise it holds a copy
that every update is streamed into (``vllm``) — and builds itself from :class:`EngineInputs` with ``from_inputs``.
Each backend module imports its heavy dependencies lazily, so choosing ``hf`` never imports vLLM. A recipe adds an
engine with ``@ROLLOUT_ENGINES.register("mine")`` on a class of its own (a file in ``trainer.plugins``), and
``rollout.name=mine`` is then accepted by config validation and built by the actor worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from torch import nn

from hybridrl.config.schema import RolloutConfig
from hybridrl.protocol.rollout_layout import assemble_rollout, response_mask_from_eos
from hybridrl.rollout.base import RolloutEngine, RolloutEngineClass, SamplingParams
from hybridrl.rollout.hf import HFRollout
from hybridrl.rollout.vllm_engine import VLLMRollout
from hybridrl.utils.registry import Registry

__all__ = ["ROLLOUT_ENGINES", "EngineInputs", "RolloutEngine", "RolloutEngineClass", "SamplingParams",
           "assemble_rollout", "build_rollout_engine", "holds_own_weights", "response_mask_from_eos"]


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
        record_routing: return the experts an MoE model routed each token to (``Fields.ROUTED_EXPERTS``), for
            routing replay (``actor.router_replay.mode``); only ``hf`` can.
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
    record_routing: bool = False


def _check_engine_class(name: str, engine: object) -> None:
    missing = [attribute for attribute in ("generates_with_actor_module", "from_inputs") if not hasattr(engine, attribute)]
    if missing:
        raise TypeError(f"rollout engine {name!r}: {engine!r} lacks {', '.join(missing)}; register a class with "
                        "generates_with_actor_module (bool) and a from_inputs(inputs) classmethod (see "
                        "hybridrl.rollout.base.RolloutEngineClass)")


ROLLOUT_ENGINES: Registry[RolloutEngineClass] = Registry("rollout engine", check=_check_engine_class)
ROLLOUT_ENGINES.register("hf")(HFRollout)
ROLLOUT_ENGINES.register("vllm")(VLLMRollout)


def holds_own_weights(name: str) -> bool:
    """Whether engine ``name`` (``rollout.name``) generates from a copy of the weights that each update must be
    synced into, rather than from the actor's own module (its class's ``generates_with_actor_module``)."""
    return not ROLLOUT_ENGINES[name].generates_with_actor_module


def build_rollout_engine(name: str, inputs: EngineInputs) -> RolloutEngine:
    """The engine registered as ``name`` (``rollout.name``), built from ``inputs``."""
    return ROLLOUT_ENGINES[name].from_inputs(inputs)
