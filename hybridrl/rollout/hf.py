"""``rollout.name=hf``: a KV-cached decode loop on the actor's own module — the debugging and small-scale path.

It shares the training module (FSDP2-sharded or not), so there are no weights to sync: ``update_weights`` is a no-op
and generation always sees the latest update. With several data-parallel ranks each layer's parameters are gathered
once per ``generate`` and kept until it returns (:func:`~hybridrl.modeling.fsdp.parameters_kept_gathered`), not once
per decode step; all ranks keep stepping until the slowest finishes. The ``n`` samples of a prompt share its
prefill: the prompt runs once and its KV cache is repeated ``n`` times. Rows that have sampled an EOS leave the decode
batch (their cache rows too) once an eighth of it has ended, without changing what is sampled: at SmolLM2's shapes
with responses ending at spread-out lengths (mean 18 of 32 tokens) a ``generate`` of 8 prompts × 4 samples ran
2.50 → 2.04 s on the 2-core AMD EPYC (``benchmarks/hf_decode.py``, 2026-12-05).

Prompts run through the module's forward. Decode steps of the model types :mod:`hybridrl.modeling.decode_step`
covers run straight on the weights (``rollout.hf_fast_decode``, on by default: the same logits bit for bit on CPU,
without the modules' per-step dispatch); other models run the module's forward every step. On a CPU with native
bf16 either way multiplies against weights packed once per ``generate`` for oneDNN
(:mod:`hybridrl.modeling.prepacked`: the same bits, without a weight reorder in every decode-step product; fp32 is
not packed by default, see there why).

Like every engine's, generation runs on a replica server (:mod:`hybridrl.rollout.server`): ``generate`` submits one
request per response row in one command, and the server's engine thread steps the engine's request queue
(:mod:`hybridrl.rollout.hf_requests`: requests decode in cohorts, one token per step; the decode loop of a cohort is
:mod:`hybridrl.rollout.hf_decode`). The queue lives for one ``generate``: the module is the trainer's, its
parameters gathered for the call and freed after it, and on several ranks every rank's cohort steps until the last
rank's rows have ended, so the engine serves no requests between calls (multi-turn episodes and the gateway need an
engine with a copy of the weights, ``serves_requests``).

The loop is the model's forward, the sampler of :mod:`hybridrl.rollout.sampling` and nothing else: no generation
config of the checkpoint (repetition penalties, minimum lengths, …) can change what is sampled behind the
log-probs, which are those of ``logits / temperature`` exactly as the trainer computes them. It replaced
transformers' ``generate``, whose ``torch.multinomial`` was 10 % of a SmolLM2 GRPO step on CPU.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Iterable, Optional

import torch
from torch import nn

from hybridrl.modeling.decode_step import fast_decode_unsupported
from hybridrl.modeling.fsdp import parameters_kept_gathered
from hybridrl.modeling.prepacked import linears_prepacked
from hybridrl.modeling.routing_replay import recorded_routing, require_routers
from hybridrl.protocol import Batch, Fields
from hybridrl.protocol.rollout_layout import assemble_rollout, response_mask_from_eos
from hybridrl.rollout.base import SamplingParams
from hybridrl.rollout.completion import completions_as_rows, unpadded_rows
from hybridrl.rollout.hf_decode import Forwards
from hybridrl.rollout.hf_requests import HFRequests
from hybridrl.rollout.prompt_images import vision_token_ids
from hybridrl.rollout.routing_capture import with_routing
from hybridrl.rollout.server import serve

logger = logging.getLogger(__name__)


class HFRollout:
    """Generation with a KV cache on the actor's module, returning the rollout layout of ``rollout.base``."""

    generates_with_actor_module = True
    serves_requests = False  # its request queue lives for one generate, in lockstep with the other FSDP ranks

    @classmethod
    def from_inputs(cls, inputs) -> "HFRollout":
        """From :class:`hybridrl.rollout.EngineInputs`: the actor's module is required."""
        if inputs.model is None:
            raise ValueError("rollout.name=hf generates with the actor's module: EngineInputs.model is required")
        return cls(inputs.model, pad_token_id=inputs.pad_token_id, eos_token_ids=inputs.eos_token_ids,
                   micro_batch_size=inputs.micro_batch_size, fast_decode=inputs.rollout.hf_fast_decode,
                   record_routing=inputs.record_routing)

    def __init__(self, model: nn.Module, *, pad_token_id: int, eos_token_ids: Iterable[int],
                 micro_batch_size: Optional[int] = None, fast_decode: bool = True,
                 drop_ended_rows: bool = True, prepack: bool = True, record_routing: bool = False) -> None:
        self.model = model
        self.pad_token_id = pad_token_id
        self.eos_token_ids = list(eos_token_ids)
        self.micro_batch_size = micro_batch_size
        self.drop_ended_rows = drop_ended_rows
        """Whether rows that have ended leave the decode batch (the same samples; ``False`` for A/B checks)."""
        self.prepack = prepack
        """Whether products run against oneDNN-packed weights on CPU (:mod:`hybridrl.modeling.prepacked`; ``False``
        for A/B checks)."""
        self.record_routing = record_routing
        """Whether ``generate`` returns the experts an MoE model routed each token to (``Fields.ROUTED_EXPERTS``,
        :mod:`hybridrl.rollout.routing_capture`); refused for a dense model."""
        if record_routing:
            require_routers(model)
        self.unsampled_token_ids = torch.tensor(vision_token_ids(model), dtype=torch.long)
        """Token ids never sampled: a vision-language model's image placeholders (a response holding one would take
        an image's place in the trainer's forward)."""
        self.decode_rows_run = 0
        """Rows × forwards of the last ``generate``'s decode loops (the work that dropping ended rows saves)."""
        self.fast_decode_unsupported = (
            "routing is recorded (the module's routers run)" if record_routing
            else fast_decode_unsupported(model) if fast_decode else "rollout.hf_fast_decode=false")
        """Why decode steps run the module's forward (``None``: :class:`DecodeStep` runs them)."""
        self.decode_path = None
        """What ran the last ``generate``'s decode steps: ``"fast"`` or ``"module"`` (``None`` before any)."""
        self.policy_version: Optional[int] = None
        """The trainer's ``policy_version`` of the module's weights, as the last ``update_weights`` said."""
        self._noted_no_sleep = False
        self._noted_path = False

    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        """``B`` left-padded prompts → ``B·n`` rows, a prompt's ``n`` responses consecutive (``rollout.base``),
        generated on the engine's replica server (``rollout/server.py``) like every engine's: one request per row,
        all submitted in one command, decoded in cohorts of ``micro_batch_size`` rows (whole prompts; one cohort
        without it) by :class:`~hybridrl.rollout.hf_requests.HFRequests`."""
        was_training, device = self.model.training, prompts[Fields.INPUT_IDS].device
        self.model.eval()
        forwards = Forwards(self.model, fast=self.fast_decode_unsupported is None, prepack=self.prepack)
        self.decode_rows_run = 0
        requests = [(prompt, params, f"generate-{index}-{sample}")
                    for index, prompt in enumerate(unpadded_rows(prompts)) for sample in range(params.n)]
        # one all-gather (and bf16 cast) per layer, not one per decode step; on CPU each weight packed once for oneDNN
        # (the fast step packs its own: the module's products then run once per prompt, not worth a packed copy)
        packs_linears = self.prepack and not forwards.fast
        with parameters_kept_gathered(self.model), linears_prepacked(self.model, enabled=packs_linears), \
                self._routing_recorded() as record:
            queue = HFRequests(self, forwards, version=lambda: self.policy_version,
                               prompt_width=prompts[Fields.INPUT_IDS].shape[1], samples_per_prompt=params.n,
                               prompts_per_cohort=max(self.micro_batch_size // params.n, 1)
                               if self.micro_batch_size else None,
                               images=_request_images(prompts, params.n, requests), record=record,
                               device=device)
            completions = serve(queue, lambda server: _generate_to_the_end(server, queue, requests),
                                version=lambda: self.policy_version, name="hf")
        self.model.train(was_training)
        self._note_decode_path(forwards)
        responses, _, log_probs = (rows.to(device) for rows in
                                   completions_as_rows(completions, params.max_new_tokens, self.pad_token_id))
        mask = response_mask_from_eos(responses, self.eos_token_ids)
        rollout = assemble_rollout(prompts, params.n, responses, mask, log_probs, self.pad_token_id)
        if record is None:
            return rollout
        return with_routing(rollout, torch.cat([capture.experts for capture in queue.captures]))

    def _routing_recorded(self):
        """``recorded_routing`` of the model when ``record_routing``, else a block yielding ``None``."""
        return recorded_routing(self.model) if self.record_routing else contextlib.nullcontext()

    def _note_decode_path(self, forwards: Forwards) -> None:
        self.decode_path = "fast" if forwards.step is not None else "module"
        if self._noted_path:
            return
        self._noted_path = True
        if self.decode_path == "fast":
            logger.info("rollout.name=hf: decode steps run on the weights directly (rollout.hf_fast_decode)")
        else:
            logger.info("rollout.name=hf: decode steps run the module's forward: %s",
                        self.fast_decode_unsupported or forwards.failure or "no decode step ran")

    def update_weights(self, named_tensors, policy_version=None) -> None:
        """Nothing to load: this engine generates with the training module itself. Records ``policy_version`` (what
        the tokens generated from now on carry)."""
        if policy_version is not None:
            self.policy_version = policy_version

    def release_memory(self) -> None:
        if not self._noted_no_sleep:
            logger.info("rollout.name=hf keeps no separate cache between steps; release_memory is a no-op")
            self._noted_no_sleep = True

    def resume(self) -> None:
        """Nothing was released (see ``release_memory``)."""


async def _generate_to_the_end(server, queue: HFRequests, requests: list) -> list:
    """Every request finished, and the queue run to its end: with several ranks a cohort steps on until every
    rank's rows have ended, after this rank's requests have all been answered."""
    completions = await server.generate_batch(requests)
    await server.call(queue.run)
    return completions


def _request_images(prompts: Batch, n: int, requests: list) -> dict[str, dict]:
    """The vision inputs of each request whose prompt has images, by request id (``n`` requests per prompt)."""
    rows = prompts.non_tensors.get(Fields.MULTI_MODAL_INPUTS)
    if rows is None:
        return {}
    return {request_id: rows[index // n] for index, (_, _, request_id) in enumerate(requests)
            if rows[index // n] is not None}
