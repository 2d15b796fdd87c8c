"""Sample-based accuracy figures of a model on a test set: pass@k and maj@k over ``n`` samples per prompt.

- **pass@k** — the chance that at least one of ``k`` samples is right, estimated without bias from ``n >= k`` samples
  of which ``c`` are right: ``1 - C(n - c, k) / C(n, k)`` (Chen et al., 2021, "Evaluating Large Language Models
  Trained on Code"), averaged over prompts. Computed as a product, so large ``n`` does not overflow.
- **maj@k** — majority voting (self-consistency): among the **first** ``k`` of a prompt's samples, the most frequent
  answer wins (a tie goes to the answer seen first) and the prompt counts as right when that answer was judged right.
  The answer of a sample is what its reward function extracted (the ``pred`` extra the built-in scorers return), else
  its whole response text, stripped.

Pure functions on lists; no torch.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Optional, Sequence

__all__ = ["SampleJudgement", "pass_at_k", "majority_correct", "check_ks"]


@dataclass(frozen=True)
class SampleJudgement:
    """One sampled response as the scorer judged it: its extracted ``answer`` and whether it is ``correct``."""

    answer: str
    correct: bool


def check_ks(ks: Sequence[int], n: int) -> list[int]:
    """``ks`` sorted and de-duplicated; each must be in ``1..n`` (``ValueError`` naming ``--k`` otherwise)."""
    bad = [k for k in ks if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n]
    if bad:
        raise ValueError(f"--k {bad}: each k must be between 1 and the samples per prompt --n={n} "
                         f"(pass@k and maj@k need at least k samples of a prompt)")
    return sorted(set(ks))


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """The unbiased pass@k of one prompt from ``num_samples`` samples of which ``num_correct`` are right.

    ``1 - C(n - c, k) / C(n, k)`` as ``1 - prod_{i = n - c + 1}^{n} (1 - k / i)``; 1.0 when fewer than ``k`` samples
    are wrong (every ``k``-subset then holds a right one)."""
    if not 0 <= num_correct <= num_samples or not 1 <= k <= num_samples:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={num_samples}, c={num_correct}, k={k}")
    if num_samples - num_correct < k:
        return 1.0
    all_wrong = 1.0
    for size in range(num_samples - num_correct + 1, num_samples + 1):
        all_wrong *= 1.0 - k / size
    return 1.0 - all_wrong


def majority_correct(samples: Sequence[SampleJudgement], k: Optional[int] = None) -> bool:
    """Whether the majority answer among the first ``k`` samples (all when ``None``) is right; ties go to the answer
    seen first. An answer judged right in one sample and wrong in another counts as right if any of its samples is
    (a scorer may look past the extracted answer)."""
    voters = list(samples[:k] if k is not None else samples)
    if not voters:
        raise ValueError("maj@k of a prompt without samples")
    counts = Counter(sample.answer for sample in voters)
    top = max(counts.values())
    winner = next(sample.answer for sample in voters if counts[sample.answer] == top)
    return any(sample.correct for sample in voters if sample.answer == winner)
