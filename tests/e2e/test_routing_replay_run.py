"""MoE routing replay in a whole run: GRPO on a tiny random Qwen3-MoE, HF rollout recording each token's experts,
``actor.router_replay.mode=R3``, 2 CPU ranks (the record is split across them with the rows), packed rows and several
mini-batches. At the rollout's weights the trainer's own routers choose what the rollout recorded — the HF engine
generates with the same module — so the old-log-prob pass's agreement is (up to near-ties the cached and the full
forward round apart) 1: a record laid out at the wrong tokens would agree at chance (1 in 6 for 2 of 4 experts). The
update's forwards report how often the moving routers would have routed elsewhere."""

from __future__ import annotations

import pytest

from hybridrl.config import load_config
from hybridrl.trainers.rl_trainer import RLTrainer
from hybridrl.utils.tiny_model import TinyModelSpec, save_tiny_model
from hybridrl.utils.tracking import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.distributed]


def test_the_rollouts_routing_reaches_the_trainer(tmp_path):
    model_dir = save_tiny_model(tmp_path / "model", TinyModelSpec(architecture="qwen3_moe"))
    config = load_config([
        f"model.path={model_dir}", "model.dtype=float32", f"trainer.default_local_dir={tmp_path / 'run'}",
        "trainer.total_training_steps=2", "trainer.logger=[jsonl]", "trainer.val_before_train=false",
        "trainer.save_at_end=false", "trainer.ray.num_cpus=4", "trainer.n_gpus_per_node=2", "rollout.name=hf",
        "data.synthetic_task_kwargs={max_digits: 1, operators: '+', num_val: 8}", "data.max_response_length=8",
        "data.train_batch_size=4", "rollout.n=2", "actor.ppo_mini_batch_size=2", "actor.ppo_micro_batch_size_per_gpu=2",
        "actor.old_log_prob=recompute", "algorithm=grpo", "actor.optim.lr=3e-3", "model.use_remove_padding=true",
        "actor.router_replay.mode=R3"])
    RLTrainer(config).fit()
    rows = [row for row in read_metrics(tmp_path / "run") if "actor/pg_loss" in row]
    assert len(rows) == 2
    for row in rows:
        assert row["actor/routing_agreement"] >= 0.99, row["actor/routing_agreement"]
        assert 0.5 < row["actor/routing_agreement_update"] <= 1.0
        assert row["rollout/log_prob_diff_max"] < 1e-3
