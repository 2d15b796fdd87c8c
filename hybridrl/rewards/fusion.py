"""Reward fusion: several per-sequence reward components combined into one score, each logged on its own.

    fused_i = clip( Σ_k w_k · norm_k(s_k,i),  max = cap )

- components ``s_k`` ``[B]``: the rule score (``rule``), the reward model's score (``rm``), and the reward-hacking
  guards below (already signed as penalties, ≤ 0);
- ``norm_k``: optional per-component normalisation by a running mean/std over all batches seen so far
  (:class:`RunningMeanStd`, updated with the batch before it is normalised) — a reward model's arbitrary offset and
  scale then cannot swamp a 0/1 rule score;
- ``cap``: an upper bound on the fused reward (a reward model that found an exploit cannot pay more than this);
- dynamic weighting (``scales``): a component listed there has its weight divided by the running standard deviation
  of its raw values (``w_k / σ_k``, all batches so far, this one included; ``w_k`` while ``σ_k`` is still 0), so each
  contributes in proportion to its weight whatever its native spread — a component that turns noisy is damped, one
  that settles is not drowned. The effective weights are logged (``reward/<name>/weight``).

Guards (pure functions of the batch):

- :func:`length_penalty` ``−coef · L / L_max`` — a linear length guard (DAPO's soft overlong buffer is the separate
  ``algorithm.overlong_buffer`` shaper);
- :func:`diversity_penalty` ``−coef · mean similarity to the other responses of the same prompt`` (character-bigram
  Jaccard similarity of the texts): groups of near-identical responses are penalised.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Optional

import torch

__all__ = ["RunningMeanStd", "length_penalty", "diversity_penalty", "text_similarity", "fuse_rewards"]


class RunningMeanStd:
    """Mean and standard deviation of every value seen so far (Chan et al.'s parallel update, float64)."""

    def __init__(self) -> None:
        self.count = 0
        self.mean = 0.0
        self.m2 = 0.0  # sum of squared deviations from the mean

    def update(self, values: torch.Tensor) -> None:
        values = values.detach().double().flatten()
        if values.numel() == 0:
            return
        count, mean = values.numel(), float(values.mean())
        m2 = float(((values - mean) ** 2).sum())
        total = self.count + count
        delta = mean - self.mean
        self.mean += delta * count / total
        self.m2 += m2 + delta ** 2 * self.count * count / total
        self.count = total

    @property
    def std(self) -> float:
        """Population standard deviation (0 before two values)."""
        return (self.m2 / self.count) ** 0.5 if self.count > 1 else 0.0

    def normalize(self, values: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        """``(values − mean) / max(std, eps)`` with the current statistics."""
        return (values - self.mean) / max(self.std, eps)

    def state_dict(self) -> dict[str, float]:
        return {"count": self.count, "mean": self.mean, "m2": self.m2}

    def load_state_dict(self, state: Mapping[str, float]) -> None:
        self.count, self.mean, self.m2 = int(state["count"]), float(state["mean"]), float(state["m2"])


def length_penalty(response_lengths: torch.Tensor, max_response_length: int, coef: float) -> torch.Tensor:
    """``[B]`` ``−coef · L / L_max`` for response lengths ``L`` ``[B]`` (tokens)."""
    return -coef * response_lengths.float() / float(max_response_length)


def text_similarity(first: str, second: str) -> float:
    """Jaccard similarity of the character-bigram sets of two texts (1 for equal texts, 0 for disjoint ones)."""
    def bigrams(text: str) -> set[str]:
        return {text[i:i + 2] for i in range(max(len(text) - 1, 1))} if text else set()

    a, b = bigrams(first), bigrams(second)
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def diversity_penalty(texts: Sequence[str], group_ids: Sequence[object], coef: float) -> torch.Tensor:
    """``[B]`` ``−coef ×`` each response's mean similarity to the *other* responses of its group (0 alone)."""
    penalties = torch.zeros(len(texts))
    members: dict[object, list[int]] = {}
    for index, group in enumerate(group_ids):
        members.setdefault(group, []).append(index)
    for rows in members.values():
        for row in rows:
            others = [text_similarity(texts[row], texts[other]) for other in rows if other != row]
            if others:
                penalties[row] = -coef * sum(others) / len(others)
    return penalties


def fuse_rewards(components: Mapping[str, torch.Tensor], weights: Mapping[str, float], *,
                 normalizers: Optional[Mapping[str, RunningMeanStd]] = None,
                 scales: Optional[Mapping[str, RunningMeanStd]] = None,
                 cap: Optional[float] = None) -> tuple[torch.Tensor, dict[str, float]]:
    """The fused reward ``[B]`` of ``components`` (name → ``[B]``) and per-component metrics.

    A component listed in ``normalizers`` is normalised by its running statistics after they see this batch; one
    listed in ``scales`` has its weight divided by the running std of its raw values (dynamic weighting). Every
    component needs a weight. Metrics: ``reward/<name>/mean`` (raw), ``reward/<name>/std``, ``reward/<name>/weight``
    (effective), ``reward/fused/mean`` and ``reward/capped_fraction``.
    """
    missing = sorted(set(components) - set(weights))
    if missing:
        raise ValueError(f"reward components {missing} have no weight")
    normalizers, scales = normalizers or {}, scales or {}
    fused = None
    metrics: dict[str, float] = {}
    for name, values in components.items():
        values = values.float()
        metrics[f"reward/{name}/mean"] = float(values.mean())
        metrics[f"reward/{name}/std"] = float(values.std(unbiased=False)) if values.numel() > 1 else 0.0
        weight = weights[name]
        if name in scales:
            scales[name].update(values)
            weight = weight / scales[name].std if scales[name].std > 0 else weight
        if name in normalizers:
            normalizers[name].update(values)
            values = normalizers[name].normalize(values).float()
        metrics[f"reward/{name}/weight"] = weight
        term = weight * values
        fused = term if fused is None else fused + term
    if fused is None:
        raise ValueError("no reward components to fuse")
    if cap is not None:
        metrics["reward/capped_fraction"] = float((fused > cap).float().mean())
        fused = fused.clamp(max=cap)
    metrics["reward/fused/mean"] = float(fused.mean())
    return fused, metrics
