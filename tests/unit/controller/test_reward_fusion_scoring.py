"""Controller-side reward fusion: re-tokenising for a reward model with another vocabulary, and fused rule + guard
rewards on a real rollout-shaped batch (rule functions scored in-process)."""

from __future__ import annotations

import torch

from hybridrl.config import load_config
from hybridrl.trainers.reward_fusion import FusedScoring, retokenize, same_vocabulary
from hybridrl.trainers.evaluation import Scoring
from hybridrl.data import ArithmeticTask, PromptDataset
from hybridrl.data.loader import DataFields, collate_prompts
from hybridrl.data.sft import SFTExample, encode_sft_examples
from hybridrl.protocol import Fields
from hybridrl.rewards.fusion import diversity_penalty, length_penalty
from hybridrl.rewards.scorer import build_reward_scorer
from hybridrl.utils.tiny_model import DEFAULT_CHARACTERS, build_char_tokenizer
from scripted_judge import scripted  # noqa: F401  (a fixture)


def rollout_batch(tokenizer, responses: list[str]):
    """A rollout-shaped batch: 2 arithmetic prompts × 2 responses, with the loader's non-tensor fields."""
    rows = ArithmeticTask(seed=2, operators="+", max_digits=1).train_rows(2)
    prompts = PromptDataset.from_rows(rows, tokenizer)
    examples = [SFTExample(row["prompt"], text) for row in rows for text in responses[:2]]
    batch = encode_sft_examples(tokenizer, examples, max_response_length=6)
    meta = collate_prompts([prompts[0], prompts[0], prompts[1], prompts[1]], ["a", "a", "b", "b"],
                           tokenizer.pad_token_id)
    for name, values in meta.non_tensors.items():
        batch[name] = list(values)
    return batch, rows


def test_retokenizing_uses_the_reward_models_vocabulary_and_template():
    policy, reward = build_char_tokenizer(), build_char_tokenizer(DEFAULT_CHARACTERS[::-1])
    assert not same_vocabulary(policy, reward) and same_vocabulary(policy, build_char_tokenizer())
    batch, rows = rollout_batch(policy, ["7", "12"])
    texts = ["7", "12", "7", "12"]
    encoded = retokenize(batch, texts, reward, apply_chat_template=True)
    for row, text in enumerate(texts):
        ids = encoded[Fields.INPUT_IDS][row][encoded[Fields.ATTENTION_MASK][row].bool()]
        prompt = rows[row // 2]["prompt"][0]["content"]
        assert reward.decode(ids) == f"<|user|>{prompt}<|assistant|>{text}<eos>"
        assert ids.tolist() == reward.apply_chat_template(
            [{"role": "user", "content": prompt}, {"role": "assistant", "content": text}], tokenize=True,
            return_dict=True)["input_ids"]


def test_fused_rule_and_guard_rewards_land_on_the_last_token():
    tokenizer = build_char_tokenizer()
    config = load_config(["data.max_response_length=6", "reward_fusion.enable=true", "reward_fusion.rule_weight=2.0",
                          "reward_fusion.length_penalty_coef=0.5", "reward_fusion.diversity_penalty_coef=1.0",
                          "reward_fusion.cap=1.5"], check_paths=False)
    batch, rows = rollout_batch(tokenizer, ["x", "x"])
    answers = [row["reward_model"]["ground_truth"] for row in rows]
    texts = [answers[0], "99", answers[1], answers[1]]  # group a: right + wrong; group b: two identical right ones
    responses = torch.full((4, 6), tokenizer.pad_token_id)
    mask = torch.zeros(4, 6, dtype=torch.long)
    for row, text in enumerate(texts):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        responses[row, :len(ids)], mask[row, :len(ids)] = torch.tensor(ids), 1
    batch[Fields.RESPONSES], batch[Fields.RESPONSE_MASK] = responses, mask
    with build_reward_scorer(config.custom_reward_function, num_workers=0) as scorer:
        fused, metrics = FusedScoring(Scoring(scorer, tokenizer), config).token_level_scores(batch)
    rule = torch.tensor([1.0, 0.0, 1.0, 1.0])
    expected = (2.0 * rule + length_penalty(mask.sum(-1), 6, 0.5)
                + diversity_penalty(texts, list(batch[Fields.UID]), 1.0)).clamp(max=1.5)
    assert torch.allclose(fused.sum(-1), expected)
    assert torch.equal(fused != 0, torch.nn.functional.one_hot(mask.sum(-1) - 1, 6).bool() & (expected != 0)[:, None])
    assert metrics["reward/rule/mean"] == 0.75 and metrics["reward/diversity_penalty/mean"] < 0
    assert list(batch[DataFields.MESSAGES])[0] == rows[0]["prompt"]


def test_validation_counts_a_right_answer_by_the_scorers_acc_not_by_a_full_score():
    """GSM8K-style scoring pays 0.5 for the right number without "####"; it is still right (its ``acc``)."""
    tokenizer = build_char_tokenizer()
    config = load_config(["data.max_response_length=6"], check_paths=False)
    batch, rows = rollout_batch(tokenizer, ["x", "x"])
    answers = [row["reward_model"]["ground_truth"] for row in rows]
    batch[DataFields.DATA_SOURCE] = ["openai/gsm8k", "openai/gsm8k", "arithmetic", "arithmetic"]
    texts = [answers[0], "99", answers[1], "99"]  # (the char tokenizer has no "#")
    responses = torch.full((4, 6), tokenizer.pad_token_id)
    mask = torch.zeros(4, 6, dtype=torch.long)
    for row, text in enumerate(texts):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        responses[row, :len(ids)], mask[row, :len(ids)] = torch.tensor(ids), 1
    batch[Fields.RESPONSES], batch[Fields.RESPONSE_MASK] = responses, mask
    with build_reward_scorer(config.custom_reward_function, num_workers=0) as scorer:
        scores, correct, decoded = Scoring(scorer, tokenizer).judge(batch)
    assert decoded == texts
    assert scores.tolist() == [0.5, 0.0, 1.0, 0.0] and correct == [1.0, 0.0, 1.0, 0.0]


def test_an_llm_judge_is_one_fused_component_and_validation_reports_its_held_out_score(scripted):
    """The judge reads each row's prompt text, decoded response and ground truth; its score joins the rule's by
    weight; validation reports its mean as ``val/judge/score`` beside the rule's accuracy."""
    from hybridrl.rewards.judge import JudgeClient, regex_parser
    from hybridrl.rollout.base import SamplingParams
    from hybridrl.trainers.evaluation import validate

    judge = scripted(lambda text: "Score: 1" if text.split("|")[0] == text.rsplit("=", 1)[1] else "Score: 0")
    tokenizer = build_char_tokenizer()
    config = load_config(["data.max_response_length=6", "reward_judge.enable=true",
                          f"reward_judge.base_url={judge.base_url}", "reward_fusion.rule_weight=0.5",
                          "reward_fusion.judge_weight=2.0"], check_paths=False)
    batch, rows = rollout_batch(tokenizer, ["x", "x"])
    answers = [row["reward_model"]["ground_truth"] for row in rows]
    texts = [answers[0], "99", "98", answers[1]]
    responses, mask = torch.full((4, 6), tokenizer.pad_token_id), torch.zeros(4, 6, dtype=torch.long)
    for row, text in enumerate(texts):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        responses[row, :len(ids)], mask[row, :len(ids)] = torch.tensor(ids), 1
    batch[Fields.RESPONSES], batch[Fields.RESPONSE_MASK] = responses, mask
    # the scripted judge pays 1 when the response equals the reference: "<ground truth>|<prompt><response>"
    template = "{ground_truth}|{prompt}{response}"
    with build_reward_scorer(config.custom_reward_function, num_workers=0) as scorer, \
            JudgeClient(judge.base_url, template, regex_parser(config.reward_judge.score_regex)) as client:
        scoring = FusedScoring(Scoring(scorer, tokenizer), config, judge=client)
        fused, metrics = scoring.token_level_scores(batch)
        held_out = validate(lambda prompts, _params: batch, [batch], scoring, SamplingParams())
    judged = torch.tensor([1.0, 0.0, 0.0, 1.0])
    assert torch.allclose(fused.sum(-1), 0.5 * judged + 2.0 * judged)  # rule and judge agree here
    assert metrics["reward/judge/mean"] == 0.5 and metrics["reward/judge/weight"] == 2.0
    assert metrics["reward/judge/num_parse_failure"] == 0.0
    sent = sorted(request[1]["messages"][-1]["content"] for request in judge.requests[:4])
    prompts = [row["prompt"][0]["content"] for row in rows]
    assert sent == sorted(f"{answers[row // 2]}|{prompts[row // 2]}{text}" for row, text in enumerate(texts))
    assert held_out["val/judge/score"] == 0.5 and held_out["val/accuracy"] == 0.5
