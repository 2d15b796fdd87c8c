"""Ulysses sequence parallelism in a whole run: PPO with a critic, a KL loss against the reference, on 2 CPU ranks
(gloo), once with every rank holding whole sequences (DP = 2) and once with both ranks splitting every sequence
(``actor.ulysses_sequence_parallel_size=2``, same for the critic: DP = 1). The rollouts are the same (generation is
never split), so the first step's losses, gradient norms and log-probs must agree to fp32 reduction order — one
optimizer step over the whole batch, so the mini-batches hold the same rows both ways."""

from __future__ import annotations

import pytest

from hybridrl.config import load_config
from hybridrl.planner.comm_plan import LINKS, Topology, plan_communication
from hybridrl.planner.report import shapes_of
from hybridrl.trainers.rl_trainer import RLTrainer
from hybridrl.utils.tiny_model import TinyModelSpec, save_tiny_model
from hybridrl.utils.tracking import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.distributed]

COMPARED = ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "actor/entropy", "critic/vf_loss",
            "critic/grad_norm", "rollout/log_prob_diff_max")


def run(model_dir, run_dir, sp_size, *extra, steps=1):
    config = load_config([
        f"model.path={model_dir}", "model.dtype=float32", f"trainer.default_local_dir={run_dir}",
        f"trainer.total_training_steps={steps}", "trainer.logger=[jsonl]", "trainer.val_before_train=false",
        "trainer.save_at_end=false", "trainer.ray.num_cpus=4", "trainer.n_gpus_per_node=2",
        "data.synthetic_task_kwargs={max_digits: 1, operators: '+', num_val: 8}", "data.max_response_length=6",
        "data.train_batch_size=4", "rollout.n=2", "actor.ppo_mini_batch_size=4", "actor.ppo_micro_batch_size_per_gpu=1",
        "actor.old_log_prob=recompute", "actor.use_kl_loss=true", "algorithm=gae", "trainer.critic_warmup=0",
        "critic.ppo_mini_batch_size=4", "critic.ppo_micro_batch_size_per_gpu=2",
        f"actor.ulysses_sequence_parallel_size={sp_size}", f"critic.ulysses_sequence_parallel_size={sp_size}", *extra])
    RLTrainer(config).fit()
    rows = [row for row in read_metrics(run_dir) if "actor/pg_loss" in row]
    return config, rows[0] if steps == 1 else rows


@pytest.mark.long  # 86 s of the parallel suite (2026-12-06); the split's exactness per module: test_ulysses.py
def test_split_sequences_train_as_whole_ones(tmp_path):
    model_dir = save_tiny_model(tmp_path / "model", TinyModelSpec(hidden_size=128, num_heads=4, num_kv_heads=2))
    _, whole = run(model_dir, tmp_path / "whole", 1)
    config, split = run(model_dir, tmp_path / "split", 2)
    for name in COMPARED:
        assert split[name] == pytest.approx(whole[name], rel=1e-4, abs=1e-6), name
    assert whole["actor/grad_norm"] > 0 and whole["critic/grad_norm"] > 0
    # the split ran, and its activations are counted apart from the parameters (the gathers are equal both ways as
    # parameters are gathered once per step on CPU, fsdp.gather_once=auto, whatever the micro-batches)
    for role in ("actor", "critic"):
        assert whole[f"{role}/comm/sequence_parallel_bytes"] == 0 < split[f"{role}/comm/sequence_parallel_bytes"]
        assert split[f"{role}/comm/param_gather_bytes"] == whole[f"{role}/comm/param_gather_bytes"] > 0, role
    # the planner's exchanges are a worst case (full-length rows): the run's rows are shorter
    planned = plan_communication(config, shapes_of(config), Topology(1, 2, LINKS["pcie"], LINKS["1gbe"]), compute={})
    for role in ("actor", "critic"):
        assert 0 < split[f"{role}/comm/sequence_parallel_bytes"] <= \
            planned.plan.phase_bytes(f"update_{role}", "sequence_parallel"), role


@pytest.mark.long
def test_vllm_takes_the_weights_a_split_update_trained(tmp_path):
    """vLLM colocated: the weights an SP = 2 update trained reach the engine whole (the resharder gathers over all
    ranks, not the data-parallel ones): the second step's rollout log-probs match the trainer's."""
    model_dir = save_tiny_model(tmp_path / "model", TinyModelSpec(hidden_size=128, num_heads=4, num_kv_heads=2))
    _, rows = run(model_dir, tmp_path / "run", 2, "rollout=vllm_cpu", steps=2)
    assert rows[0]["actor/grad_norm"] > 0 and rows[0]["actor/comm/sequence_parallel_bytes"] > 0
    assert rows[1]["rollout/log_prob_diff_max"] <= 1e-3
