"""Config side of ``ppo_micro_batch_size_per_gpu: auto`` and ``actor.adaptive_accumulation``: accepted forms, the
plan and its report, and one ConfigError naming the key for each nonsense value."""

from __future__ import annotations

import pytest

from hybridrl.config import ConfigError, load_config, role_plan
from hybridrl.config.plan_report import batch_plan_report

CPU = ["trainer.device=cpu"]  # the default preset: 16 prompts × n=4, mini-batch 8 prompts, 2 ranks → 16 per rank
AUTO = ["actor.ppo_micro_batch_size_per_gpu=auto", "actor.micro_batch_sizing.memory_budget_mb=2048"]
ADAPTIVE = ["actor.adaptive_accumulation.enable=true"]


def test_auto_is_accepted_and_left_to_the_worker():
    config = load_config(CPU + AUTO + ["algorithm=gae", "critic.ppo_micro_batch_size_per_gpu=auto",
                                       "critic.micro_batch_sizing.memory_budget_mb=512",
                                       "critic.micro_batch_sizing.headroom=0.1"], check_paths=False)
    for role, local_sequences in (("actor", 16), ("critic", 32)):  # critic mini-batch: 16 prompts by default
        plan = role_plan(config, role)
        assert plan.auto_micro_batch and plan.local_mini_batch_sequences == local_sequences
        assert plan.micro_batch_size_per_gpu is None and plan.grad_accum_steps is None
    report = batch_plan_report(config, include_critic=True)
    assert "16 = micro-batch sized from memory at start-up (auto: largest fitting 2048 MiB with 15% headroom)" in report
    assert "largest fitting 512 MiB with 10% headroom" in report


def test_auto_on_a_gpu_needs_no_budget():
    config = load_config(["trainer.device=cuda", "actor.ppo_micro_batch_size_per_gpu=auto"], check_paths=False)
    assert "largest fitting the free device memory" in batch_plan_report(config, include_critic=False)


def test_adaptive_accumulation_is_accepted_within_bounds():
    config = load_config(CPU + ADAPTIVE + ["actor.adaptive_accumulation.min_steps=2",
                                           "actor.adaptive_accumulation.max_steps=8",
                                           "actor.adaptive_accumulation.lr_scaling=linear"], check_paths=False)
    assert role_plan(config, "actor").grad_accum_steps == 4


BAD = [
    (["actor.ppo_micro_batch_size_per_gpu=big"], "actor.ppo_micro_batch_size_per_gpu", "or 'auto'"),
    (["critic.ppo_micro_batch_size_per_gpu=0"], "critic.ppo_micro_batch_size_per_gpu", "or 'auto'"),
    (["actor.ppo_micro_batch_size_per_gpu=2.5"], "actor.ppo_micro_batch_size_per_gpu", "incompatible"),
    (["actor.ppo_micro_batch_size_per_gpu=auto"], "actor.micro_batch_sizing.memory_budget_mb", "required on CPU"),
    (AUTO + ["actor.use_dynamic_bsz=true"], "actor.ppo_micro_batch_size_per_gpu", "one or the other"),
    (AUTO + ["actor.micro_batch_sizing.headroom=1.2"], "actor.micro_batch_sizing.headroom", "[0, 1)"),
    (["actor.micro_batch_sizing.memory_budget_mb=-5"], "actor.micro_batch_sizing.memory_budget_mb", "positive"),
    (ADAPTIVE + ["actor.adaptive_accumulation.lr_scaling=cubic"], "actor.adaptive_accumulation.lr_scaling",
     "expected one of linear, sqrt, none"),
    (ADAPTIVE + ["actor.adaptive_accumulation.max_steps=2"], "actor.adaptive_accumulation.max_steps",
     "must bound the configured 4 accumulation steps"),
    (ADAPTIVE + ["actor.adaptive_accumulation.min_steps=8"], "actor.adaptive_accumulation.min_steps",
     "must bound the configured 4 accumulation steps"),
    (ADAPTIVE + ["actor.adaptive_accumulation.min_steps=8", "actor.adaptive_accumulation.max_steps=4"],
     "actor.adaptive_accumulation.max_steps", "must be >= actor.adaptive_accumulation.min_steps=8"),
    (ADAPTIVE + ["actor.adaptive_accumulation.tolerance=0.5"], "actor.adaptive_accumulation.tolerance", ">= 1"),
    (ADAPTIVE + ["actor.use_dynamic_bsz=true"], "actor.adaptive_accumulation.enable", "fixed micro-batches"),
    (ADAPTIVE + ["trainer.n_gpus_per_node=1"], "actor.adaptive_accumulation.min_steps", "single rank"),
]


@pytest.mark.parametrize(("overrides", "key", "phrase"), BAD, ids=[" ".join(case[0]) for case in BAD])
def test_nonsense_is_refused_naming_the_key(overrides, key, phrase):
    with pytest.raises(ConfigError) as caught:
        load_config(CPU + overrides, check_paths=False)
    assert key in caught.value.keys, str(caught.value)
    assert phrase in str(caught.value)
