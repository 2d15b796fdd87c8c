"""The planner's communication bytes equal what the engine's collectives move: real GRPO/PPO steps on gloo (2 and 4
CPU ranks, full sharding and HSDP, per-step and per-micro-batch gradient sync, gathered once or per micro-batch),
each update's ``comm/*_bytes`` metrics, and every worker call's (``comm_bytes/<method>/<kind>``: HF generation, the
old-policy, reference and value forwards), against :func:`hybridrl.planner.comm_plan.plan_communication`."""

from __future__ import annotations

import pytest

from hybridrl.config import load_config
from hybridrl.planner.comm_plan import LINKS, Topology, plan_communication
from hybridrl.planner.report import shapes_of
from hybridrl.trainers.rl_trainer import RLTrainer
from hybridrl.utils.tiny_model import TinyModelSpec, save_tiny_model
from hybridrl.utils.tracking import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.distributed]

# The engine's payload kinds (comm/<metric>) and the planner's collective kinds.
KINDS = {"param_gather_bytes": "all_gather", "grad_reduce_bytes": "reduce_scatter",
         "grad_all_reduce_bytes": "fsdp_all_reduce"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # 3 query heads of 32 over 1 KV head: q rows 96 and k/v rows 32 — an odd vocabulary pads on 4 ranks
    spec = TinyModelSpec(hidden_size=96, num_heads=3, num_kv_heads=1, intermediate_size=64, vocab_size=81)
    return save_tiny_model(tmp_path_factory.mktemp("comm") / "model", spec)


def one_step(model_dir, run_dir, *extra):
    return load_config([
        f"model.path={model_dir}", "model.dtype=float32", f"trainer.default_local_dir={run_dir}",
        "trainer.total_training_steps=1", "trainer.logger=[jsonl]", "trainer.val_before_train=false",
        "trainer.save_at_end=false", "trainer.ray.num_cpus=4",
        "data.synthetic_task_kwargs={max_digits: 1, operators: '+', num_val: 8}", "data.max_response_length=3",
        "data.train_batch_size=4", "rollout.n=2", "actor.ppo_mini_batch_size=2", "actor.ppo_micro_batch_size_per_gpu=1",
        *extra])


FORWARDS = ("compute_log_prob", "compute_ref_log_prob", "compute_values")


@pytest.mark.parametrize("layout", [
    # both in test-long: the first took 76 s of the parallel suite (2026-12-06), which outgrew its 15 minutes
    pytest.param(["actor.fsdp.gather_once=false", "actor.use_kl_loss=true"], marks=pytest.mark.long),
    pytest.param(["trainer.n_gpus_per_node=4", "data.train_batch_size=8", "actor.ppo_mini_batch_size=4",
                  "actor.fsdp.fsdp_size=2", "actor.fsdp.grad_sync=micro_batch", "actor.fsdp.gather_once=true",
                  "algorithm=gae", "critic.ppo_mini_batch_size=4", "critic.ppo_micro_batch_size_per_gpu=1",
                  "critic.fsdp.fsdp_size=2", "critic.fsdp.gather_once=false", "critic.fsdp.grad_sync=micro_batch",
                  "critic.fsdp.defer_all_reduce=false", "trainer.critic_warmup=0"],
                 marks=pytest.mark.long),
], ids=["full_shard_per_micro_batch_gathers", "hsdp_4_ranks_with_critic"])
def test_planned_bytes_equal_the_engines(model_dir, tmp_path, layout):
    config = one_step(model_dir, tmp_path / "run", *layout)
    RLTrainer(config).fit()
    row = next(row for row in read_metrics(tmp_path / "run") if "actor/comm/param_gather_bytes" in row)
    topology = Topology(1, config.trainer.n_gpus_per_node, LINKS["pcie"], LINKS["1gbe"])
    planned = plan_communication(config, shapes_of(config), topology, compute={}).plan
    roles = ["actor"] + (["critic"] if "algorithm=gae" in layout else [])
    for role in roles:
        for metric, kind in KINDS.items():
            assert row[f"{role}/comm/{metric}"] == planned.phase_bytes(f"update_{role}", kind), (role, metric)
    assert row["actor/comm/param_gather_bytes"] > 0 and row["actor/comm/grad_reduce_bytes"] > 0
    forwards = sum(row.get(f"comm_bytes/{method}/all_gather", 0) for method in FORWARDS)
    assert forwards == planned.phase_bytes("log_probs", "all_gather") > 0
    assert row["comm_bytes/generate_sequences/all_gather"] == planned.phase_bytes("generate", "all_gather")
