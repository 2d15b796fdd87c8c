"""A custom reward function that raises, hangs, or returns NaN / a non-number, as the trainer sees it (``Scoring``).

One failing sample scores 0 and is logged with its index and data source (the run goes on); a batch in which every
sample failed stops the run with a ``ValueError`` naming the reward file and the first failure — a function that
never works must not train a policy on zeros. Real tokenizer, real reward worker processes, decoded token ids.
"""

from __future__ import annotations

import logging
import time

import pytest
import torch

from hybridrl.config.schema import ModelConfig
from hybridrl.trainers.evaluation import Scoring
from hybridrl.data.loader import DataFields
from hybridrl.protocol import Batch, Fields
from hybridrl.rewards import RewardFunctionSource, RewardScorer
from hybridrl.utils.tiny_model import save_tiny_model
from hybridrl.modeling.model_builder import load_tokenizer

REWARD = '''
import math, time

def compute_score(data_source, solution_str, ground_truth, extra_info):
    if solution_str.startswith("9"):
        raise ZeroDivisionError("division by zero in my reward")
    if solution_str.startswith("8"):
        time.sleep(600)
    if solution_str.startswith("7"):
        return math.nan
    if solution_str.startswith("6"):
        return "1.0"
    return float(solution_str == ground_truth)
'''
TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return load_tokenizer(ModelConfig(path=str(save_tiny_model(tmp_path_factory.mktemp("tok") / "model"))))


@pytest.fixture(scope="module")
def scoring(tmp_path_factory, tokenizer):
    path = tmp_path_factory.mktemp("reward") / "my_reward.py"
    path.write_text(REWARD)
    with RewardScorer(RewardFunctionSource(str(path)), timeout_s=TIMEOUT_S, num_workers=2) as scorer:
        yield Scoring(scorer, tokenizer)


def response_batch(tokenizer, texts: list[str], truth: str = "2") -> Batch:
    """Right-padded response token ids ``[B, R]`` with their mask, and the per-sample reward inputs."""
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    width = max(len(row) for row in ids)
    responses = torch.full((len(ids), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for row, tokens in enumerate(ids):
        responses[row, :len(tokens)], mask[row, :len(tokens)] = torch.tensor(tokens), 1
    size = len(texts)
    return Batch({Fields.RESPONSES: responses, Fields.RESPONSE_MASK: mask},
                 {DataFields.DATA_SOURCE: ["my_task"] * size, DataFields.GROUND_TRUTH: [truth] * size,
                  DataFields.EXTRA_INFO: [{}] * size})


@pytest.mark.parametrize(("first_digit", "phrases"), [
    ("9", ["raised ZeroDivisionError: division by zero in my reward"]),
    ("8", ["timeout", "1 s timeout"]),
    ("7", ["invalid", "returned nan"]),
    ("6", ["invalid", "returned a str, not a number"]),
], ids=["raises", "hangs", "nan", "not_a_number"])
@pytest.mark.timeout(60)
def test_a_batch_where_every_sample_fails_stops_the_run(scoring, tokenizer, first_digit, phrases):
    batch = response_batch(tokenizer, [f"{first_digit}{index}" for index in range(3)])
    started = time.monotonic()
    with pytest.raises(ValueError) as caught:
        scoring.token_level_scores(batch)
    message = str(caught.value)
    assert "all 3 samples of the batch failed" in message and "my_reward.py" in message, message
    assert "sample 0 (data_source='my_task')" in message, message
    for phrase in phrases:
        assert phrase in message, message
    assert time.monotonic() - started < 30  # a hanging function costs its timeout per sample, never more


def test_one_failing_sample_scores_zero_and_is_logged_with_its_index(scoring, tokenizer, caplog):
    batch = response_batch(tokenizer, ["2", "9", "7", "3"])
    with caplog.at_level(logging.WARNING):
        scores, metrics = scoring.token_level_scores(batch)
    assert scores.sum(-1).tolist() == [1.0, 0.0, 0.0, 0.0]
    assert metrics["reward/num_error"] == 1 and metrics["reward/num_invalid"] == 1
    assert "sample 1 (data_source='my_task'): error: raised ZeroDivisionError" in caplog.text
