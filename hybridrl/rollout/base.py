"""The rollout engine protocol: generate responses for a batch of prompts, and accept new weights.

Every engine returns the same ``Batch`` layout, the one the trainer and the workers use (docs/architecture.md §2):

- ``prompts [B·n, P]``: the left-padded prompt ids, each prompt repeated ``n`` times consecutively;
- ``responses [B·n, R]``: generated ids, right-padded with the pad id to ``R = max_new_tokens``;
- ``response_mask [B·n, R]``: 1 for generated tokens up to and including the first EOS, 0 after;
- ``input_ids [B·n, P+R]`` / ``attention_mask [B·n, P+R]``: prompt and response side by side;
- ``rollout_log_probs [B·n, R]``: log-probs (nats) of the sampled tokens under the engine's temperature-scaled
  distribution — compared with the trainer's log-probs every step (a mismatch is the first sign of a broken sync);
- non-tensor fields of the prompt batch (``uid``, ``ground_truth``, …) repeated alongside.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Optional, Protocol, Sequence

import torch

from hybridrl.config.schema import RolloutConfig
from hybridrl.protocol import Batch


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings of one generate call. ``do_sample=False`` is greedy decoding (temperature ignored)."""

    n: int = 1
    max_new_tokens: int = 32
    do_sample: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: Optional[int] = None

    @classmethod
    def for_training(cls, rollout: RolloutConfig, max_new_tokens: int, seed: Optional[int] = None) -> "SamplingParams":
        return cls(n=rollout.n, max_new_tokens=max_new_tokens, do_sample=True, temperature=rollout.temperature,
                   top_p=rollout.top_p, top_k=rollout.top_k, seed=seed)

    @classmethod
    def for_validation(cls, rollout: RolloutConfig, max_new_tokens: int,
                       seed: Optional[int] = None) -> "SamplingParams":
        val = rollout.val_kwargs
        return cls(n=val.n, max_new_tokens=max_new_tokens, do_sample=val.do_sample, temperature=val.temperature,
                   top_p=val.top_p, top_k=val.top_k, seed=seed)

    def with_seed(self, seed: int) -> "SamplingParams":
        return replace(self, seed=seed)

    @property
    def effective_temperature(self) -> float:
        """The temperature log-probs are computed at: 1 for greedy decoding."""
        return self.temperature if self.do_sample else 1.0


class RolloutEngine(Protocol):
    """What the colocated worker needs from a generation backend (an instance of a :class:`RolloutEngineClass`)."""

    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        """Responses for ``prompts`` (``input_ids``/``attention_mask`` ``[B, P]``, left-padded) in the layout above."""

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]],
                       policy_version: Optional[int] = None) -> None:
        """Load new weights, given as (Hugging Face parameter name, full tensor) pairs, streamed, and the trainer's
        ``policy_version`` of them (docs/concepts.md, "One policy version"; ``None``: one more than held)."""

    def release_memory(self) -> None:
        """Free the engine's cache memory during training (no-op where unsupported)."""

    def resume(self) -> None:
        """Restore what ``release_memory`` freed, before the next ``generate``."""


class RequestQueue(Protocol):
    """Request-level generation on one engine (``VLLMRequests``, ``HFRequests``): token ids in; token ids, their
    log-probs and each token's ``policy_version`` out, many requests in flight. What the replica server
    (``rollout/server.py``) drives, for multi-turn episodes, partial rollout and every engine's ``generate``."""

    def submit(self, prompt_token_ids: Sequence[int], params: SamplingParams, request_id: Optional[str] = None,
               streamed: bool = True) -> str:
        """Queue one request (one response); it starts at the next :meth:`step`. Returns its id."""

    def step(self) -> list:
        """One engine step; the ``Completion`` s it advanced (``finish_reason`` set on those that ended)."""

    def has_work(self) -> bool:
        """Whether any request is in flight."""

    def abort(self, request_id: str):
        """End ``request_id`` now, keeping the tokens it has."""

    def pause(self, mode: str) -> list:
        """``abort`` / ``wait`` / ``keep`` the requests in flight (around a weight update)."""

    def resume(self) -> list[str]:
        """Generate again (kept requests continue)."""

    @property
    def in_flight(self) -> list[str]:
        """Ids of the requests in flight."""

    @property
    def paused(self) -> Optional[str]:
        """The pause mode in force, or ``None``."""


class RolloutEngineClass(Protocol):
    """What ``ROLLOUT_ENGINES`` holds: an engine class that says what it is and builds itself."""

    generates_with_actor_module: bool
    """``True``: samples from the actor's own training module (nothing to sync); ``False``: holds its own copy of
    the weights, which the actor worker streams every update into (``update_weights``)."""

    serves_requests: bool
    """``True``: an instance has ``requests`` (a :class:`RequestQueue`), ``eos_token_ids`` and ``pad_token_id`` —
    what multi-turn episodes run on. Optional on a registered class (absent: ``False``)."""

    def from_inputs(self, inputs) -> RolloutEngine:
        """The engine for ``inputs`` (:class:`hybridrl.rollout.EngineInputs`)."""
