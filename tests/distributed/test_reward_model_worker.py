"""The reward-model worker on 2 Ray CPU ranks scores padded sequences exactly as a plain unpadded forward does."""

from __future__ import annotations

import pytest
import torch
from distributed_helpers import cpu_pool, stop
from transformers import AutoModelForSequenceClassification

from hybridrl.config import load_config
from hybridrl.runtime import WorkerGroup
from hybridrl.protocol import Batch, Fields
from hybridrl.utils.tiny_model import save_tiny_model
from hybridrl.workers.reward_model_worker import RM_SCORES, RewardModelWorker

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("rm")
    policy = save_tiny_model(root / "policy")
    reward = AutoModelForSequenceClassification.from_pretrained(policy, num_labels=1)
    reward.config.pad_token_id = 0
    reward.save_pretrained(root / "reward")
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(policy).save_pretrained(root / "reward")
    return policy, root / "reward"


def test_scores_match_unpadded_forward(ray_runtime, model_dirs):
    policy, reward = model_dirs
    config = load_config([f"model.path={policy}", "model.dtype=float32", "trainer.n_gpus_per_node=2",
                          f"reward_model.model_path={reward}",
                          "reward_model.micro_batch_size_per_gpu=2"])
    group = WorkerGroup(RewardModelWorker, cpu_pool(ray_runtime, "rm_pool", 2), name="reward_model", args=(config,))
    try:
        generator = torch.Generator().manual_seed(0)
        input_ids = torch.randint(4, 60, (5, 9), generator=generator)
        attention_mask = torch.ones(5, 9, dtype=torch.long)
        attention_mask[0, :3] = 0  # left padding (prompt)
        attention_mask[1, -4:] = 0  # right padding (short response)
        attention_mask[2, :1] = 0
        attention_mask[2, -2:] = 0
        batch = Batch(tensors={Fields.INPUT_IDS: input_ids * attention_mask, Fields.ATTENTION_MASK: attention_mask})
        scores = group.call(RewardModelWorker.compute_rm_score, batch)[RM_SCORES]
    finally:
        stop(group)
    plain = AutoModelForSequenceClassification.from_pretrained(reward, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = torch.stack([plain(input_ids=row[mask.bool()][None]).logits[0, 0]
                                for row, mask in zip(input_ids, attention_mask)])
    assert scores.shape == (5,)
    assert torch.allclose(scores, expected, atol=1e-5), (scores, expected)
