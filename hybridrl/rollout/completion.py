"""What every request queue hands back (:class:`Completion`), what every queue does alike (submitting's checks,
``pause`` / ``resume``: :class:`PausableRequests`), and the two conversions between a batch of left-padded prompt
rows and one request per response row that ``generate`` of each engine makes."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Literal, Optional, Sequence

import torch

from hybridrl.protocol import Batch, Fields
from hybridrl.rollout.base import SamplingParams
from hybridrl.utils.seeding import derive_seed

PauseMode = Literal["abort", "wait", "keep"]
PAUSE_MODES = ("abort", "wait", "keep")


@dataclass
class Completion:
    """One request's tokens so far. ``log_probs[k]`` and ``policy_versions[k]`` belong to ``token_ids[k]``;
    ``finish_reason`` is ``"stop"`` (a stop token, kept as the last token), ``"length"``, ``"abort"`` or ``None``
    while it runs. ``cached_prompt_tokens``: prompt tokens whose KV came from vLLM's prefix cache (whole blocks
    another request computed) instead of this request's prefill."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    policy_versions: list[int] = field(default_factory=list)
    finish_reason: Optional[str] = None
    resubmissions: int = 0
    streamed: bool = True
    cached_prompt_tokens: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def remaining_tokens(self) -> int:
        return self.params.max_new_tokens - len(self.token_ids)

    def continuation(self) -> tuple[list[int], SamplingParams]:
        """What an engine runs for the rest of this request: its prompt followed by the tokens it has, for the
        tokens it has left; a resubmitted (``pause("keep")``) seeded request continues from a seed derived from its
        own and the resubmission count."""
        params = replace(self.params, max_new_tokens=self.remaining_tokens)
        if self.resubmissions and params.seed is not None:
            params = replace(params, seed=derive_seed(params.seed, "resubmission", self.resubmissions))
        return self.prompt_token_ids + self.token_ids, params


class PausableRequests:
    """``pause`` / ``resume`` of a request queue, the same for every engine's (modes in ``vllm_requests``'s module
    docstring). A queue gives ``run()`` (step until nothing is in flight), ``abort(request_id)``, ``in_flight``,
    ``_requeue(completion)`` (resubmit a kept request) and may refuse a mode (``_pause_refused``)."""

    def __init__(self) -> None:
        self._paused: Optional[str] = None
        self._parked: list[Completion] = []
        self._ids = itertools.count()
        self._submitted: dict[str, Completion] = {}  # by id, unfinished ones among them (finished ones pruned)
        self._pruned_at = 512

    def pause(self, mode: PauseMode) -> list[Completion]:
        """Stop generating, e.g. around a weight update. Returns the completions that ended (``abort``, ``wait``)
        or were parked (``keep``)."""
        if mode not in PAUSE_MODES:
            raise ValueError(f"pause mode must be one of {PAUSE_MODES}, got {mode!r}")
        if self._paused is not None:
            raise RuntimeError(f"the engine is already paused ({self._paused!r})")
        refusal = self._pause_refused(mode)
        if refusal:
            raise RuntimeError(refusal)
        if mode == "wait":
            affected = self.run()
        else:
            affected = [self.abort(request_id) for request_id in self.in_flight]
            if mode == "keep":
                for completion in affected:
                    completion.finish_reason = None
                self._parked = affected
        self._paused = mode
        return affected

    @property
    def paused(self) -> Optional[str]:
        """The pause mode in force, or ``None``."""
        return self._paused

    def resume(self) -> list[str]:
        """Generate again; requests parked by ``pause("keep")`` are resubmitted (ids of those resubmitted)."""
        if self._paused is None:
            raise RuntimeError("resume() without pause()")
        self._paused = None
        parked, self._parked = self._parked, []
        for completion in parked:
            if completion.remaining_tokens <= 0:
                completion.finish_reason = "length"
                continue
            completion.resubmissions += 1
            self._requeue(completion)
        return [completion.request_id for completion in parked if not completion.finished]

    def _new_request(self, prompt_token_ids: Sequence[int], params: SamplingParams, request_id: Optional[str],
                     streamed: bool) -> Completion:
        """The completion of a request to submit (one response: ``params.n`` is ignored), or why it is refused."""
        if self._paused is not None:
            raise RuntimeError(f"the engine is paused ({self._paused!r}); resume() before submitting")
        if not prompt_token_ids:
            raise ValueError("submit: the prompt has no tokens")
        request_id = request_id or f"r{next(self._ids)}"
        earlier = self._submitted.get(request_id)
        # only an id submitted before and not finished can be in flight: the O(n) look is for those alone (a
        # batch's thousands of submits stay linear)
        if earlier is not None and not earlier.finished and request_id in self.in_flight:
            raise ValueError(f"submit: request id {request_id!r} is already in flight")
        completion = Completion(request_id, list(prompt_token_ids), replace(params, n=1), streamed=streamed)
        self._remember(completion)
        return completion

    def _remember(self, completion: Completion) -> None:
        """Index ``completion`` by id; the finished ones go once the index has doubled since the last pruning."""
        self._submitted[completion.request_id] = completion
        if len(self._submitted) >= 2 * self._pruned_at:
            self._submitted = {key: value for key, value in self._submitted.items() if not value.finished}
            self._pruned_at = max(len(self._submitted), 512)

    def _pause_refused(self, mode: PauseMode) -> Optional[str]:
        """Why this queue cannot pause with ``mode`` now (``None``: it can)."""
        return None

    def _requeue(self, completion: Completion) -> None:
        raise NotImplementedError


def unpadded_rows(prompts: Batch) -> list[list[int]]:
    """The real (unpadded) token ids of each ``[B, P]`` prompt row, as Python lists."""
    ids, mask = prompts[Fields.INPUT_IDS], prompts[Fields.ATTENTION_MASK].bool()
    return [row[row_mask].tolist() for row, row_mask in zip(ids, mask)]


def completions_as_rows(rows: Sequence[Completion], width: int,
                        pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``responses [N, width]`` (pad-filled), ``lengths [N]``, ``log_probs [N, width]`` (fp32, 0 past the end) of
    the finished ``rows``, cut at ``width`` tokens."""
    responses = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    log_probs = torch.zeros((len(rows), width), dtype=torch.float32)
    lengths = torch.zeros(len(rows), dtype=torch.long)
    for row, completion in enumerate(rows):
        token_ids = completion.token_ids[:width]
        lengths[row] = len(token_ids)
        responses[row, :len(token_ids)] = torch.tensor(token_ids, dtype=torch.long)
        log_probs[row, :len(token_ids)] = torch.tensor(completion.log_probs[:width], dtype=torch.float32)
    return responses, lengths, log_probs
