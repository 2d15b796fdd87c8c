"""``rollout.name=hf``: a KV-cached decode loop on the actor's own module — the debugging and small-scale path.

It shares the training module (FSDP2-sharded or not), so there are no weights to sync: ``update_weights`` is a no-op
and generation always sees the latest update. With several data-parallel ranks each layer's parameters are gathered
once per ``generate`` and kept until it returns (:func:`~hybridrl.modeling.fsdp.parameters_kept_gathered`), not once
per decode step; all ranks keep stepping until the slowest finishes. The ``n`` samples of a prompt share its
prefill: the prompt runs once and its KV cache is repeated ``n`` times. Rows that have sampled an EOS leave the decode
batch (their cache rows too) once an eighth of it has ended, without changing what is sampled: at SmolLM2's shapes
with responses ending at spread-out lengths (mean 18 of 32 tokens) a ``generate`` of 8 prompts × 4 samples ran
3.57 → 2.87 s on the 2-core AMD EPYC (``benchmarks/hf_decode.py``).

Prompts run through the module's forward. Decode steps of the model types :mod:`hybridrl.modeling.decode_step`
covers run straight on the weights (``rollout.hf_fast_decode``, on by default: the same logits bit for bit on CPU,
without the modules' per-step dispatch); other models run the module's forward every step. On a CPU with native
bf16 either way multiplies against weights packed once per ``generate`` for oneDNN
(:mod:`hybridrl.modeling.prepacked`: the same bits, without a weight reorder in every decode-step product; fp32 is
not packed by default, see there why).

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
import torch.distributed as dist
from torch import nn
from transformers import DynamicCache

from hybridrl.protocol import Batch, Fields
from hybridrl.protocol.rollout_layout import assemble_rollout, response_mask_from_eos
from hybridrl.modeling.decode_step import DecodeStep, fast_decode_unsupported
from hybridrl.modeling.positions import position_ids_from_mask
from hybridrl.modeling.prepacked import linears_prepacked
from hybridrl.modeling.routing_replay import recorded_routing, require_routers, routers
from hybridrl.modeling.sequences import accepts_logits_to_keep, last_positions
from hybridrl.modeling.single_rank import compute_parameters_in_place
from hybridrl.rollout.base import SamplingParams
from hybridrl.rollout.prompt_images import PromptImages, vision_token_ids
from hybridrl.rollout.routing_capture import RoutingCapture, with_routing
from hybridrl.rollout.sampling import next_tokens

logger = logging.getLogger(__name__)


class HFRollout:
    """Batched generation with a KV cache on left-padded prompts, returning the rollout layout of ``rollout.base``."""

    generates_with_actor_module = True
    serves_requests = False  # one batch per call, in lockstep with the other FSDP ranks: no request queue

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
        self._noted_no_sleep = False
        self._noted_path = False

    @torch.no_grad()
    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        was_training = self.model.training
        self.model.eval()
        if params.seed is not None:
            torch.manual_seed(params.seed)
        from hybridrl.modeling.fsdp import parameters_kept_gathered

        prompts_per_chunk = max((self.micro_batch_size or len(prompts) * params.n) // params.n, 1)
        forwards = _Forwards(self.model, fast=self.fast_decode_unsupported is None, prepack=self.prepack)
        self.decode_rows_run = 0
        # one all-gather (and bf16 cast) per layer, not one per decode step; on CPU each weight packed once for oneDNN
        # (the fast step packs its own: the module's products then run once per prompt, not worth a packed copy)
        packs_linears = self.prepack and not forwards.fast
        with parameters_kept_gathered(self.model), linears_prepacked(self.model, enabled=packs_linears), \
                self._routing_recorded() as record:
            chunks = prompts.split_every(prompts_per_chunk)
            pieces = [self._generate_chunk(chunk, params, forwards, record) for chunk in chunks]
        self.model.train(was_training)
        self._note_decode_path(forwards)
        width = params.max_new_tokens
        responses = torch.cat([_pad_right(ids, width, self.pad_token_id) for ids, _, _ in pieces])
        log_probs = torch.cat([_pad_right(lp, width, 0.0) for _, lp, _ in pieces])
        mask = response_mask_from_eos(responses, self.eos_token_ids)
        rollout = assemble_rollout(prompts, params.n, responses, mask, log_probs, self.pad_token_id)
        if record is None:
            return rollout
        return with_routing(rollout, torch.cat([capture.experts for _, _, capture in pieces]))

    def _routing_recorded(self):
        """``recorded_routing`` of the model when ``record_routing``, else a block yielding ``None``."""
        return recorded_routing(self.model) if self.record_routing else contextlib.nullcontext()

    def _generate_chunk(self, prompts: Batch, params: SamplingParams, forwards: "_Forwards",
                        record=None) -> tuple[torch.Tensor, torch.Tensor, Optional[RoutingCapture]]:
        """``b`` prompts → ``b·n`` responses ``[b·n, T]`` (a prompt's ``n`` consecutive; ``T ≤ max_new_tokens``,
        the longest) and their log-probs under ``logits / temperature`` (0 after a row's EOS). Each prompt but its last
        token is run once and its KV cache repeated ``n`` times: the ``n`` samples share the prefill.

        Rows that have ended leave the decode batch, cache included, once enough have (:func:`_rows_to_keep`), so
        later steps run on the rows still decoding. Every step draws one uniform number for every row of the chunk,
        ended or not, so what is sampled is what a loop that kept every row samples wherever a row's logits do not
        depend on how many rows run with it (bf16 on CPU: tested bit for bit; fp32 products of fewer rows can round
        differently in the last bit, which can in rare cases change a draw, never the distribution drawn from).

        With ``record`` (``recorded_routing``'s lists) every forward's routing is placed in a :class:`RoutingCapture`
        of ``[b·n, P + max_new_tokens, routers, k]``; the third value (``None`` without)."""
        input_ids, attention_mask = prompts[Fields.INPUT_IDS], prompts[Fields.ATTENTION_MASK]
        prompt_width = input_ids.shape[1]
        capture = None if record is None else RoutingCapture(
            record, len(prompts) * params.n, prompt_width + params.max_new_tokens, routers(self.model)[0].top_k)
        images = PromptImages.of(self.model, prompts)
        cache = self._shared_prefill(input_ids, attention_mask, params.n, images)
        if capture is not None and cache is not None:
            capture.place(torch.arange(len(prompts)), prompt_width - 1, repeat=params.n)
        input_ids, attention_mask = input_ids.repeat_interleave(params.n, 0), attention_mask.repeat_interleave(params.n, 0)
        positions = position_ids_from_mask(attention_mask) if images is None else images.positions(params.n)
        first_step = {}
        if cache is None:
            cache = DynamicCache(config=getattr(self.model, "config", None))
            # the first forward runs the whole prompts (one sample each: a prompt with images is never one token)
            first_step = {} if images is None else dict(images.inputs)
        else:  # the cache holds all but the last prompt token
            input_ids, positions = input_ids[:, -1:], positions[..., -1:]
        batch = _DecodeBatch(input_ids, attention_mask, positions, cache)
        rows, device = input_ids.shape[0], input_ids.device
        tokens = torch.full((rows, params.max_new_tokens), self.pad_token_id, dtype=torch.long, device=device)
        log_probs = torch.zeros((rows, params.max_new_tokens), dtype=torch.float32, device=device)
        eos = torch.tensor(self.eos_token_ids, dtype=torch.long, device=device)
        step = -1
        for step in range(params.max_new_tokens):
            logits, batch.cache = forwards(batch.input_ids, batch.attention_mask, batch.positions, batch.cache,
                                           {**self._last_logits_only(batch.input_ids), **first_step})
            first_step = {}
            self.decode_rows_run += len(batch.live)
            if capture is not None:  # this step's inputs end at column P + step
                capture.place(batch.live, prompt_width + step)
            token, token_log_prob = self._sample(logits, params, batch, rows)
            tokens[batch.live, step], log_probs[batch.live, step] = token, token_log_prob
            batch.ended |= torch.isin(token, eos)
            if _all_finished(batch.ended):
                break
            batch.advance(token)
            if self.drop_ended_rows:
                batch.drop_ended()
        return tokens[:, :step + 1], log_probs[:, :step + 1], capture

    def _sample(self, logits: torch.Tensor, params: SamplingParams, batch: "_DecodeBatch",
                rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The next token of each of the batch's rows from ``logits [A, V]`` and its log-prob under ``logits /
        temperature`` (``[A]`` each; the pad token and 0 for rows that have ended). One uniform number is drawn for
        each of the chunk's ``rows``, in the batch or not, and the batch's rows take theirs."""
        scaled = logits / params.effective_temperature
        uniforms = None
        if params.do_sample:
            uniforms = torch.rand((rows, 1), dtype=scaled.dtype, device=scaled.device)[batch.live]
        candidates = scaled
        if len(self.unsampled_token_ids):  # never sampled; the log-prob stays that of the whole distribution
            candidates = scaled.index_fill(-1, self.unsampled_token_ids.to(scaled.device), float("-inf"))
        token = next_tokens(candidates, do_sample=params.do_sample, top_k=params.top_k, top_p=params.top_p,
                            uniforms=uniforms).masked_fill(batch.ended, self.pad_token_id)
        log_prob = scaled.log_softmax(dim=-1).gather(-1, token.unsqueeze(-1)).squeeze(-1)
        return token, log_prob.masked_fill(batch.ended, 0.0)

    def _shared_prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, n: int,
                        images: Optional[PromptImages] = None):
        """The KV cache of ``[b, P - 1]`` prompt prefixes, repeated to ``b·n`` rows (``None`` for ``n == 1`` or
        one-token prompts: the decode loop's first forward then runs the whole prompt). ``images``: the prompts'
        images, which the prefix holds (a prompt ends in text: the chat template's assistant header)."""
        if n == 1 or input_ids.shape[1] < 2:
            return None
        prefix_mask = attention_mask[:, :-1]
        vision = {} if images is None else {**images.inputs, "position_ids": images.prompt_positions[..., :-1]}
        cache = self.model(input_ids=input_ids[:, :-1], attention_mask=prefix_mask,
                           **{"position_ids": position_ids_from_mask(prefix_mask), **vision}, use_cache=True,
                           **self._last_logits_only(input_ids[:, :-1])).past_key_values
        cache.batch_repeat_interleave(n)
        return cache

    def _last_logits_only(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """The forward's keyword that runs the LM head on the last position of ``input_ids [R, L]`` alone (no
        ``[R, L, V]`` logits), as an index tensor, never an int (see ``sequences.last_positions``); ``{}`` for a
        model without ``logits_to_keep``."""
        if not accepts_logits_to_keep(self.model):
            return {}
        return {"logits_to_keep": last_positions(input_ids.shape[1], 1, device=input_ids.device)}

    def _note_decode_path(self, forwards: "_Forwards") -> None:
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
        """Nothing to do: this engine generates with the training module itself."""

    def release_memory(self) -> None:
        if not self._noted_no_sleep:
            logger.info("rollout.name=hf keeps no separate cache between steps; release_memory is a no-op")
            self._noted_no_sleep = True

    def resume(self) -> None:
        """Nothing was released (see ``release_memory``)."""


class _Forwards:
    """The decode loop's forwards within one ``generate``: the module's for prompts, then, if ``fast``, a
    :class:`DecodeStep` built at its first one-token step (after a module forward has gathered the parameters) and
    reused by every chunk; if it cannot be built (``failure``) the module's forward runs on."""

    def __init__(self, model: nn.Module, *, fast: bool, prepack: bool = True) -> None:
        self.model, self.fast, self.prepack = model, fast, prepack
        self.step: Optional[DecodeStep] = None
        self.failure: Optional[str] = None

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor, cache,
                 head_kwargs: dict) -> tuple[torch.Tensor, object]:
        """Next-token logits ``[R, V]`` (fp32) of ``input_ids [R, q]`` after ``cache``, and the cache: a
        ``DynamicCache``, or once the fast step has taken over its per-layer ``[keys, values]`` lists."""
        if isinstance(cache, list) or (input_ids.shape[1] == 1 and cache.get_seq_length() > 0 and self._ready()):
            if not isinstance(cache, list):
                cache = DecodeStep.cache_from(cache)
            return self.step(input_ids, positions, attention_mask, cache).float(), cache
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                            past_key_values=cache, use_cache=True, **head_kwargs).logits[:, -1].float()
        return logits, cache

    def _ready(self) -> bool:
        if self.step is None and self.fast and self.failure is None:
            try:
                with compute_parameters_in_place(self.model):
                    self.step = DecodeStep(self.model, prepack=self.prepack)
            except (ValueError, AttributeError) as error:  # e.g. shards not gathered; a renamed module attribute
                self.failure = f"the fast decode step could not be built ({error})"
        return self.step is not None


class _DecodeBatch:
    """The rows a chunk's decode loop runs: which of the chunk's rows they are (``live [A]``, in order), which of them
    have sampled an EOS (``ended [A]``), their next inputs (``input_ids``/``positions [A, q]``, ``attention_mask
    [A, L]``) and their KV cache."""

    def __init__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor, cache) -> None:
        self.input_ids, self.attention_mask, self.positions, self.cache = input_ids, attention_mask, positions, cache
        self.live = torch.arange(input_ids.shape[0], device=input_ids.device)
        self.ended = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    def advance(self, token: torch.Tensor) -> None:
        """Feed ``token [A]`` at the next position."""
        self.input_ids, self.positions = token.unsqueeze(-1), self.positions[..., -1:] + 1
        self.attention_mask = torch.cat([self.attention_mask, self.attention_mask.new_ones(len(token), 1)], dim=1)

    def drop_ended(self) -> None:
        """Drop the rows that have ended, cache included, when :func:`_rows_to_keep` finds it worth it."""
        keep = _rows_to_keep(self.ended, self.cache)
        if keep is None:
            return
        self.live, self.ended, self.input_ids, self.attention_mask = (
            t[keep] for t in (self.live, self.ended, self.input_ids, self.attention_mask))
        self.positions = self.positions.index_select(-2, keep)  # [A, q], or mRoPE's [3, A, q]
        self.cache = _select_rows(self.cache, keep)


def _all_finished(finished: torch.Tensor) -> bool:
    """Whether every row on every rank has ended. With several ranks (FSDP2) all of them keep stepping until the
    last finishes, so that each runs the same forwards (transformers' ``synced_gpus``)."""
    remaining = (~finished).sum()
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(remaining)
    return int(remaining) == 0


def _rows_to_keep(ended: torch.Tensor, cache) -> Optional[torch.Tensor]:
    """The indices of the rows still decoding (``~ended [R]``) when it is worth dropping the others: at least an
    eighth of the batch has ended (dropping copies the cache once, about what one step's cache growth copies) and
    some row has not (with several ranks a rank whose rows have all ended keeps stepping with them until every rank
    has finished). ``None``: keep the batch as it is (also for a cache that cannot drop rows)."""
    done = int(ended.sum())
    if done == 0 or done * 8 < ended.numel() or done == ended.numel():
        return None
    if not isinstance(cache, list) and not hasattr(cache, "batch_select_indices"):
        return None
    return (~ended).nonzero().squeeze(1)


def _select_rows(cache, rows: torch.Tensor):
    """``cache`` (per-layer ``[keys, values]`` lists, or a transformers cache) with only the batch rows ``rows``."""
    if isinstance(cache, list):
        return [[keys[rows], values[rows]] for keys, values in cache]
    cache.batch_select_indices(rows)
    return cache


def _pad_right(values: torch.Tensor, width: int, fill: float) -> torch.Tensor:
    if values.shape[1] >= width:
        return values[:, :width]
    padding = values.new_full((values.shape[0], width - values.shape[1]), fill)
    return torch.cat([values, padding], dim=1)
