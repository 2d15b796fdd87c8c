"""Scoring responses with the reward functions, and validation with per-data-source metrics."""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from hybridrl.agents.batch import AGENT_REWARDS, EPISODE_REWARDS, FINAL_RESPONSE, TURN_REWARDS, check_episode_failures
from hybridrl.data.loader import DataFields, PromptLoader
from hybridrl.protocol import Batch, Fields
from hybridrl.rewards.scorer import OK, RewardScorer, ScoreInfo, reward_extra
from hybridrl.rewards.token_level import scores_to_token_level
from hybridrl.rollout.base import SamplingParams

logger = logging.getLogger(__name__)

# A response counts as correct (for the accuracy metric) when its reward function says so (an ``acc`` extra, as the
# built-in scorers return: GSM8K's right answer without "####" scores 0.5 but is right), else when its score reaches
# this value.
CORRECT_SCORE = 1.0


@dataclass(frozen=True)
class JudgedRows:
    """Scored responses: ``scores`` ``[B]``, ``correct`` (1.0 / 0.0 per row), the decoded ``texts`` and the
    extracted ``answers``."""

    scores: torch.Tensor
    correct: list[float]
    texts: list[str]
    answers: list[str]


class Scoring:
    """Decodes responses and scores them with the configured reward functions (routed by ``data_source``)."""

    def __init__(self, scorer: RewardScorer, tokenizer: Any) -> None:
        self.scorer = scorer
        self.tokenizer = tokenizer

    def decode(self, batch: Batch) -> list[str]:
        """The response texts (special tokens and padding removed); for multi-turn episodes the final model turn."""
        if FINAL_RESPONSE in batch:
            return [str(text) for text in batch[FINAL_RESPONSE]]
        responses = batch[Fields.RESPONSES].masked_fill(~batch[Fields.RESPONSE_MASK].bool(),
                                                        self.tokenizer.pad_token_id)
        return self.tokenizer.batch_decode(responses, skip_special_tokens=True)

    def score(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float], list[str]]:
        """``[B]`` scores, failure-count metrics, and the decoded texts. The numbers the reward function returned
        beside each score ride on the rows as ``reward_extra(name)`` ``[B]`` tensors (NaN where a row has none), for
        ``algorithm.filter_groups.metric``."""
        scores, info, texts = self._score(batch)
        for name, values in info.extras.items():
            if any(isinstance(value, (int, float)) for value in values):
                batch[reward_extra(name)] = torch.tensor(
                    [float(value) if isinstance(value, (int, float)) else float("nan") for value in values])
        return scores, info.metrics(), texts

    def judge(self, batch: Batch) -> tuple[torch.Tensor, list[float], list[str]]:
        """``[B]`` scores, whether each response is right (its ``acc`` extra where the function returns one, else
        score >= ``CORRECT_SCORE``), and the decoded texts."""
        judged = self.judge_rows(batch)
        return judged.scores, judged.correct, judged.texts

    def judge_rows(self, batch: Batch) -> "JudgedRows":
        """:meth:`judge`, plus each response's extracted answer (the function's ``pred`` extra where it returns one,
        else the stripped text): what majority voting counts."""
        scores, info, texts = self._score(batch)
        accuracies = info.extras.get("acc", [None] * len(texts))
        correct = [float(acc) if isinstance(acc, (int, float)) else float(score >= CORRECT_SCORE)
                   for acc, score in zip(accuracies, scores.tolist())]
        predictions = info.extras.get("pred", [None] * len(texts))
        answers = [str(pred) if pred is not None else text.strip() for pred, text in zip(predictions, texts)]
        return JudgedRows(scores, correct, texts, answers)

    def _score(self, batch: Batch) -> tuple[torch.Tensor, Any, list[str]]:
        check_episode_failures(batch)  # every episode failed the same way: stop quoting it, before scoring nothing
        texts = self.decode(batch)
        if AGENT_REWARDS not in batch:
            return (*self._scored(batch, texts), texts)
        agent_rewards = batch[AGENT_REWARDS].float()
        left = torch.isnan(agent_rewards).nonzero().flatten().tolist()  # the agent left these to the reward function
        scores, info = torch.nan_to_num(agent_rewards, nan=0.0), ScoreInfo(statuses=[OK] * len(texts))
        if left:
            left_scores, left_info = self._scored(batch.index(left), [texts[index] for index in left],
                                                  batch_size=len(texts))
            scores[left] = left_scores.to(scores.dtype)
            info = left_info.scattered(left, len(texts))
        return scores, info, texts

    def _scored(self, batch: Batch, texts: list[str], batch_size: int = 0) -> tuple[torch.Tensor, Any]:
        """``texts`` of ``batch``'s rows scored by the reward functions; ``batch_size``: the rows of the whole
        batch they are part of (a failure of all of them stops the run only when they are the whole batch)."""
        scores, info = self.scorer.score(list(batch[DataFields.DATA_SOURCE]), texts,
                                         list(batch[DataFields.GROUND_TRUTH]), list(batch[DataFields.EXTRA_INFO]))
        # one bad sample scores 0; a whole bad batch is a bug
        if info.messages and info.num_failed == max(len(texts), batch_size):
            source = getattr(self.scorer.source, "describe", lambda: "the reward function")()
            raise ValueError(f"custom_reward_function: all {len(texts)} samples of the batch failed in {source}, "
                             f"so it cannot be trusted to score this run; first: {info.messages[0]}")
        if info.messages:
            logger.warning("reward: %d sample(s) scored 0 after a failure, e.g. %s", len(info.messages),
                           info.messages[0])
        return scores, info

    def token_level_scores(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        """Scores on each response's last valid token ``[B, R]`` (multi-turn: plus the environment's rewards, per
        ``rollout.multi_turn.reward_placement``), plus scoring metrics."""
        scores, metrics, _ = self.score(batch)
        if TURN_REWARDS in batch:  # an environment's own rewards, each on the turn it answered
            token_scores = scores_to_token_level(scores, batch[Fields.RESPONSE_MASK])
            return token_scores + batch[TURN_REWARDS].to(token_scores.dtype), metrics
        if EPISODE_REWARDS in batch:  # an environment's own rewards add to the final answer's score
            scores = scores + batch[EPISODE_REWARDS].to(scores.dtype)
        return scores_to_token_level(scores, batch[Fields.RESPONSE_MASK]), metrics


def validate(generate: Callable[[Batch, SamplingParams], Batch], loader: Optional[PromptLoader], scoring: Scoring,
             params: SamplingParams, num_samples_to_log: int = 3) -> dict[str, float]:
    """Generate (``generate(prompts, params)``) for every validation prompt and report
    ``val/<data_source>/{score,accuracy}``, overall ``val/score``, ``val/accuracy`` and ``val/response_length``
    (and, when ``scoring`` has an LLM judge, ``val/judge/score`` and its failure counts ``val/judge/num_*``); logs a
    few sample generations."""
    if loader is None:
        return {}
    per_source: dict[str, list[tuple[float, float]]] = defaultdict(list)  # (score, correct) per response
    lengths: list[float] = []
    samples: list[tuple[str, str, float]] = []
    judged: dict[str, list[float]] = defaultdict(list)  # model-judged components (an LLM judge), per response
    judge_failures: dict[str, float] = defaultdict(float)
    for prompts in loader:
        batch = generate(prompts, params)
        scores, correct, texts = scoring.judge(batch)
        components, failures = getattr(scoring, "held_out_components", lambda *_: ({}, {}))(batch, texts)
        for name, values in components.items():
            judged[name] += values.tolist()
        for name, count in failures.items():
            judge_failures[name] += count
        lengths += batch[Fields.RESPONSE_MASK].sum(-1).float().tolist()
        for source, value, right in zip(batch[DataFields.DATA_SOURCE], scores.tolist(), correct):
            per_source[str(source)].append((value, right))
        samples += list(zip(batch[DataFields.RAW_PROMPT], texts, scores.tolist()))[:num_samples_to_log]
    for prompt, text, value in samples[:num_samples_to_log]:
        logger.info("val sample: %r -> %r (score %.2f)", prompt, text, value)
    metrics: dict[str, float] = {}
    for source, results in [*per_source.items(), ("", [pair for pairs in per_source.values() for pair in pairs])]:
        prefix = f"val/{source}/" if source else "val/"
        metrics[f"{prefix}score"] = sum(value for value, _ in results) / max(len(results), 1)
        metrics[f"{prefix}accuracy"] = sum(right for _, right in results) / max(len(results), 1)
    metrics["val/response_length"] = sum(lengths) / max(len(lengths), 1)
    metrics.update({f"val/{name}/score": sum(values) / len(values) for name, values in judged.items() if values})
    metrics.update({f"val/{name}": count for name, count in judge_failures.items()})
    return metrics
