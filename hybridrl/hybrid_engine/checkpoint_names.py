"""A model's weights as its checkpoint holds them — the names and tensors vLLM's loaders read.

transformers 5 keeps some parameters in memory in another form than the checkpoint's: a mixture-of-experts layer's
experts fused into one 3-D tensor (``mlp.experts.gate_up_proj``) where the checkpoint has one 2-D tensor per expert
and projection (``block_sparse_moe.experts.3.w1.weight``), renamed modules, permuted rotary weights.
``save_pretrained`` reverts these conversions; an engine that loads weights streamed from the trainer needs the same
reversal, or it refuses the names (Mixtral) or loads them wrongly. Tied embeddings are one parameter in memory but two
names to an engine: vLLM's CPU reload re-processes the output head only when its weight arrives, so it is sent under
its own name too.

:class:`CheckpointNames` records, once per model (from a ``meta``-device copy: no memory), which parameters convert
and what the tied output head is called, and turns a stream of ``(in-memory name, full tensor)`` pairs into the
checkpoint's pairs, one parameter at a time (each conversion reads one whole parameter). A converted parameter must
arrive whole: the trainer then sends full tensors, not tensor-parallel slices (:func:`engine_rule`).
"""

from __future__ import annotations

import logging
from typing import Any, Iterable, Iterator

import torch
from torch import nn

from hybridrl.hybrid_engine.tp_rules import RuleFn, full_tensor_rule, rules_for_model

logger = logging.getLogger(__name__)


def _weight_reverter():
    """transformers' ``revert_weight_conversion`` (transformers >= 5), or ``None``: transformers 4 keeps checkpoint
    names and tensors in memory, so there is nothing to revert. Imported on first use (transformers is heavy)."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:
        return None
    return revert_weight_conversion


class CheckpointNames:
    """How one model's in-memory parameters map onto its checkpoint's tensors (see the module docstring).

    Attributes:
        converted: in-memory names whose checkpoint form differs (another name, shape, split or values).
        tied_output: ``{input embedding name: output head weight name}`` for tied embeddings (e.g.
            ``{"model.embed_tokens.weight": "lm_head.weight"}``); empty when untied.
    """

    def __init__(self, model: nn.Module) -> None:
        self._model, self._revert = model, _weight_reverter()
        self.converted = frozenset(name for name, param in model.named_parameters()
                                   if not self._identity(name, param.shape))
        self.tied_output = _tied_output(model)

    @classmethod
    def from_config(cls, config: Any) -> "CheckpointNames":
        """From a Hugging Face config: a ``meta``-device model of it (no weights allocated)."""
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        return cls(model)

    @classmethod
    def from_pretrained(cls, model_path: str, trust_remote_code: bool = False) -> "CheckpointNames":
        from transformers import AutoConfig

        return cls.from_config(AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code))

    def _identity(self, name: str, shape: torch.Size) -> bool:
        if self._revert is None:
            return True
        probe = torch.empty(shape, device="meta")
        reverted = self._revert(self._model, {name: probe})
        return list(reverted) == [name] and reverted[name] is probe

    def tied_output_modules(self) -> list[str]:
        """The module names of the tied output heads (``["lm_head"]``), to ask an engine whether it has one."""
        return [name.rpartition(".")[0] for name in self.tied_output.values()]

    def to_checkpoint(self, named_tensors: Iterable[tuple[str, torch.Tensor]],
                      tied_output: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
        """``(in-memory name, full tensor)`` → ``(checkpoint name, tensor)`` pairs, streamed: unconverted parameters
        pass through unchanged, converted ones are reverted one at a time, and (``tied_output``: the engine has an
        output head module of its own, as vLLM's Llama does and its Gemma does not) a tied input embedding is
        followed by the output head's weight (the same tensor)."""
        sent: set[str] = set()
        for name, tensor in named_tensors:
            pairs = self._revert(self._model, {name: tensor}).items() if name in self.converted \
                else [(name, tensor)]
            for pair in pairs:
                sent.add(pair[0])
                yield pair
            tied = self.tied_output.get(name) if tied_output else None
            if tied is not None and tied not in sent:
                sent.add(tied)
                yield tied, tensor

    def describe(self) -> str:
        """A line for the log: what is converted and tied."""
        parts = []
        if self.converted:
            example = sorted(self.converted)[0]
            parts.append(f"{len(self.converted)} parameter(s) held in another form than the checkpoint's "
                         f"(e.g. {example!r})")
        if self.tied_output:
            parts.append(f"tied output head {next(iter(self.tied_output.values()))!r}")
        return "; ".join(parts) or "in-memory names are the checkpoint's"


def _tied_output(model: nn.Module) -> dict[str, str]:
    """``{input embedding parameter name: output head weight name}`` when the two share their weight."""
    inputs, outputs = model.get_input_embeddings(), model.get_output_embeddings()
    if inputs is None or outputs is None or outputs.weight is not inputs.weight:
        return {}
    input_name = next(name for name, param in model.named_parameters() if param is inputs.weight)
    output_module = next(name for name, module in model.named_modules() if module is outputs)
    return {input_name: f"{output_module}.weight"}


def engine_rule(model: nn.Module, tp_size: int) -> RuleFn:
    """The tensor-parallel split the trainer sends ``model``'s weights in (``tp_rules.rules_for_model``): slices
    where they are vetted and no parameter converts, else whole tensors. Logged once per process with the reason."""
    if tp_size == 1:  # one rank per replica: every parameter goes whole whatever the rule
        return full_tensor_rule
    names = CheckpointNames.from_config(model.config)
    rule, reason = rules_for_model(model.config, converted=bool(names.converted))
    logger.info("weight sync at tensor-parallel size %d: %s (%s)", tp_size, reason, names.describe())
    return rule
