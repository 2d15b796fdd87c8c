"""Algorithm variants that plug into the training loop without copying it.

- **Reward shapers** (``REWARD_SHAPERS``): ``(batch, config) -> (token_level_scores, metrics)``, applied in order
  after scoring. Built in: ``overlong_buffer`` (DAPO), enabled by ``algorithm.overlong_buffer.enable``.
- **ReMax baselines**: each prompt's greedy response, scored and shaped as the rewards are
  (:func:`remax_baselines`).
- **Group filters** (``GROUP_FILTERS``): ``(batch) -> keep [num_groups] bool`` over prompt groups (``uid``), used by
  dynamic sampling (``algorithm.filter_groups.enable``): groups whose responses all scored the same carry no GRPO
  signal and are replaced by freshly generated ones; registered by ``algorithm.filter_groups.metric``.

A recipe registers its own (``@REWARD_SHAPERS.register("mine")``) and lists it in ``extra.reward_shapers``.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import torch

from hybridrl.agents.batch import is_dropped
from hybridrl.config.schema import TrainConfig
from hybridrl.protocol import Batch, Fields
from hybridrl.rewards.scorer import REWARD_EXTRA_PREFIX, reward_extra
from hybridrl.rollout.base import SamplingParams
from hybridrl.utils.registry import Registry

RewardShaper = Callable[[Batch, TrainConfig], tuple[torch.Tensor, dict[str, float]]]
GroupFilter = Callable[[Batch], np.ndarray]

REWARD_SHAPERS: Registry[RewardShaper] = Registry("reward shaper")
GROUP_FILTERS: Registry[GroupFilter] = Registry("group filter")


@REWARD_SHAPERS.register("overlong_buffer")
def overlong_penalty(batch: Batch, config: TrainConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """DAPO's soft overlong punishment: ``−factor × (L − (max − buffer)) / buffer`` for response length ``L`` past
    ``max − buffer``, added on the last response token (0 for shorter responses, ``−factor`` at the limit)."""
    buffer = config.algorithm.overlong_buffer
    lengths = batch[Fields.RESPONSE_MASK].sum(-1).float()
    start = config.data.max_response_length - buffer.len
    penalty = -buffer.penalty_factor * ((lengths - start) / buffer.len).clamp(min=0.0, max=1.0)
    scores = batch[Fields.TOKEN_LEVEL_SCORES].clone()
    has_tokens = lengths > 0
    rows = torch.arange(len(lengths))[has_tokens]
    scores[rows, lengths[has_tokens].long() - 1] += penalty[has_tokens]
    return scores, {"reward/overlong_penalty_mean": float(penalty.mean()),
                    "reward/overlong_fraction": float((penalty < 0).float().mean())}


def shaper_names(config: TrainConfig) -> list[str]:
    """The reward shapers a config enables, in application order."""
    names = ["overlong_buffer"] if config.algorithm.overlong_buffer.enable else []
    return names + list(config.extra.get("reward_shapers", []))


def shape_rewards(batch: Batch, config: TrainConfig) -> dict[str, float]:
    """Apply every enabled reward shaper to ``batch[token_level_scores]`` in place; returns their metrics."""
    metrics: dict[str, float] = {}
    for name in shaper_names(config):
        scores, shaper_metrics = REWARD_SHAPERS[name](batch, config)
        batch[Fields.TOKEN_LEVEL_SCORES] = scores
        metrics.update(shaper_metrics)
    return metrics


def varies_within_groups(batch: Batch, values: torch.Tensor) -> np.ndarray:
    """``[num_groups]``: whether ``values [B]`` are not all equal within each prompt group (``uid``, in order of first
    appearance) — all-correct and all-wrong groups carry no group-relative signal."""
    uids = np.asarray(batch[Fields.UID])
    values = values.numpy()
    return np.array([np.ptp(values[uids == uid]) > 0 for uid in dict.fromkeys(uids.tolist())])


@GROUP_FILTERS.register("seq_reward")
@GROUP_FILTERS.register("seq_final_reward")  # the same before the KL penalty, which is when hybridrl filters
def non_constant_score(batch: Batch) -> np.ndarray:
    """Keep groups whose sequence rewards (token-level scores summed, reward shaping included) differ."""
    return varies_within_groups(batch, batch[Fields.TOKEN_LEVEL_SCORES].sum(-1))


@GROUP_FILTERS.register("score")
def non_constant_raw_score(batch: Batch) -> np.ndarray:
    """Keep groups whose reward-function scores (``Fields.SCORES``, before any shaping) differ."""
    return varies_within_groups(batch, batch[Fields.SCORES])


def group_filter(metric: str) -> GroupFilter:
    """The filter ``algorithm.filter_groups.metric`` names: a registered one, else "the reward function's extra value
    ``metric`` differs within the group" (verl's ``acc``)."""
    if metric in GROUP_FILTERS:
        return GROUP_FILTERS[metric]
    return lambda batch: non_constant_extra(batch, metric)


def non_constant_extra(batch: Batch, name: str) -> np.ndarray:
    """Keep groups whose reward-function extra ``name`` differs; ``ValueError`` naming the key when a row has none."""
    field = reward_extra(name)
    returned = sorted(key[len(REWARD_EXTRA_PREFIX):] for key in batch.keys() if key.startswith(REWARD_EXTRA_PREFIX))
    if field not in batch or bool(torch.isnan(batch[field]).any()):
        raise ValueError(f"algorithm.filter_groups.metric={name!r}: the reward function returned no number named "
                         f"{name!r} for {'some rows' if field in batch else 'any row'} (it returns: "
                         f"{', '.join(returned) or 'the score only'}); use one of {', '.join(GROUP_FILTERS)} or a "
                         "value it returns for every row")
    return varies_within_groups(batch, batch[field])


def keep_groups(batch: Batch, keep: np.ndarray) -> Batch:
    """The rows of ``batch`` whose group (``uid``, in order of first appearance) has ``keep`` set."""
    uids = np.asarray(batch[Fields.UID])
    kept = {uid for uid, flag in zip(dict.fromkeys(uids.tolist()), keep) if flag}
    return batch.index(torch.tensor([i for i, uid in enumerate(uids.tolist()) if uid in kept], dtype=torch.long))


def num_groups(batch: Batch) -> int:
    return len(set(np.asarray(batch[Fields.UID]).tolist()))


def first_groups(batch: Batch, count: int) -> Batch:
    """The rows of the first ``count`` groups (in order of appearance)."""
    uids = np.asarray(batch[Fields.UID])
    chosen = set(list(dict.fromkeys(uids.tolist()))[:count])
    return batch.index(torch.tensor([i for i, uid in enumerate(uids.tolist()) if uid in chosen], dtype=torch.long))


def left_pad_prompts(batch: Batch, width: int, pad_token_id: int) -> Batch:
    """Widen the prompt part of a rollout batch to ``width`` columns by left padding (so batches can be concatenated);
    a routing record (``routed_experts``) widens with "not recorded"."""
    extra = width - batch[Fields.PROMPTS].shape[1]
    if extra <= 0:
        return batch
    padded = batch.select(*batch.keys())
    for name, fill in ((Fields.PROMPTS, pad_token_id), (Fields.INPUT_IDS, pad_token_id), (Fields.ATTENTION_MASK, 0),
                       (Fields.ROUTED_EXPERTS, -1)):
        if name not in batch:
            continue
        tensor = batch[name]
        padded[name] = torch.cat([tensor.new_full((len(batch), extra, *tensor.shape[2:]), fill), tensor], dim=1)
    return padded


def concat_rollouts(batches: list[Batch], pad_token_id: int) -> Batch:
    """Concatenate rollout batches whose prompts were padded to different widths (a reward-function extra that only
    some of them carry is NaN in the rows of the others)."""
    width = max(batch[Fields.PROMPTS].shape[1] for batch in batches)
    extras = {key for batch in batches for key in batch.keys() if key.startswith(REWARD_EXTRA_PREFIX)}
    for batch in batches:
        for key in extras - set(batch.keys()):
            batch[key] = torch.full((len(batch),), float("nan"))
    return Batch.concat([left_pad_prompts(batch, width, pad_token_id) for batch in batches])


def prompt_rows(batch: Batch) -> tuple[Batch, np.ndarray]:
    """One prompt batch (``input_ids``/``attention_mask`` ``[G, P]`` + non-tensors) per group of a rollout batch, and
    for every row the index of its group — for baselines computed once per prompt (ReMax)."""
    uids = np.asarray(batch[Fields.UID]).tolist()
    order = list(dict.fromkeys(uids))
    first = [uids.index(uid) for uid in order]
    width = batch[Fields.PROMPTS].shape[1]
    rows = batch.index(torch.tensor(first, dtype=torch.long))
    prompts = Batch(tensors={Fields.INPUT_IDS: rows[Fields.PROMPTS],
                             Fields.ATTENTION_MASK: rows[Fields.ATTENTION_MASK][:, :width]},
                    non_tensors=dict(rows.non_tensors))
    return prompts, np.array([order.index(uid) for uid in uids])


def remax_params(config: TrainConfig) -> SamplingParams:
    """ReMax's baseline generation: one greedy response per prompt."""
    return SamplingParams(n=1, max_new_tokens=config.data.max_response_length, do_sample=False)


def prompts_without_greedy(batch: Batch, greedy: Optional[Batch]) -> Optional[Batch]:
    """The prompts of ``batch`` (one row per group) whose greedy response ``greedy`` lacks (all without it);
    ``None`` when none is missing."""
    prompts, _ = prompt_rows(batch)
    have = set(greedy[Fields.UID].tolist()) if greedy is not None else set()
    missing = [index for index, uid in enumerate(prompts[Fields.UID].tolist())
               if uid not in have and not is_dropped(uid)]  # a failed agent episode trains nothing: no baseline
    return prompts.index(torch.tensor(missing, dtype=torch.long)) if missing else None


def remax_baselines(batch: Batch, greedy_batches: list[Batch], config: TrainConfig,
                    token_level_scores: Callable[[Batch], tuple[torch.Tensor, dict]]) -> torch.Tensor:
    """ReMax: the score of each prompt's greedy response (``greedy_batches``, one row per prompt, scored here and
    shaped as the rewards are, so the baseline is on their scale), for every row of that prompt ``[B]`` (matched by
    uid, so the rows may have been reordered since); 0 for a failed agent episode's row (it trains nothing)."""
    score_of = {}
    for greedy in greedy_batches:
        greedy[Fields.TOKEN_LEVEL_SCORES], _ = token_level_scores(greedy)
        shape_rewards(greedy, config)
        score_of.update(zip(greedy[Fields.UID].tolist(), greedy[Fields.TOKEN_LEVEL_SCORES].sum(-1)))
    zero = torch.zeros(())
    return torch.stack([zero if is_dropped(uid) else score_of[uid] for uid in batch[Fields.UID].tolist()])
