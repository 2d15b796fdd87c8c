"""Scoring responses with the reward functions, and validation with per-data-source metrics."""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any, Optional

import torch

from hybridrl.data.loader import DataFields, PromptLoader
from hybridrl.protocol import Batch, Fields
from hybridrl.rewards.scorer import RewardScorer
from hybridrl.rewards.token_level import scores_to_token_level
from hybridrl.rollout.base import SamplingParams

logger = logging.getLogger(__name__)

# A response counts as correct (for the accuracy metric) when its score reaches this value.
CORRECT_SCORE = 1.0


class Scoring:
    """Decodes responses and scores them with the configured reward functions (routed by ``data_source``)."""

    def __init__(self, scorer: RewardScorer, tokenizer: Any) -> None:
        self.scorer = scorer
        self.tokenizer = tokenizer

    def decode(self, batch: Batch) -> list[str]:
        """The response texts (special tokens and padding removed)."""
        responses = batch[Fields.RESPONSES].masked_fill(~batch[Fields.RESPONSE_MASK].bool(),
                                                        self.tokenizer.pad_token_id)
        return self.tokenizer.batch_decode(responses, skip_special_tokens=True)

    def score(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float], list[str]]:
        """``[B]`` scores, failure-count metrics, and the decoded texts."""
        texts = self.decode(batch)
        scores, info = self.scorer.score(list(batch[DataFields.DATA_SOURCE]), texts,
                                         list(batch[DataFields.GROUND_TRUTH]), list(batch[DataFields.EXTRA_INFO]))
        if info.messages and info.num_failed == len(texts):  # one bad sample scores 0; a whole bad batch is a bug
            source = getattr(self.scorer.source, "describe", lambda: "the reward function")()
            raise ValueError(f"custom_reward_function: all {len(texts)} samples of the batch failed in {source}, "
                             f"so it cannot be trusted to score this run; first: {info.messages[0]}")
        if info.messages:
            logger.warning("reward: %d sample(s) scored 0 after a failure, e.g. %s", len(info.messages),
                           info.messages[0])
        return scores, info.metrics(), texts

    def token_level_scores(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        """Scores on each response's last valid token ``[B, R]``, plus scoring metrics."""
        scores, metrics, _ = self.score(batch)
        return scores_to_token_level(scores, batch[Fields.RESPONSE_MASK]), metrics


def validate(actor_group, loader: Optional[PromptLoader], scoring: Scoring, params: SamplingParams,
             num_samples_to_log: int = 3) -> dict[str, float]:
    """Generate for every validation prompt and report ``val/<data_source>/{score,accuracy}``, overall
    ``val/score``, ``val/accuracy`` and ``val/response_length``; logs a few sample generations."""
    from hybridrl.workers.actor_worker import ActorRolloutRefWorker

    if loader is None:
        return {}
    per_source: dict[str, list[float]] = defaultdict(list)
    lengths: list[float] = []
    samples: list[tuple[str, str, float]] = []
    for prompts in loader:
        batch = actor_group.call(ActorRolloutRefWorker.generate_sequences, prompts, params)
        scores, _, texts = scoring.score(batch)
        lengths += batch[Fields.RESPONSE_MASK].sum(-1).float().tolist()
        for source, value in zip(batch[DataFields.DATA_SOURCE], scores.tolist()):
            per_source[str(source)].append(value)
        samples += list(zip(batch[DataFields.RAW_PROMPT], texts, scores.tolist()))[:num_samples_to_log]
    for prompt, text, value in samples[:num_samples_to_log]:
        logger.info("val sample: %r -> %r (score %.2f)", prompt, text, value)
    metrics: dict[str, float] = {}
    all_scores = [value for values in per_source.values() for value in values]
    for source, values in per_source.items():
        metrics[f"val/{source}/score"] = sum(values) / len(values)
        metrics[f"val/{source}/accuracy"] = sum(value >= CORRECT_SCORE for value in values) / len(values)
    metrics["val/score"] = sum(all_scores) / max(len(all_scores), 1)
    metrics["val/accuracy"] = sum(value >= CORRECT_SCORE for value in all_scores) / max(len(all_scores), 1)
    metrics["val/response_length"] = sum(lengths) / max(len(lengths), 1)
    return metrics
