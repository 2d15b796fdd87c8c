"""GRPO with a reward-model worker group and a fused reward, through Ray + FSDP2 on 2 CPU ranks.

The reward model has another vocabulary than the policy (so every response is re-tokenised with its tokenizer and chat
template); the fused reward is rule + normalised RM + length and diversity guards, capped. The logged components
must add up to the score the advantages were computed from.
"""

from __future__ import annotations

import pytest
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from hybridrl.config import load_config
from hybridrl.trainers.rl_trainer import RLTrainer
from hybridrl.utils.tiny_model import DEFAULT_CHARACTERS, save_tiny_model
from hybridrl.utils.tracking import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.distributed]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("rm_loop")
    policy = save_tiny_model(root / "policy")
    base = save_tiny_model(root / "rm_base", characters=DEFAULT_CHARACTERS[::-1], seed=3)  # another vocabulary
    reward = AutoModelForSequenceClassification.from_pretrained(base, num_labels=1)
    reward.save_pretrained(root / "reward")
    AutoTokenizer.from_pretrained(base).save_pretrained(root / "reward")
    return policy, root / "reward"


@pytest.mark.parametrize("rm_gpus", [0, pytest.param(1, marks=pytest.mark.long)],  # own pool: in make test-long
                         ids=["colocated", "own-pool"])
def test_grpo_with_a_reward_model_group_and_a_fused_reward(model_dirs, tmp_path, rm_gpus):
    policy, reward = model_dirs
    config = load_config([
        f"model.path={policy}", "model.dtype=float32", f"trainer.default_local_dir={tmp_path / 'run'}",
        "trainer.total_training_steps=2", "trainer.logger=[jsonl]", "trainer.val_before_train=false",
        "trainer.save_at_end=false", "trainer.ray.num_cpus=4",
        "data.synthetic_task_kwargs={max_digits: 1, operators: '+', num_val: 8}", "data.train_batch_size=4",
        "rollout.n=2", "actor.ppo_mini_batch_size=2", "actor.ppo_micro_batch_size_per_gpu=2",
        "data.max_response_length=3", "reward_model.enable=true", f"reward_model.model_path={reward}",
        "reward_fusion.rm_weight=0.5", "reward_fusion.normalize=[rm]", "reward_fusion.length_penalty_coef=0.1",
        "reward_fusion.diversity_penalty_coef=0.2", "reward_fusion.cap=1.0", "reward_fusion.weighting=inverse_std",
        f"reward_model.n_gpus={rm_gpus}",
    ])
    trainer = RLTrainer(config)
    result = trainer.fit()
    assert result.global_step == 2
    assert (trainer.reward_model.pool is trainer.actor.pool) == (rm_gpus == 0)  # own pool: not the actor's devices
    assert trainer.reward_model.world_size == (rm_gpus or 2)
    rows = read_metrics(tmp_path / "run")
    for row in rows:
        for component in ("rule", "rm", "length_penalty", "diversity_penalty", "fused"):
            assert f"reward/{component}/mean" in row, (component, sorted(row))
        assert row["reward/rm/std"] > 0  # the reward model really scored (distinct sequences, distinct scores)
        assert row["critic/score/mean"] == pytest.approx(row["reward/fused/mean"], abs=1e-6)
        assert row["reward/length_penalty/mean"] < 0 and row["critic/score/max"] <= 1.0
        assert row["reward/rm/weight"] > 0 and row["reward/length_penalty/weight"] == 1.0   # guards keep theirs
