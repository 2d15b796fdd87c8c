"""The planner's layout search: its printed overrides rebuild exactly the layout it planned, the fastest fitting
layout wins, the issue's job (7B PPO with a critic on 2 x 2 A10G over gigabit Ethernet) gets a layout that fits, and
the critic's savers are searched."""

from __future__ import annotations

import pytest

from hybridrl.cli import main
from hybridrl.config import load_config
from hybridrl.planner import Shapes, gpu_spec, plan_job, plan_memory
from hybridrl.planner.comm_plan import LINKS
from hybridrl.planner.known_models import KNOWN_SHAPES
from hybridrl.planner.search import OFFLOADS

QWEN_7B = Shapes(KNOWN_SHAPES["qwen2.5-7b"])
JOB = ["model.path=qwen2.5-7b", "model.dtype=bfloat16", "algorithm=gae", "rollout=vllm", "trainer.nnodes=2",
       "trainer.n_gpus_per_node=2", "data.max_prompt_length=512", "data.max_response_length=512",
       "data.train_batch_size=256", "rollout.n=4", "actor.ppo_mini_batch_size=256",
       "actor.ppo_micro_batch_size_per_gpu=8", "critic.ppo_mini_batch_size=256", "critic.ppo_micro_batch_size_per_gpu=8"]


def issue_job(*extra):
    return load_config([*JOB, *extra], check_paths=False)


@pytest.fixture(scope="module")
def planned():
    return plan_job(issue_job(), gpu_spec("a10g"), shapes=QWEN_7B, network=LINKS["1gbe"])


def test_the_7b_ppo_job_on_two_a10g_nodes_gets_a_layout_that_fits(planned):
    assert not planned.as_configured.fits(0.15)  # as the issue found it: no layout of its own fits
    best = planned.candidates[0]
    assert planned.recommendation.fits and best.memory.fits(0.15)
    # the 7B bf16 weights need vLLM over 2 GPUs of the node; sharding in the node keeps the all-gathers off 1 GbE
    assert "rollout.tensor_model_parallel_size=2" in best.overrides and "HSDP" in best.layout
    assert "critic.fsdp.param_offload=true" in best.overrides  # the critic's savers are searched too
    crossing = [c for c in best.comm.plan.collectives if c.crosses_nodes]
    assert crossing and {c.kind for c in crossing} == {"fsdp_all_reduce"}  # only HSDP's all-reduce leaves a node
    # on 24 GB it cannot hold the shard-sized buffer that defers the all-reduce to the step's end: it pays K of them
    assert "actor.fsdp.defer_all_reduce=false" in best.overrides and all(c.calls > 1 for c in crossing)
    assert planned.step_time.total == pytest.approx(best.seconds)


def test_the_fastest_setup_that_fits_wins_and_redundant_savers_are_not_listed(planned):
    seconds = [candidate.seconds for candidate in planned.candidates]
    assert seconds == sorted(seconds) and len(planned.candidates) >= 2
    for candidate in planned.candidates:
        assert candidate.memory.fits(0.15)
        assert not any(optimizer in candidate.savers and parameters in candidate.savers
                       for optimizer, parameters in OFFLOADS)


def test_the_printed_overrides_rebuild_the_planned_layout(planned):
    """What a user pastes is what was planned: the config with the overrides has the same memory, phase by phase."""
    for candidate in planned.candidates:
        rebuilt = issue_job(*candidate.overrides)
        plan = plan_memory(rebuilt, QWEN_7B, gpu_spec("a10g").memory_bytes)
        assert plan.phases == candidate.memory.phases, candidate.overrides
        assert plan.roles == candidate.memory.roles


def test_a_critic_optimizer_offload_frees_its_state_outside_the_critic_update():
    device = gpu_spec("a100-80").memory_bytes
    kept = plan_memory(issue_job("trainer.nnodes=1", "trainer.n_gpus_per_node=8"), QWEN_7B, device)
    away = plan_memory(issue_job("trainer.nnodes=1", "trainer.n_gpus_per_node=8", "critic.fsdp.optimizer_offload=true"),
                       QWEN_7B, device)
    state = kept.roles["critic"].optimizer
    assert state > 0
    for phase in ("generate", "log_probs", "update_actor"):
        assert kept.phases[phase] - away.phases[phase] == state, phase
    assert kept.phases["update_critic"] == away.phases["update_critic"]


def test_keep_layout_searches_only_the_configured_tp_and_sharding():
    job = plan_job(issue_job("rollout.tensor_model_parallel_size=2"), gpu_spec("a10g"), shapes=QWEN_7B,
                   network=LINKS["1gbe"], keep_layout=True)
    assert job.candidates and all(candidate.layout == "rollout TP 2, full shard" for candidate in job.candidates)


def test_plan_prints_why_the_chosen_layout_wins(capsys):
    assert main(["plan", "--gpu", "a10g", "--network", "1gbe", "--no-check-paths", *JOB]) == 0
    out = capsys.readouterr().out
    assert "recommendation: fastest layout that fits: rollout TP 2, HSDP 2 x 2" in out
    assert "why:" in out and "runner-up" in out


def test_published_names_and_shape_flags_plan_a_model_not_at_hand(capsys):
    from hybridrl.planner.known_models import model_shape

    llama2 = model_shape("meta-llama/Llama-2-7b-chat-hf", "model.path")
    assert llama2 is not None and round(llama2.num_parameters() / 1e6) == 6738  # its published 6.74 B
    assert main(["plan", "--gpu", "a100-80", "--layers", "32", "--hidden", "4096", "--intermediate", "11008",
                 "--vocab", "32000"]) == 0
    out = capsys.readouterr().out
    assert "model shape from flags: 6.74 B parameters" in out and "kv-heads=32" in out
    assert main(["plan", "--layers", "32", "--hidden", "4096", "--params", "7b"]) == 0
    assert "the MLP width that makes 7b parameters" in capsys.readouterr().out
    assert main(["plan", "--hidden", "4096"]) == 2
    assert "needs at least --layers and --hidden" in capsys.readouterr().err


def test_plan_sizes_the_reward_model_job_and_refuses_other_trainers_in_one_line(capsys):
    rm_job = ["plan", "--config-name", "rm_trainer", "--gpu", "a100-80", "--network", "ib", "--no-check-paths",
              "model.path=qwen2.5-7b", "model.dtype=bfloat16", "data.synthetic_task=arithmetic",
              "trainer.n_gpus_per_node=8", "data.train_batch_size=128", "data.micro_batch_size_per_gpu=8"]
    assert main(rm_job) == 0
    out = capsys.readouterr().out
    assert "hybridrl plan (reward model): 8 x A100" in out and "128 pairs per optimizer step" in out
    assert "micro-batch 8 pairs x accumulation 2" in out  # as configured: global 128 = 8 x 2 x 8 GPUs
    assert "recommendation: fastest setup that fits" in out and "reduce_scatter" in out
    assert main(["plan", "--config-name", "sft_trainer", "--no-check-paths", "model.path=qwen2.5-7b",
                 "data.synthetic_task=arithmetic"]) == 2
    assert "is not planned yet" in capsys.readouterr().err


def test_reward_model_search_times_each_setup_and_its_overrides_rebuild_it():
    from hybridrl.planner.comm_plan import Topology
    from hybridrl.planner.rm_plan import overrides, plan_rm, search_rm, setup_of

    base = ["model.path=qwen2.5-7b", "model.dtype=bfloat16", "data.synthetic_task=arithmetic", "trainer.nnodes=2",
            "trainer.n_gpus_per_node=4", "fsdp.fsdp_size=4", "data.train_batch_size=128",
            "data.micro_batch_size_per_gpu=8"]
    config = load_config(base, config_name="rm_trainer", check_paths=False)
    gpu, topology = gpu_spec("a100-80"), Topology(2, 4, LINKS["nvlink3"], LINKS["ib"])
    candidates = search_rm(config, KNOWN_SHAPES["qwen2.5-7b"], gpu, topology)
    assert candidates and [c.seconds for c in candidates] == sorted(c.seconds for c in candidates)
    for candidate in candidates:
        rebuilt = load_config(base + overrides(setup_of(config), candidate.setup), config_name="rm_trainer",
                              check_paths=False)
        again = plan_rm(rebuilt, KNOWN_SHAPES["qwen2.5-7b"], gpu, topology, setup_of(rebuilt))
        assert again.peak_bytes == candidate.peak_bytes and again.seconds == pytest.approx(candidate.seconds)
        hsdp = candidate.setup.fsdp_size == 4  # HSDP 2 x 4: only the all-reduce crosses nodes
        assert {c.kind for c in candidate.collectives if c.crosses_nodes} == ({"fsdp_all_reduce"} if hsdp else
                                                                           {"all_gather", "reduce_scatter"})
    assert {candidate.setup.fsdp_size for candidate in candidates} == {4, -1}  # both shardings searched


def test_the_search_keeps_what_the_config_says_where_it_does_not_vary_it():
    # a critic sharded otherwise than the actor keeps its own layout; no HSDP, no all-reduce setting printed
    kept = plan_job(issue_job("critic.fsdp.fsdp_size=-1", "actor.fsdp.fsdp_size=2", "trainer.nnodes=1",
                              "trainer.n_gpus_per_node=4", "actor.fsdp.defer_all_reduce=false"),
                    gpu_spec("a100-80"), shapes=QWEN_7B, keep_layout=True)
    assert all(candidate.comm.layouts["critic"].shard_group == 4 for candidate in kept.candidates)
    assert all(candidate.comm.layouts["actor"].shard_group == 2 for candidate in kept.candidates)
    single = plan_job(issue_job("trainer.nnodes=1", "trainer.n_gpus_per_node=4", "actor.fsdp.defer_all_reduce=false"),
                      gpu_spec("a100-80"), shapes=QWEN_7B, keep_layout=True)
    assert not any("defer_all_reduce" in override for c in single.candidates for override in c.overrides)


def test_only_tensor_parallel_sizes_that_split_the_heads_are_searched():
    job = plan_job(issue_job("trainer.nnodes=1", "trainer.n_gpus_per_node=8"), gpu_spec("a100-80"), shapes=QWEN_7B)
    sizes = {candidate.config.rollout.tensor_model_parallel_size for candidate in job.candidates}
    assert 8 not in sizes and sizes <= {1, 2, 4}  # 28 heads over 4 KV heads: 8 does not divide them
