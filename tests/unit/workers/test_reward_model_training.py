"""The reward-model training engine on one process: the built model (scalar head, pad id, activation checkpointing),
packed and padded pair rewards agree, and one Bradley–Terry step moves the rewards the right way."""

from __future__ import annotations

import torch

from hybridrl.config import load_config
from hybridrl.data.preference import PreferencePair, encode_pairs
from hybridrl.utils.tiny_model import save_tiny_model
from hybridrl.engines.base import TrainingEngine
from hybridrl.engines.losses import BradleyTerryLoss, pair_rewards
from hybridrl.engines.micro_batches import DataParallelGroup, MicroBatching
from hybridrl.engines.optim import build_optimizer, build_scheduler
from hybridrl.workers.rm_train_worker import build_reward_model


def test_one_step_on_a_checkpointed_reward_model(tmp_path):
    config = load_config([f"model.path={save_tiny_model(tmp_path / 'model')}", "model.enable_gradient_checkpointing=true",
                          "data.synthetic_task=arithmetic", "optim.lr=1e-2"], "demo_rm")
    model, tokenizer = build_reward_model(config, torch.device("cpu"))
    assert model.is_gradient_checkpointing and model.config.pad_token_id == tokenizer.pad_token_id
    assert model.score.out_features == 1
    pairs = encode_pairs(tokenizer, [PreferencePair("1+2=", "3", "3999"), PreferencePair("4+4=", "8", "8123"),
                                     PreferencePair([{"role": "user", "content": "9+0="}], "9", "95")], 8)
    model.eval()
    with torch.no_grad():
        padded, packed = pair_rewards(model, pairs, packed=False), pair_rewards(model, pairs, packed=True)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(padded, packed))
    optimizer = build_optimizer(model, config.optim)
    engine = TrainingEngine(model, dp=DataParallelGroup(), micro_batching=MicroBatching(micro_batch_size=2),
                            optimizer=optimizer, scheduler=build_scheduler(optimizer, config.optim, 10))
    model.train()
    metrics = engine.optimizer_step(pairs, BradleyTerryLoss(packed=True))
    assert metrics["skipped_step"] == 0 and metrics["grad_norm"] > 0 and 0 <= metrics["accuracy"] <= 1
    model.eval()
    with torch.no_grad():
        chosen, rejected = pair_rewards(model, pairs, packed=False)
    assert float((chosen - rejected).mean()) > float((padded[0] - padded[1]).mean())  # the margin grew
