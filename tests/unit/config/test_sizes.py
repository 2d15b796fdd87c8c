"""The batch-size identity: global sequences = micro × accumulation × world, or a refusal naming the key."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridrl.config import ConfigError, plan_batches


@settings(max_examples=60, deadline=None)
@given(
    train_batch_size=st.integers(1, 64),
    n=st.integers(1, 8),
    mini=st.integers(1, 64),
    micro=st.integers(1, 32),
    ranks=st.integers(1, 8),
)
def test_plan_holds_the_identity_or_refuses(train_batch_size, n, mini, micro, ranks):
    arguments = dict(role="actor", train_batch_size=train_batch_size, responses_per_prompt=n, ppo_mini_batch_size=mini,
                     ppo_micro_batch_size_per_gpu=micro, use_dynamic_bsz=False, num_data_parallel_ranks=ranks)
    valid = mini <= train_batch_size and train_batch_size % mini == 0 and (mini * n) % ranks == 0 \
        and (mini * n // ranks) % micro == 0
    if not valid:
        with pytest.raises(ConfigError) as caught:
            plan_batches(**arguments)
        assert set(caught.value.keys) <= {"actor.ppo_mini_batch_size", "actor.ppo_micro_batch_size_per_gpu"}
        return
    plan = plan_batches(**arguments)
    assert plan.micro_batch_size_per_gpu * plan.grad_accum_steps * ranks == mini * n
    assert plan.num_mini_batches * mini == train_batch_size
    assert plan.local_mini_batch_sequences * ranks == plan.mini_batch_sequences


def test_dynamic_batch_size_has_no_fixed_accumulation():
    plan = plan_batches(role="critic", train_batch_size=8, responses_per_prompt=4, ppo_mini_batch_size=4,
                        ppo_micro_batch_size_per_gpu=None, use_dynamic_bsz=True, num_data_parallel_ranks=2)
    assert plan.grad_accum_steps is None and plan.micro_batch_size_per_gpu is None
    assert plan.local_mini_batch_sequences == 8 and plan.num_mini_batches == 2


def test_worked_example_from_the_readme():
    # 64 prompts × 8 responses, mini-batch 16 prompts, 8 ranks, micro 4 → 4 optimizer steps, 16 seq per rank, 4 micro-steps
    plan = plan_batches(role="actor", train_batch_size=64, responses_per_prompt=8, ppo_mini_batch_size=16,
                        ppo_micro_batch_size_per_gpu=4, use_dynamic_bsz=False, num_data_parallel_ranks=8)
    assert (plan.num_mini_batches, plan.local_mini_batch_sequences, plan.grad_accum_steps) == (4, 16, 4)
