"""Training-time rewards on the controller: rule scores, the reward-model group's scores, an LLM judge's scores and
the guards, fused.

:class:`FusedScoring` has the interface of :class:`~hybridrl.trainers.evaluation.Scoring` (which it wraps):
``token_level_scores`` returns the fused reward on each response's last token, while ``score`` (used by validation)
stays the rule score, so held-out accuracy keeps meaning "correct". Every component is logged (``reward/<name>/*``).

The reward model scores the policy's own token ids when both share a vocabulary; otherwise each (prompt, response) is
re-tokenised with the reward model's tokenizer and chat template — the prompt from the row's original messages, the
response from its decoded text, then the reward model's EOS, exactly as ``hybridrl rm`` encodes training pairs.

The judge (:class:`~hybridrl.rewards.judge.JudgeClient`) reads text: the prompt's message texts, the decoded response
and the row's ground truth. Validation reports its mean score on the held-out set too (``val/judge/score``): the
judged metric, beside the rule's accuracy.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from hybridrl.config.schema import ModelConfig, TrainConfig
from hybridrl.trainers.evaluation import Scoring
from hybridrl.runtime.worker_group import WorkerGroup
from hybridrl.data.loader import DataFields
from hybridrl.data.sft import SFTExample, encode_sft_examples
from hybridrl.modeling.model_builder import load_tokenizer
from hybridrl.protocol import Batch, Fields
from hybridrl.rewards.fusion import RunningMeanStd, diversity_penalty, fuse_rewards, length_penalty
from hybridrl.rewards.judge import JudgeClient, JudgeQuery
from hybridrl.rewards.token_level import scores_to_token_level


def fusion_enabled(config: TrainConfig) -> bool:
    return config.reward_model.enable or config.reward_judge.enable or config.reward_fusion.enable


def prompt_text(messages: Any) -> str:
    """The text a judge reads as the prompt: the messages' contents, blank-line separated (a string as it is)."""
    if isinstance(messages, str):
        return messages
    return "\n\n".join(str(message.get("content") or "") for message in messages)


def judge_queries(batch: Batch, texts: list[str]) -> list[JudgeQuery]:
    """One :class:`JudgeQuery` per response of ``batch`` (``texts``: the decoded responses)."""
    truths = batch[DataFields.GROUND_TRUTH] if DataFields.GROUND_TRUTH in batch else [None] * len(texts)
    return [JudgeQuery(prompt_text(messages), text, None if truth is None else str(truth))
            for messages, text, truth in zip(batch[DataFields.MESSAGES], texts, truths)]


def same_vocabulary(first: Any, second: Any) -> bool:
    """Whether two tokenizers map every token to the same id (then token ids can be passed as they are)."""
    return first.get_vocab() == second.get_vocab()


def reward_model_tokenizer(config: TrainConfig, policy_tokenizer: Any) -> Optional[Any]:
    """The reward model's tokenizer when its vocabulary differs from the policy's (responses are re-tokenised for
    it), else None (also when no reward model is configured)."""
    if not config.reward_model.enable:
        return None
    tokenizer = load_tokenizer(ModelConfig(path=config.reward_model.model_path,
                                           trust_remote_code=config.model.trust_remote_code))
    return None if same_vocabulary(tokenizer, policy_tokenizer) else tokenizer


def retokenize(batch: Batch, texts: list[str], tokenizer: Any, apply_chat_template: bool) -> Batch:
    """``input_ids``/``attention_mask`` of (prompt messages, response text) under ``tokenizer`` (left-padded prompt,
    right-padded response + EOS), for a reward model whose tokenizer differs from the policy's."""
    examples = [SFTExample(prompt, text) for prompt, text in zip(batch[DataFields.MESSAGES], texts)]
    longest = max(len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts) + 1
    encoded = encode_sft_examples(tokenizer, examples, longest, apply_chat_template)
    return encoded.select(Fields.INPUT_IDS, Fields.ATTENTION_MASK)


class FusedScoring:
    """Rule scores (``scoring``) + reward-model scores (``rm_group``, optional) + an LLM judge's scores (``judge``,
    optional) + guards → one fused reward."""

    def __init__(self, scoring: Scoring, config: TrainConfig, rm_group: Optional[WorkerGroup] = None,
                 rm_tokenizer: Any = None, judge: Optional[JudgeClient] = None) -> None:
        self.scoring = scoring
        self.config = config
        self.rm_group = rm_group
        self.rm_tokenizer = rm_tokenizer  # None: same vocabulary as the policy, score its token ids
        self.judge_client = judge
        self.normalizers = {name: RunningMeanStd() for name in config.reward_fusion.normalize}
        dynamic = config.reward_fusion.weighting == "inverse_std"
        self.scales = {name: RunningMeanStd() for name in ("rule", "rm", "judge")} if dynamic else {}

    def state_dict(self) -> dict[str, dict[str, float]]:
        """The running statistics (saved with a checkpoint so a resumed run normalises and weights alike)."""
        return {**{name: stats.state_dict() for name, stats in self.normalizers.items()},
                **{f"scale/{name}": stats.state_dict() for name, stats in self.scales.items()}}

    def load_state_dict(self, state: dict[str, dict[str, float]]) -> None:
        for key, stats in [*self.normalizers.items(), *((f"scale/{n}", s) for n, s in self.scales.items())]:
            if key in state:
                stats.load_state_dict(state[key])

    def score(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float], list[str]]:
        """The rule score, unchanged."""
        return self.scoring.score(batch)

    def judge(self, batch: Batch) -> tuple[torch.Tensor, list[float], list[str]]:
        """The rule score and correctness (validation's score and accuracy), unchanged."""
        return self.scoring.judge(batch)

    def rm_scores(self, batch: Batch, texts: list[str]) -> torch.Tensor:
        """``[B]`` reward-model scores of the batch's (prompt, response) sequences."""
        from hybridrl.workers.reward_model_worker import RM_SCORES, RewardModelWorker

        if self.rm_tokenizer is None:
            inputs = batch.select(Fields.INPUT_IDS, Fields.ATTENTION_MASK)
        else:
            inputs = retokenize(batch, texts, self.rm_tokenizer, self.config.data.apply_chat_template)
        return self.rm_group.call(RewardModelWorker.compute_rm_score, inputs)[RM_SCORES]

    def components(self, batch: Batch) -> tuple[dict[str, torch.Tensor], dict[str, float], dict[str, float]]:
        """``(components [B] each, weights, rule-scoring metrics)``."""
        fusion = self.config.reward_fusion
        rule, metrics, texts = self.scoring.score(batch)
        components, weights = {"rule": rule.float()}, {"rule": fusion.rule_weight}
        if self.rm_group is not None:
            components["rm"], weights["rm"] = self.rm_scores(batch, texts), fusion.rm_weight
        if self.judge_client is not None:
            judged = self.judge_client.score(judge_queries(batch, texts))
            components["judge"], weights["judge"] = judged.scores, fusion.judge_weight
            metrics.update(judged.metrics())
        if fusion.length_penalty_coef:
            lengths = batch[Fields.RESPONSE_MASK].sum(-1)
            components["length_penalty"] = length_penalty(lengths, self.config.data.max_response_length,
                                                          fusion.length_penalty_coef)
            weights["length_penalty"] = 1.0
        if fusion.diversity_penalty_coef:
            components["diversity_penalty"] = diversity_penalty(texts, list(batch[Fields.UID]),
                                                                fusion.diversity_penalty_coef)
            weights["diversity_penalty"] = 1.0
        return components, weights, metrics

    def held_out_components(self, batch: Batch, texts: list[str]) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """Model-judged scores ``[B]`` validation reports beside the rule's (``{"judge": …}`` with a judge), and
        their failure counts (``judge/num_timeout``, …)."""
        if self.judge_client is None:
            return {}, {}
        judged = self.judge_client.score(judge_queries(batch, texts))
        return {"judge": judged.scores}, judged.metrics(prefix="judge/")

    def token_level_scores(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        """The fused reward on each response's last valid token ``[B, R]``, plus per-component metrics."""
        components, weights, metrics = self.components(batch)
        fused, fusion_metrics = fuse_rewards(components, weights, normalizers=self.normalizers, scales=self.scales,
                                             cap=self.config.reward_fusion.cap)
        return scores_to_token_level(fused, batch[Fields.RESPONSE_MASK]), {**metrics, **fusion_metrics}
