"""``actor.old_log_prob=auto``: an exactly on-policy update (one epoch over one mini-batch) may skip the old-log-prob
forward and use its own log-probs, detached — the same update as with the recomputed old log-probs; anything else
without old log-probs is refused. The config rule that decides it is checked case by case."""

from __future__ import annotations

import copy

import pytest
import torch

from hybridrl.config import load_config
from hybridrl.config.schema import ActorConfig, ModelConfig, OptimConfig
from hybridrl.config.sizes import reuses_update_log_probs
from hybridrl.protocol import Batch, Fields
from hybridrl.utils.tiny_model import save_tiny_model
from hybridrl.engines.base import TrainingEngine
from hybridrl.engines.losses import PolicyLoss, SequenceForward
from hybridrl.engines.micro_batches import DataParallelGroup, MicroBatching
from hybridrl.engines.passes import log_probs
from hybridrl.modeling.model_builder import build_model
from hybridrl.engines.optim import build_optimizer, build_scheduler

ROWS, WIDTH, RESPONSE = 8, 10, 4
SPLIT = ["rollout=vllm_cpu", "rollout.n_gpus=1", "trainer.n_gpus_per_node=1"]  # async modes need the standalone pool


def rollout_rows() -> Batch:
    generator = torch.Generator().manual_seed(0)
    mask = torch.ones(ROWS, WIDTH, dtype=torch.long)
    mask[::2, -2:] = 0  # ragged responses
    mask[1::3, :2] = 0  # left-padded prompts
    input_ids = torch.randint(4, 60, (ROWS, WIDTH), generator=generator) * mask
    return Batch(tensors={Fields.INPUT_IDS: input_ids, Fields.ATTENTION_MASK: mask,
                          Fields.RESPONSES: input_ids[:, -RESPONSE:].clone(),
                          Fields.RESPONSE_MASK: mask[:, -RESPONSE:].clone(),
                          Fields.ADVANTAGES: torch.randn(ROWS, RESPONSE, generator=generator)})


def engine(model, micro_batching: MicroBatching) -> TrainingEngine:
    optim = OptimConfig(lr=1e-2, eps=1e-6)
    optimizer = build_optimizer(model, optim)
    return TrainingEngine(model, dp=DataParallelGroup(), micro_batching=micro_batching, optimizer=optimizer,
                          scheduler=build_scheduler(optimizer, optim, total_steps=2))


def update(engine: TrainingEngine, rows: Batch, loss: PolicyLoss, *, mini_batch_size: int, epochs: int = 1) -> dict:
    """PPO epochs as ``ActorRolloutRefWorker.update_actor`` runs them (the loss checks the update first)."""
    return engine.train_epochs(rows, loss, mini_batch_size=mini_batch_size, epochs=epochs)


@pytest.mark.parametrize("policy_loss", ["vanilla", "gspo", "cispo"])
def test_update_without_old_log_probs_equals_the_recomputed_one(tmp_path, policy_loss):
    model = build_model(ModelConfig(path=str(save_tiny_model(tmp_path / "m")), dtype="float32"), "actor")
    twin, initial = copy.deepcopy(model), copy.deepcopy(model)
    rows = rollout_rows()
    loss = PolicyLoss(forward=SequenceForward(), temperature=1.0,
                      actor=ActorConfig(policy_loss=policy_loss, entropy_coeff=0.01))
    micro = MicroBatching(micro_batch_size=3)  # the log-prob pass and the update cut the batch differently
    recomputing, reusing = engine(model, micro), engine(twin, micro)
    with_old = rows.union(log_probs(recomputing, rows, MicroBatching(micro_batch_size=8), SequenceForward(),
                                    temperature=1.0, with_entropy=False))
    assert Fields.OLD_LOG_PROBS in with_old and Fields.OLD_LOG_PROBS not in rows
    logged_with = update(recomputing, with_old, loss, mini_batch_size=ROWS)
    logged_without = update(reusing, rows, loss, mini_batch_size=ROWS)
    for (name, param), twin_param in zip(model.named_parameters(), twin.parameters()):
        assert torch.allclose(param, twin_param, rtol=1e-5, atol=1e-7), name
    assert logged_without["pg_loss"] == pytest.approx(logged_with["pg_loss"], rel=1e-5, abs=1e-7)
    assert logged_without["ppo_kl"] == 0.0 and logged_without["pg_clipfrac"] == 0.0  # ratio 1 by construction
    assert any(not torch.equal(a, b) for a, b in zip(model.parameters(), initial.parameters()))  # it did update


def test_update_without_old_log_probs_is_refused_off_policy(tmp_path):
    model = build_model(ModelConfig(path=str(save_tiny_model(tmp_path / "m")), dtype="float32"), "actor")
    rows, loss = rollout_rows(), PolicyLoss(forward=SequenceForward(), temperature=1.0)
    with pytest.raises(ValueError, match="no old_log_probs.*2 epoch"):
        update(engine(model, MicroBatching(micro_batch_size=4)), rows, loss, mini_batch_size=ROWS, epochs=2)
    with pytest.raises(ValueError, match="mini-batches of 4 of 8 rows"):
        update(engine(model, MicroBatching(micro_batch_size=4)), rows, loss, mini_batch_size=4)


@pytest.mark.parametrize("overrides, reuses", [
    ([], False),  # defaults: ppo_mini_batch_size 16 < data.train_batch_size
    (["actor.ppo_mini_batch_size=${data.train_batch_size}"], True),
    (["actor.ppo_mini_batch_size=${data.train_batch_size}", "actor.ppo_epochs=2"], False),
    (["actor.ppo_mini_batch_size=${data.train_batch_size}", "actor.old_log_prob=recompute"], False),
    (["actor.ppo_mini_batch_size=${data.train_batch_size}", "algorithm.use_kl_in_reward=true"], False),
    (["actor.ppo_mini_batch_size=${data.train_batch_size}", "actor.adaptive_accumulation.enable=true",
      "actor.log_grad_noise_scale=true"], False),
    (["actor.ppo_mini_batch_size=${data.train_batch_size}", "algorithm.off_policy_correction.kind=tis"], False),
    (["actor.ppo_mini_batch_size=${data.train_batch_size}", "async_training.mode=one_step_off", *SPLIT], False),
    (["actor.ppo_mini_batch_size=${data.train_batch_size}", "async_training.mode=bounded",
      "async_training.max_staleness=0", *SPLIT], True),  # η = 0 is the synchronous loop: the same update
])
def test_which_configs_skip_the_old_log_prob_pass(overrides, reuses):
    assert reuses_update_log_probs(load_config(overrides, check_paths=False)) is reuses
