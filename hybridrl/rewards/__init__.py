"""Rule-based rewards: functions routed by ``data_source``, user reward files, and a fault-tolerant batched scorer.

- :data:`REWARD_FUNCTIONS` / :func:`default_compute_score` — built-in functions (gsm8k, math family, arithmetic).
- :func:`load_custom_reward_fn` / :class:`RewardFunctionSource` — ``custom_reward_function.path`` / ``.name``.
- :class:`RewardScorer` — ``score(data_sources, solution_strs, ground_truths, extra_infos) -> (scores [B], info)``
  in persistent worker processes with a per-sample timeout.
- :func:`scores_to_token_level` — ``[B]`` scores onto the last valid response token, ``[B, R]``.

The torch-based names (:class:`RewardScorer`, :class:`ScoreInfo`, :func:`build_reward_scorer`,
:func:`scores_to_token_level`) are imported on first access, so the reward worker processes — which import this
package — start without loading torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from hybridrl.rewards.custom import RewardFunctionSource, load_custom_reward_fn
from hybridrl.rewards.outcome import ScoreOutcome
from hybridrl.rewards.registry import REWARD_FUNCTIONS, RewardFn, check_data_sources, default_compute_score

__all__ = [
    "REWARD_FUNCTIONS",
    "RewardFn",
    "RewardFunctionSource",
    "RewardScorer",
    "ScoreInfo",
    "ScoreOutcome",
    "build_reward_scorer",
    "check_data_sources",
    "default_compute_score",
    "load_custom_reward_fn",
    "scores_to_token_level",
]

_LAZY = {
    "RewardScorer": "hybridrl.rewards.scorer",
    "ScoreInfo": "hybridrl.rewards.scorer",
    "build_reward_scorer": "hybridrl.rewards.scorer",
    "scores_to_token_level": "hybridrl.rewards.token_level",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hybridrl.rewards' has no attribute {name!r}")
