"""Synthetic preference pairs built from a synthetic task's rows — a reward-model task with a known right answer.

Kinds (``data.synthetic_preference``):

- ``correct``: the chosen response is the exact answer (``reward_model.ground_truth``, an integer), the rejected one
  a wrong integer near it (``answer ± 1..spread``, never negative) — the reward model must learn to check the sum;
- ``shorter``: both responses start with the answer; the rejected one continues with 1–``spread`` extra digits —
  the reward model must learn to prefer the shorter response (a length preference, the classic reward-hacking axis).

Training pairs come from the task's training stream (pair ``i`` is a pure function of ``(seed, i)``), held-out pairs
from its validation problems, so the two never share a prompt.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, Sequence

from hybridrl.config.rm_schema import SYNTHETIC_PREFERENCES
from hybridrl.data.preference import PreferencePair

__all__ = ["SYNTHETIC_PREFERENCES", "synthetic_pair", "synthetic_pairs"]


def synthetic_pair(row: Mapping[str, Any], kind: str, rng: random.Random, spread: int = 9) -> PreferencePair:
    """The pair of ``kind`` for one task row (``prompt`` and an integer ``reward_model.ground_truth``)."""
    answer = int(row["reward_model"]["ground_truth"])
    if kind == "correct":
        offsets = [offset for offset in range(-spread, spread + 1) if offset and answer + offset >= 0]
        rejected = str(answer + rng.choice(offsets))
    elif kind == "shorter":
        rejected = str(answer) + "".join(rng.choice("0123456789") for _ in range(rng.randint(1, spread)))
    else:
        raise ValueError(f"data.synthetic_preference={kind!r} is unknown; valid: {', '.join(SYNTHETIC_PREFERENCES)}")
    where = f"synthetic {kind} pair ({row.get('extra_info', {}).get('split', '?')} "\
            f"{row.get('extra_info', {}).get('index', '?')})"
    return PreferencePair(row["prompt"], str(answer), rejected, 0.0, where)


def synthetic_pairs(rows: Sequence[Mapping[str, Any]], kind: str, *, seed: int, spread: int = 9,
                    pairs_per_row: int = 1) -> list[PreferencePair]:
    """``pairs_per_row`` pairs for each row; the wrong responses are drawn from a generator seeded by ``seed``."""
    if spread < 1:
        raise ValueError(f"synthetic preference: spread must be >= 1, got {spread}")
    rng = random.Random(f"hybridrl/preference/{kind}/{seed}")
    return [synthetic_pair(row, kind, rng, spread) for row in rows for _ in range(pairs_per_row)]
