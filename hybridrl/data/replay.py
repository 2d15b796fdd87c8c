"""A prioritized replay buffer of prompts, for continual RL on a stream of new prompts.

Each training step can mix a few prompts seen before back into its batch, chosen with probability proportional to
``(priority + eps) ** alpha`` — ``alpha = 0`` is uniform replay, larger ``alpha`` favours high-priority prompts. A
natural priority for group estimators (GRPO/RLOO) is the spread of the prompt's rewards in its last group
(:func:`group_score_spread`): a prompt the policy always or never solves carries no learning signal, a prompt it
sometimes solves does. When full, adding evicts the lowest-priority item (the oldest among equals).

Sampling is without replacement inside one draw and reproducible: the generator is seeded by ``(seed, step)``.
Items are opaque to the buffer (a one-row prompt ``Batch`` in the trainer); each has a unique ``key`` (re-adding a
key refreshes its item and priority).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Hashable, Sequence, TypeVar

import torch

T = TypeVar("T")


@dataclass
class _Entry(Generic[T]):
    item: T
    priority: float
    added: int


class PrioritizedReplay(Generic[T]):
    """Args: ``capacity`` (items kept), ``alpha`` (priority exponent, >= 0), ``eps`` (floor so every item can be
    drawn), ``seed``."""

    def __init__(self, capacity: int, *, alpha: float = 1.0, eps: float = 1e-3, seed: int = 0) -> None:
        if capacity < 1:
            raise ValueError(f"replay capacity must be >= 1, got {capacity}")
        if alpha < 0 or eps <= 0:
            raise ValueError(f"replay needs alpha >= 0 and eps > 0, got alpha={alpha}, eps={eps}")
        self.capacity, self.alpha, self.eps, self.seed = capacity, alpha, eps, seed
        self.entries: dict[Hashable, _Entry[T]] = {}
        self._clock = 0

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, key: Hashable, item: T, priority: float) -> None:
        """Insert or refresh ``key``; evict the lowest-priority (then oldest) entry if over capacity."""
        if priority < 0:
            raise ValueError(f"replay priority must be >= 0, got {priority} for {key!r}")
        self._clock += 1
        self.entries[key] = _Entry(item, float(priority), self._clock)
        if len(self.entries) > self.capacity:
            victim = min(self.entries, key=lambda k: (self.entries[k].priority, self.entries[k].added))
            del self.entries[victim]

    def probabilities(self) -> tuple[list[Hashable], torch.Tensor]:
        """Keys in insertion order and their draw probabilities ``[len]`` (float64, sums to 1)."""
        keys = list(self.entries)
        weights = torch.tensor([(self.entries[k].priority + self.eps) ** self.alpha for k in keys],
                               dtype=torch.float64)
        return keys, weights / weights.sum()

    def sample(self, count: int, step: int) -> list[tuple[Hashable, T]]:
        """``min(count, len)`` distinct ``(key, item)`` pairs, drawn ∝ priority^alpha, reproducibly for ``step``."""
        if count <= 0 or not self.entries:
            return []
        keys, probabilities = self.probabilities()
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        chosen = torch.multinomial(probabilities, min(count, len(keys)), replacement=False, generator=generator)
        return [(keys[i], self.entries[keys[i]].item) for i in chosen.tolist()]

    def state_dict(self) -> dict[str, Any]:
        return {"entries": [(k, e.item, e.priority, e.added) for k, e in self.entries.items()], "clock": self._clock}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.entries = {k: _Entry(item, priority, added) for k, item, priority, added in state["entries"]}
        self._clock = int(state["clock"])


def group_score_spread(scores: Sequence[float]) -> float:
    """Population standard deviation of one prompt's response scores (0 when all responses scored the same)."""
    values = torch.tensor(list(scores), dtype=torch.float64)
    return float(values.std(unbiased=False)) if len(values) > 1 else 0.0
