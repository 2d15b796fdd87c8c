"""The HF engine's decode loop over one chunk of prompts, a step at a time (:class:`ChunkDecode`), and the pieces it
runs on: the forwards (the module's, or :class:`~hybridrl.modeling.decode_step.DecodeStep` on the weights), the
rows still decoding, and the rule for when ended rows leave the batch. :mod:`hybridrl.rollout.hf_requests` steps it
behind the request interface; :mod:`hybridrl.rollout.hf` says what the engine does as a whole."""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch import nn
from transformers import DynamicCache

from hybridrl.modeling.decode_step import DecodeStep
from hybridrl.modeling.positions import position_ids_from_mask
from hybridrl.modeling.routing_replay import routers
from hybridrl.modeling.sequences import accepts_logits_to_keep, last_positions
from hybridrl.modeling.single_rank import compute_parameters_in_place
from hybridrl.protocol import Batch, Fields
from hybridrl.rollout.base import SamplingParams
from hybridrl.rollout.prompt_images import PromptImages
from hybridrl.rollout.routing_capture import RoutingCapture
from hybridrl.rollout.sampling import next_tokens


class ChunkDecode:
    """The decode loop of ``b`` prompts → ``b·n`` responses, one token per :meth:`step` (a prompt's ``n`` rows
    consecutive). Each prompt but its last token is run once and its KV cache repeated ``n`` times: the ``n`` samples
    share the prefill.

    Rows that have ended leave the decode batch, cache included, once enough have (:func:`_rows_to_keep`), so later
    steps run on the rows still decoding. Every step draws one uniform number for every row of the chunk, ended or
    not (from ``generator``, or torch's global one), so what is sampled is what a loop that kept every row samples
    wherever a row's logits do not depend on how many rows run with it (bf16 on CPU: tested bit for bit; fp32
    products of fewer rows can round differently in the last bit, which can in rare cases change a draw, never the
    distribution drawn from). With several ranks (FSDP2) the loop ends when every rank's rows have ended.

    Args:
        engine: the :class:`~hybridrl.rollout.hf.HFRollout` (its module, pad and EOS ids, unsampled ids, switches).
        prompts: ``input_ids`` / ``attention_mask [b, P]`` (left-padded) and, for a vision-language model, the
            prompts' ``Fields.MULTI_MODAL_INPUTS``.
        forwards: the generation's :class:`Forwards`.
        record: ``recorded_routing``'s lists; every forward's routing is then placed in :attr:`capture`
            (``[b·n, P + max_new_tokens, routers, k]``).
    """

    def __init__(self, engine, prompts: Batch, params: SamplingParams, forwards: "Forwards", record=None,
                 generator: Optional[torch.Generator] = None) -> None:
        self.engine, self.params, self.forwards, self.generator = engine, params, forwards, generator
        input_ids, attention_mask = prompts[Fields.INPUT_IDS], prompts[Fields.ATTENTION_MASK]
        self.prompt_width = input_ids.shape[1]
        self.capture = None if record is None else RoutingCapture(
            record, len(prompts) * params.n, self.prompt_width + params.max_new_tokens,
            routers(engine.model)[0].top_k)
        images = PromptImages.of(engine.model, prompts)
        cache = self._shared_prefill(input_ids, attention_mask, params.n, images)
        if self.capture is not None and cache is not None:
            self.capture.place(torch.arange(len(prompts)), self.prompt_width - 1, repeat=params.n)
        input_ids = input_ids.repeat_interleave(params.n, 0)
        attention_mask = attention_mask.repeat_interleave(params.n, 0)
        positions = position_ids_from_mask(attention_mask) if images is None else images.positions(params.n)
        self._first_step = {}
        if cache is None:
            cache = DynamicCache(config=getattr(engine.model, "config", None))
            # the first forward runs the whole prompts (one sample each: a prompt with images is never one token)
            self._first_step = {} if images is None else dict(images.inputs)
        else:  # the cache holds all but the last prompt token
            input_ids, positions = input_ids[:, -1:], positions[..., -1:]
        self.batch = _DecodeBatch(input_ids, attention_mask, positions, cache)
        self.rows, device = input_ids.shape[0], input_ids.device
        self.tokens = torch.full((self.rows, params.max_new_tokens), engine.pad_token_id, dtype=torch.long,
                                 device=device)
        self.log_probs = torch.zeros((self.rows, params.max_new_tokens), dtype=torch.float32, device=device)
        self._eos = torch.tensor(engine.eos_token_ids, dtype=torch.long, device=device)
        self.steps = 0
        self.done = params.max_new_tokens == 0

    def step(self) -> None:
        """One decode step: each row's token and log-prob land in column ``steps`` of :attr:`tokens` /
        :attr:`log_probs` (the pad token and 0 for rows that had ended). Sets :attr:`done` when it was the last."""
        batch, model = self.batch, self.engine.model
        logits, batch.cache = self.forwards(batch.input_ids, batch.attention_mask, batch.positions, batch.cache,
                                            {**_last_logits_only(model, batch.input_ids), **self._first_step})
        self._first_step = {}
        self.engine.decode_rows_run += len(batch.live)
        if self.capture is not None:  # this step's inputs end at column P + step
            self.capture.place(batch.live, self.prompt_width + self.steps)
        token, token_log_prob = self._sample(logits)
        self.tokens[batch.live, self.steps], self.log_probs[batch.live, self.steps] = token, token_log_prob
        batch.ended |= torch.isin(token, self._eos)
        self.steps += 1
        self.done = _all_finished(batch.ended) or self.steps == self.params.max_new_tokens
        if not self.done:
            batch.advance(token)
            if self.engine.drop_ended_rows:
                batch.drop_ended()

    def stop_rows(self, rows: torch.Tensor) -> None:
        """End chunk rows ``rows`` now (an aborted request): they sample no more tokens."""
        self.batch.ended |= torch.isin(self.batch.live, rows.to(self.batch.live.device))

    def _sample(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The next token of each of the batch's rows from ``logits [A, V]`` and its log-prob under ``logits /
        temperature`` (``[A]`` each; the pad token and 0 for rows that have ended). One uniform number is drawn for
        each of the chunk's rows, in the batch or not, and the batch's rows take theirs."""
        params, batch, engine = self.params, self.batch, self.engine
        scaled = logits / params.effective_temperature
        uniforms = None
        if params.do_sample:
            uniforms = torch.rand((self.rows, 1), dtype=scaled.dtype, device=scaled.device,
                                  generator=self.generator)[batch.live]
        candidates = scaled
        if len(engine.unsampled_token_ids):  # never sampled; the log-prob stays that of the whole distribution
            candidates = scaled.index_fill(-1, engine.unsampled_token_ids.to(scaled.device), float("-inf"))
        token = next_tokens(candidates, do_sample=params.do_sample, top_k=params.top_k, top_p=params.top_p,
                            uniforms=uniforms).masked_fill(batch.ended, engine.pad_token_id)
        log_prob = scaled.log_softmax(dim=-1).gather(-1, token.unsqueeze(-1)).squeeze(-1)
        return token, log_prob.masked_fill(batch.ended, 0.0)

    def _shared_prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, n: int,
                        images: Optional[PromptImages] = None):
        """The KV cache of ``[b, P - 1]`` prompt prefixes, repeated to ``b·n`` rows (``None`` for ``n == 1`` or
        one-token prompts: the first step's forward then runs the whole prompt). ``images``: the prompts' images,
        which the prefix holds (a prompt ends in text: the chat template's assistant header)."""
        if n == 1 or input_ids.shape[1] < 2:
            return None
        model = self.engine.model
        prefix_mask = attention_mask[:, :-1]
        vision = {} if images is None else {**images.inputs, "position_ids": images.prompt_positions[..., :-1]}
        cache = model(input_ids=input_ids[:, :-1], attention_mask=prefix_mask,
                      **{"position_ids": position_ids_from_mask(prefix_mask), **vision}, use_cache=True,
                      **_last_logits_only(model, input_ids[:, :-1])).past_key_values
        cache.batch_repeat_interleave(n)
        return cache


def _last_logits_only(model: nn.Module, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """The forward's keyword that runs the LM head on the last position of ``input_ids [R, L]`` alone (no
    ``[R, L, V]`` logits), as an index tensor, never an int (see ``sequences.last_positions``); ``{}`` for a model
    without ``logits_to_keep``."""
    if not accepts_logits_to_keep(model):
        return {}
    return {"logits_to_keep": last_positions(input_ids.shape[1], 1, device=input_ids.device)}


class Forwards:
    """The decode loop's forwards within one generation: the module's for prompts, then, if ``fast``, a
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
