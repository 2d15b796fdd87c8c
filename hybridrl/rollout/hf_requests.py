"""Request-level generation on the HF engine: what its replica server (``rollout/server.py``) drives.

The HF engine decodes a batch of rows in lockstep on the training module, so requests run in **cohorts**: at a step
with no cohort running, the requests waiting (first come, first served) become one — left-padded together, the
consecutive requests for the same prompt with the same sampling settings sharing that prompt's prefill (up to
``samples_per_prompt`` of them); it takes groups of one size and one set of settings, up to
``prompts_per_cohort`` prompts, and the rest wait — and each step decodes one token for every row of it
(:class:`~hybridrl.rollout.hf_decode.ChunkDecode`). Requests submitted meanwhile wait for the next cohort. A request
ends at its EOS (``stop``) or its length; an abort ends it at once; ``pause`` / ``resume`` behave as
``VLLMRequests``'s (a kept request continues in a later cohort, its prefix recomputed).

Seeds: the requests of one cohort draw from one generator, seeded from its first request's seed; a cohort whose
first seed is the one already in use continues that stream. ``HFRollout.generate`` gives every row its call's
seed, so a batch split into cohorts (``micro_batch_size``) samples what one stream over those cohorts samples.
Without a seed the draws come from torch's global generator. What a row samples depends on the cohort it ran in —
unlike vLLM's per-request streams: the HF engine is the reference for exactness, not for request independence.
"""

from __future__ import annotations

import collections
import itertools
from dataclasses import dataclass, replace
from typing import Callable, Optional, Sequence

import torch

from hybridrl.protocol import Batch, Fields
from hybridrl.rollout.base import SamplingParams
from hybridrl.rollout.completion import Completion, PausableRequests
from hybridrl.rollout.hf_decode import ChunkDecode, Forwards
from hybridrl.rollout.routing_capture import RoutingCapture


@dataclass
class _Cohort:
    """The requests decoding together: ``rows[r]`` is chunk row ``r``'s completion (``None`` once it left),
    ``active [rows]`` which rows still decode for a request, ``streamed`` those whose request hears of every token,
    ``handed[r]`` how many of this cohort's tokens row ``r``'s completion holds. The tokens stay in the decode's
    tensors until handed over: a streamed request's after every step, another's when it ends."""

    decode: ChunkDecode
    rows: list[Optional[Completion]]
    active: torch.Tensor
    streamed: set[int]
    handed: list[int]

    @classmethod
    def of(cls, decode: ChunkDecode, completions: list[Completion]) -> "_Cohort":
        active = torch.ones(len(completions), dtype=torch.bool, device=decode.tokens.device)
        streamed = {row for row, completion in enumerate(completions) if completion.streamed}
        return cls(decode, list(completions), active, streamed, [0] * len(completions))

    def hand(self, row: int, version: Optional[int]) -> Completion:
        """Row ``row``'s tokens so far, appended to its completion."""
        completion, start, end = self.rows[row], self.handed[row], self.decode.steps
        completion.token_ids += self.decode.tokens[row, start:end].tolist()
        completion.log_probs += self.decode.log_probs[row, start:end].tolist()
        completion.policy_versions += [version] * (end - start)
        self.handed[row] = end
        return completion

    def finish(self, row: int, version: Optional[int], reason: str) -> Completion:
        """End row ``row``'s request: its tokens handed over, ``finish_reason`` set, the row left."""
        completion = self.hand(row, version)
        completion.finish_reason = reason
        self.rows[row] = None
        self.active[row] = False
        self.streamed.discard(row)
        return completion


class HFRequests(PausableRequests):
    """The request queue of the HF engine for one serving session (module docstring).

    Args:
        engine: the :class:`~hybridrl.rollout.hf.HFRollout`.
        forwards: the session's :class:`~hybridrl.rollout.hf_decode.Forwards` (the caller keeps the parameters
            gathered and packed around the session).
        version: the ``policy_version`` of the weights the module holds now.
        prompt_width: the least width cohorts are left-padded to (``generate``: its prompts' ``P``, so each row
            runs at the shape it has in the batch).
        samples_per_prompt: how many consecutive requests for one prompt share its prefill (``generate``: ``n``).
        prompts_per_cohort: at most this many prompts per cohort (``None``: every request waiting).
        images: the vision inputs (``Fields.MULTI_MODAL_INPUTS`` entries) of requests with images, by request id.
        record: ``recorded_routing``'s lists: each cohort's routing is then kept in :attr:`captures`.
        device: where the cohorts' tensors go (the module's device).
    """

    def __init__(self, engine, forwards: Forwards, *, version: Callable[[], Optional[int]] = lambda: None,
                 prompt_width: int = 0, samples_per_prompt: int = 1, prompts_per_cohort: Optional[int] = None,
                 images: Optional[dict[str, dict]] = None, record=None,
                 device: torch.device | str = "cpu") -> None:
        super().__init__()
        self._engine, self._forwards, self._version = engine, forwards, version
        self._prompt_width, self._samples_per_prompt = prompt_width, max(samples_per_prompt, 1)
        self._prompts_per_cohort, self._images, self._record = prompts_per_cohort, images or {}, record
        self._device = torch.device(device)
        self._eos = torch.tensor(engine.eos_token_ids, dtype=torch.long, device=self._device)
        self._waiting: collections.deque[Completion] = collections.deque()
        self._cohort: Optional[_Cohort] = None
        self._generator: Optional[torch.Generator] = None
        self._generator_seed: Optional[int] = None
        self.captures: list[RoutingCapture] = []
        """Each finished cohort's routing, in order (with ``record``)."""

    # --- submitting and stepping ---------------------------------------------------------------------------------

    def submit(self, prompt_token_ids: Sequence[int], params: SamplingParams, request_id: Optional[str] = None,
               streamed: bool = True) -> str:
        """Queue one request (one response: ``params.n`` is ignored); it joins the next cohort. Its id."""
        completion = self._new_request(prompt_token_ids, params, request_id, streamed)
        self._waiting.append(completion)
        return completion.request_id

    @property
    def in_flight(self) -> list[str]:
        """Ids of the requests decoding or waiting for a cohort."""
        running = [] if self._cohort is None else [c.request_id for c in self._cohort.rows if c is not None]
        return running + [completion.request_id for completion in self._waiting]

    def has_work(self) -> bool:
        """Whether a cohort is decoding (with several ranks: until every rank's rows have ended) or one waits."""
        return self._cohort is not None or bool(self._waiting)

    @torch.no_grad()
    def step(self) -> list[Completion]:
        """One decode step of the running cohort (started first from the requests waiting if none runs); the
        completions it advanced (streamed ones) or finished."""
        if self._paused is not None:
            raise RuntimeError(f"the engine is paused ({self._paused!r}); resume() before stepping")
        if not self.has_work():
            return []
        cohort = self._cohort = self._cohort or self._start_cohort()
        decode, version = cohort.decode, self._version()
        if decode.done:  # max_new_tokens = 0: the cohort ends with no token decoded
            return self._end_cohort(version)
        decode.step()
        touched = [cohort.hand(row, version) for row in sorted(cohort.streamed)]
        stopping = torch.isin(decode.tokens[:, decode.steps - 1], self._eos) & cohort.active
        ending = cohort.active if decode.steps >= decode.params.max_new_tokens else stopping
        stopped = stopping.tolist()
        for row in ending.nonzero().flatten().tolist():
            completion = cohort.finish(row, version, "stop" if stopped[row] else "length")
            if not completion.streamed:
                touched.append(completion)
        if decode.done:
            touched += self._end_cohort(version)
        return touched

    def run(self) -> list[Completion]:
        """Step until nothing is in flight; the completions that finished, in the order they finished."""
        done = []
        while self.has_work():
            done += [completion for completion in self.step() if completion.finished]
        return done

    def abort(self, request_id: str) -> Completion:
        """End ``request_id`` now; its completion keeps the tokens generated so far (``finish_reason="abort"``)."""
        for completion in self._waiting:
            if completion.request_id == request_id:
                self._waiting.remove(completion)
                completion.finish_reason = "abort"
                return completion
        rows = [] if self._cohort is None else self._cohort.rows
        for row, completion in enumerate(rows):
            if completion is not None and completion.request_id == request_id:
                self._cohort.decode.stop_rows(torch.tensor([row]))
                return self._cohort.finish(row, self._version(), "abort")
        raise KeyError(f"request {request_id!r} is not in flight")

    # --- pause and resume ---------------------------------------------------------------------------------------

    def _requeue(self, completion: Completion) -> None:
        self._waiting.append(completion)

    # --- cohorts ------------------------------------------------------------------------------------------------

    def _start_cohort(self) -> _Cohort:
        """The requests waiting, grouped by prompt, as one cohort (module docstring)."""
        groups = self._take_groups()
        prompts = self._prompt_batch([group[0] for group in groups])
        params = groups[0][0].continuation()[1]
        decode = ChunkDecode(self._engine, prompts, replace(params, n=len(groups[0])), self._forwards,
                             self._record, self._generator_for(params.seed))
        return _Cohort.of(decode, [completion for group in groups for completion in group])

    def _end_cohort(self, version: Optional[int]) -> list[Completion]:
        """Retire the cohort; the completions it still held, now finished (all of them when ``max_new_tokens`` is 0;
        otherwise none: its rows have all ended)."""
        cohort, self._cohort = self._cohort, None
        if cohort.decode.capture is not None:
            self.captures.append(cohort.decode.capture)
        return [cohort.finish(row, version, "length") for row in cohort.active.nonzero().flatten().tolist()]

    def _take_groups(self) -> list[list[Completion]]:
        """The waiting requests of the next cohort: consecutive groups of the same size and sampling settings."""
        groups: list[list[Completion]] = []
        while self._waiting and (self._prompts_per_cohort is None or len(groups) < self._prompts_per_cohort):
            group = self._leading_group()
            if groups and (len(group) != len(groups[0]) or _settings(group[0]) != _settings(groups[0][0])):
                break
            groups.append([self._waiting.popleft() for _ in group])
        return groups

    def _leading_group(self) -> list[Completion]:
        """The first waiting request and those after it for the same prompt and settings (≤ samples_per_prompt)."""
        first = self._waiting[0]
        group = [first]
        for completion in itertools.islice(self._waiting, 1, self._samples_per_prompt):
            if not _same_prompt(completion, first) or _settings(completion) != _settings(first):
                break
            group.append(completion)
        return group

    def _prompt_batch(self, firsts: list[Completion]) -> Batch:
        """The cohort's prompts, one per group, left-padded to at least ``prompt_width``, with their images."""
        prompts = [completion.continuation()[0] for completion in firsts]
        width = max([self._prompt_width] + [len(prompt) for prompt in prompts])
        input_ids = torch.full((len(prompts), width), self._engine.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
            attention_mask[row, width - len(prompt):] = 1
        tensors = {Fields.INPUT_IDS: input_ids.to(self._device), Fields.ATTENTION_MASK: attention_mask.to(self._device)}
        images = [self._images.get(completion.request_id) for completion in firsts]
        non_tensors = {Fields.MULTI_MODAL_INPUTS: images} if any(image is not None for image in images) else {}
        return Batch(tensors=tensors, non_tensors=non_tensors)

    def _generator_for(self, seed: Optional[int]) -> Optional[torch.Generator]:
        """The cohort's generator: the one in use when ``seed`` is its seed, a new one seeded so otherwise."""
        if seed is None:
            return None
        if seed != self._generator_seed:
            self._generator = torch.Generator(device=self._device).manual_seed(seed)
            self._generator_seed = seed
        return self._generator


def _settings(completion: Completion) -> SamplingParams:
    """What must agree for requests to decode in one cohort: the sampling settings but the seed (and ``n``,
    always 1 here), with the tokens left as the length."""
    return replace(completion.params, seed=None, max_new_tokens=completion.remaining_tokens)


def _same_prompt(one: Completion, other: Completion) -> bool:
    """Whether two requests continue from the same ids (their prompts followed by the tokens they have)."""
    return (len(one.prompt_token_ids) + len(one.token_ids) == len(other.prompt_token_ids) + len(other.token_ids)
            and one.prompt_token_ids + one.token_ids == other.prompt_token_ids + other.token_ids)
