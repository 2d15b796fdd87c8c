"""What every request queue hands back (:class:`Completion`), its pause modes, and the two conversions between a
batch of left-padded prompt rows and one request per response row that ``generate`` of each engine makes."""

from __future__ import annotations

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
