"""``ppo_micro_batch_size_per_gpu: auto`` on CPU: the worker-side decision from a config and a model (analytic model,
configured budget), checked against the analytic estimates with the options written out by hand."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from hybridrl.config.schema import (
    ActorConfig,
    DataConfig,
    FSDPConfig,
    MicroBatchSizingConfig,
    ModelConfig,
    RolloutConfig,
    TrainConfig,
    TrainerConfig,
)
from hybridrl.config.sizes import role_plan
from hybridrl.utils.tiny_model import TinyModelSpec, build_tiny_model
from hybridrl.engines.micro_batches import DataParallelGroup
from hybridrl.autotune.auto_micro_batch import memory_budget, resolve_plan, sizing_options
from hybridrl.autotune.memory_sizing import DecoderShape, Precision, estimate_micro_batch_bytes, format_bytes

CPU = torch.device("cpu")
PROMPT, RESPONSE = 256, 256  # the longest expected sequence: 512 tokens


def auto_config(budget_mb, *, micro="auto", headroom=0.15, **model_options) -> TrainConfig:
    # 16 prompts × n=1 on one rank: a per-rank mini-batch of 16 sequences
    return TrainConfig(model=ModelConfig(path="unused", dtype="float32", **model_options),
                       actor=ActorConfig(ppo_mini_batch_size=16, ppo_micro_batch_size_per_gpu=micro,
                                         micro_batch_sizing=MicroBatchSizingConfig(memory_budget_mb=budget_mb,
                                                                                   headroom=headroom)),
                       rollout=RolloutConfig(n=1),
                       data=DataConfig(train_batch_size=16, max_prompt_length=PROMPT, max_response_length=RESPONSE),
                       trainer=TrainerConfig(device="cpu", n_gpus_per_node=1))


@pytest.fixture(scope="module")
def model():
    return build_tiny_model(TinyModelSpec(), 40, pad_token_id=0, eos_token_id=1)


def by_hand(model, micro_batch_size: int) -> float:
    """The estimate for fp32, one rank, padded sdpa batches, no checkpointing, at 512 tokens."""
    return estimate_micro_batch_bytes(DecoderShape.from_hf_config(model.config), micro_batch_size, PROMPT + RESPONSE,
                                      world_size=1, precision=Precision(), checkpointing=False, packed=False,
                                      attention="sdpa", accumulating=True).total


def test_picks_the_largest_fitting_micro_batch_and_logs_one_line(model, caplog):
    # A whole-MiB budget whose usable 85 % holds 4 sequences but not 8
    budget_mb = math.ceil(by_hand(model, 4) / 0.85 / 2**20)
    assert by_hand(model, 8) > 0.85 * budget_mb * 2**20
    config = auto_config(budget_mb)
    plan = role_plan(config, "actor")
    assert plan.auto_micro_batch and plan.micro_batch_size_per_gpu is None and plan.grad_accum_steps is None
    with caplog.at_level(logging.INFO, logger="hybridrl.autotune.auto_micro_batch"):
        resolved, sized = resolve_plan(config, "actor", model, plan, dp=DataParallelGroup(), device=CPU)
    assert (resolved.micro_batch_size_per_gpu, resolved.grad_accum_steps) == (4, 4)  # 4 × 4 × 1 = 16
    assert sized.decision.measured == pytest.approx({1: by_hand(model, 1), 2: by_hand(model, 2),
                                                     4: by_hand(model, 4), 8: by_hand(model, 8)})
    assert sized.budget_bytes == budget_mb * 2**20 and sized.budget_source == "configured"
    assert sized.per_sequence_bytes + sized.state_bytes == pytest.approx(by_hand(model, 1))
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 1 and lines[0] == sized.line()
    for part in (f"budget {format_bytes(budget_mb * 2**20)} (configured)", "per sequence of 512 tokens",
                 "micro_batch_size=4, grad_accum_steps=4", "analytic model"):
        assert part in lines[0], part


def test_options_follow_the_config():
    config = auto_config(64, enable_gradient_checkpointing=True, use_remove_padding=True, attn_implementation="eager")
    config.model.dtype = "bfloat16"
    config.actor.fsdp = FSDPConfig(reduce_dtype="bfloat16")
    config.actor.ulysses_sequence_parallel_size = 2
    options = sizing_options(config, "actor", world_size=4)
    assert options == dict(world_size=4, precision=Precision(compute_bytes=2, grad_bytes=2), checkpointing=True,
                           packed=True, attention="eager", accumulating=True, logits_bytes=4, gather_once=False,
                           sequence_parallel=2)
    assert sizing_options(config, "actor", world_size=4, device_type="cpu")["gather_once"]  # fsdp.gather_once=auto
    assert sizing_options(config, "actor", world_size=1)["gather_once"]  # ... and on one GPU


def test_an_explicit_micro_batch_is_left_alone(model):
    config = auto_config(64, micro=2)
    plan = role_plan(config, "actor")
    assert resolve_plan(config, "actor", model, plan, dp=DataParallelGroup(), device=CPU) == (plan, None)


def test_budget_sources_and_refusals(model):
    assert memory_budget(512, CPU, DataParallelGroup()) == (512 * 2**20, "configured")
    with pytest.raises(ValueError, match="memory_budget_mb is required on CPU"):
        memory_budget(None, CPU, DataParallelGroup())
    config = auto_config(1)  # 1 MiB: not even one sequence of 512 tokens
    with pytest.raises(ValueError, match="even micro_batch_size=1"):
        resolve_plan(config, "actor", model, role_plan(config, "actor"), dp=DataParallelGroup(), device=CPU)


def test_with_micro_batch_size_keeps_the_identity():
    plan = role_plan(auto_config(64), "actor")
    assert plan.with_micro_batch_size(2).grad_accum_steps == 8
    with pytest.raises(ValueError, match="does not divide the per-rank mini-batch of 16"):
        plan.with_micro_batch_size(3)


def test_a_split_sequence_fits_a_larger_micro_batch(model):
    """A group of 2 ranks splitting each sequence (the data-parallel size stays 1): each holds half of each
    sequence's layer activations (the attention mask stays whole) and half of the states, so at a budget that holds
    8 split sequences one rank holding them whole fits only 4."""
    split_bytes = estimate_micro_batch_bytes(DecoderShape.from_hf_config(model.config), 8, PROMPT + RESPONSE,
                                             world_size=2, precision=Precision(), attention="sdpa",
                                             sequence_parallel=2).total
    budget_mb = math.ceil(split_bytes / 0.85 / 2**20)
    whole = auto_config(budget_mb)
    split = auto_config(budget_mb)
    split.trainer.n_gpus_per_node, split.actor.ulysses_sequence_parallel_size = 2, 2
    sizes = {}
    for name, config, ranks in (("whole", whole, 1), ("split", split, 2)):
        plan = role_plan(config, "actor")
        assert plan.local_mini_batch_sequences == 16  # one data-parallel rank either way
        resolved, _ = resolve_plan(config, "actor", model, plan, dp=DataParallelGroup(), device=CPU,
                                   ranks=DataParallelGroup(size=ranks))
        sizes[name] = resolved.micro_batch_size_per_gpu
    assert sizes == {"whole": 4, "split": 8}
