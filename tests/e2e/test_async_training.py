"""The ``async_training`` contract on whole runs (tiny model, 1 FSDP trainer rank + a standalone vLLM CPU pool):

- ``bounded`` with η = 0 is the synchronous run, bit for bit;
- no row trains at a staleness above η — under random generation delays, the staleness of every step is exactly
  what the admission rule gives, whatever the timing;
- resume is exact: batches queued at a checkpoint are saved with it and a resumed run equals the uninterrupted one
  (with other delays, too);
- a replica killed mid-run loses and duplicates no sample: every drawn prompt trains once, with its ``rollout.n``
  rows, and the run goes on with the survivor.
"""

from __future__ import annotations

import logging

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from hybridrl.config import load_config
from hybridrl.trainers.rl_trainer import RLTrainer
from hybridrl.utils.tiny_model import save_tiny_model
from hybridrl.utils.tracking import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.distributed, pytest.mark.long]

COMPARED = ("critic/score/mean", "actor/pg_loss", "actor/grad_norm", "actor/ppo_kl", "response_length/mean",
            "rollout/log_prob_diff_max")
SPLIT = ("rollout=vllm_cpu", "trainer.n_gpus_per_node=1", "rollout.n_gpus=1")
N = 2  # rollout.n


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("async") / "model")


def run(model_dir, run_dir, steps, *extra) -> RLTrainer:
    trainer = RLTrainer(load_config([
        f"model.path={model_dir}", "model.dtype=float32", f"trainer.default_local_dir={run_dir}",
        f"trainer.total_training_steps={steps}", "trainer.logger=[jsonl]", "trainer.val_before_train=false",
        "trainer.test_freq=-1", "trainer.ray.num_cpus=4",
        "data.synthetic_task_kwargs={max_digits: 1, operators: '+', num_val: 4}", "data.train_batch_size=4",
        f"rollout.n={N}", "actor.ppo_mini_batch_size=2", "actor.ppo_micro_batch_size_per_gpu=2",
        "data.max_response_length=3", "actor.optim.lr=1e-2", "actor.use_kl_loss=true", *SPLIT, *extra]))
    trainer.fit()
    return trainer


def final_weights(run_dir, step):
    target = run_dir / f"model_step{step}.pt"
    dcp_to_torch_save(str(run_dir / "checkpoints" / f"global_step_{step}" / "actor" / "dcp"), str(target))
    return torch.load(target, weights_only=True)["model"]


def assert_same_runs(left, right, steps):
    left_rows, right_rows = read_metrics(left), read_metrics(right)
    assert [row["step"] for row in right_rows] == list(range(1, steps + 1))
    for one, other in zip(left_rows, right_rows):
        for key in COMPARED:
            assert one[key] == other[key], (one["step"], key)
    left_weights, right_weights = final_weights(left, steps), final_weights(right, steps)
    for name in left_weights:
        assert torch.equal(left_weights[name], right_weights[name]), name


def trained_each_prompt_once(sample_log) -> None:
    """Every step's rows are its drawn prompts' ``N`` responses each, in order; no prompt is drawn twice."""
    drawn = []
    for step, prompt_uids, row_uids, _ in sample_log:
        assert row_uids == [uid for uid in prompt_uids for _ in range(N)], step
        drawn += prompt_uids
    assert len(drawn) == len(set(drawn))


def test_bounded_with_zero_staleness_is_the_synchronous_run_bit_for_bit(model_dir, tmp_path):
    run(model_dir, tmp_path / "sync", 3)
    trainer = run(model_dir, tmp_path / "bounded0", 3, "async_training.mode=bounded", "async_training.max_staleness=0")
    assert_same_runs(tmp_path / "sync", tmp_path / "bounded0", 3)
    assert all(row["async/staleness_max"] == 0 for row in read_metrics(tmp_path / "bounded0"))
    trained_each_prompt_once(trainer.sample_log)


def test_staleness_bound_holds_under_random_delays_and_resume_is_exact(model_dir, tmp_path):
    """η = 2: step t trains rows of the weights of step max(t − 2, 0) — exactly, with generation delays drawn at
    random per call, and after a resume that took the two queued batches from the checkpoint."""
    bounded = ("async_training.mode=bounded", "async_training.max_staleness=2")
    straight = run(model_dir, tmp_path / "straight", 4, *bounded, "trainer.fault_injection.rollout_delay_s=0.4")
    for step, _, _, versions in straight.sample_log:
        assert versions == [max(step - 2, 0)] * len(versions), step
    rows = read_metrics(tmp_path / "straight")
    assert [row["async/staleness_max"] for row in rows] == [0, 1, 2, 2]
    assert all(row["async/staleness_max"] <= 2 for row in rows)
    trained_each_prompt_once(straight.sample_log)

    run(model_dir, tmp_path / "resumed", 2, *bounded)  # checkpoint at step 2, with steps 2 and 3 queued
    resumed = run(model_dir, tmp_path / "resumed", 4, *bounded, "trainer.resume_mode=auto",
                  "trainer.fault_injection.rollout_delay_s=0.2")
    assert [step for step, *_ in resumed.sample_log] == [2, 3]
    assert [entry[3] for entry in resumed.sample_log] == [entry[3] for entry in list(straight.sample_log)[2:]]
    assert_same_runs(tmp_path / "straight", tmp_path / "resumed", 4)


def test_a_killed_replica_loses_and_duplicates_no_sample(model_dir, tmp_path, caplog):
    """one_step_off on 2 replicas; replica 1 is SIGKILLed during step 2 and is sent a chunk of step 3's batch before
    its death is known (and may still be generating its chunk of step 2's). Each lost chunk is generated again by
    replica 0 — once — and every step trains each of its prompts' N rows."""
    with caplog.at_level(logging.WARNING, logger="hybridrl.trainers.generation"):
        trainer = run(model_dir, tmp_path / "killed", 4, "async_training.mode=one_step_off", "rollout.n_gpus=2",
                      "trainer.fault_injection.kill_worker_at_step=2",
                      "trainer.fault_injection.kill_worker_role=rollout1")
    assert caplog.text.count("its prompts are resubmitted to 'rollout0'") in (1, 2)  # step 2's chunk: timing
    rows = read_metrics(tmp_path / "killed")
    assert [step for step, *_ in trainer.sample_log] == [0, 1, 2, 3]
    trained_each_prompt_once(trainer.sample_log)
    assert all(row["async/staleness_max"] <= 1 for row in rows)
    assert rows[-1]["rollout/replicas_lost"] == 1.0
    assert all(len(row_uids) == 4 * N for _, _, row_uids, _ in trainer.sample_log)


def test_partial_rollout_takes_new_weights_mid_generation(model_dir, tmp_path):
    """one_step_off with partial rollout and slow engine steps: the trainer's new weights land while the next batch
    is being generated. Rows then span two versions (their staleness is their oldest token's, within the bound),
    token versions never go back along a row, and the tokens generated after the switch match the trainer's
    log-probs of the weights it trains — the parked requests resumed under the new weights, their prefix recomputed."""
    trainer = run(model_dir, tmp_path / "partial", 3, "async_training.mode=one_step_off",
                  "async_training.partial_rollout=true", "trainer.fault_injection.rollout_step_delay_s=0.6")
    rows = read_metrics(tmp_path / "partial")
    assert sum(row["async/partial_rows"] for row in rows) > 0  # weights landed inside a generation at least once
    assert all(row["async/staleness_max"] <= 1 for row in rows)
    current = [row for row in rows if "rollout/log_prob_diff_max_current" in row]
    assert current and all(row["rollout/log_prob_diff_max_current"] < 1e-4 for row in current)
    assert any(row["step"] > 1 for row in current)  # after an update, not only the initial weights
    trained_each_prompt_once(trainer.sample_log)
    for step, _, _, versions in trainer.sample_log:
        assert all(max(step - 1, 0) <= version <= step for version in versions), step


def test_a_step_without_an_actor_update_relabels_the_pool_weights(model_dir, tmp_path):
    """PPO with ``trainer.critic_warmup=1`` on the standalone pool, η = 0: step 0 updates only the critic, so the
    weights the pool holds become step 1's without a load (``Generation.advance``). The replica checks the version
    each generation names, so step 1's batch is generated only if the relabelling reached it; every row records the
    trainer's one ``policy_version``."""
    trainer = run(model_dir, tmp_path / "warmup", 3, "async_training.mode=bounded", "async_training.max_staleness=0",
                  "algorithm=gae", "trainer.critic_warmup=1", "critic.ppo_mini_batch_size=2",
                  "critic.ppo_micro_batch_size_per_gpu=2")
    assert [(step, set(versions)) for step, _, _, versions in trainer.sample_log] == [(0, {0}), (1, {1}), (2, {2})]
    rows = read_metrics(tmp_path / "warmup")
    assert "actor/pg_loss" not in rows[0] and "actor/pg_loss" in rows[1]  # the warm-up step left the actor as is
    # a step's weight_sync figures are those of the load queued a step before (async): step 0 queued a relabelling
    # and no load, so step 1 reports none; step 1's load is reported at step 2
    assert ["weight_sync/seconds" in row for row in rows] == [False, False, True]


def test_remax_in_async_takes_its_baseline_from_the_weights_that_sampled(model_dir, tmp_path):
    """ReMax in the async pipeline: each batch's greedy baseline is queued right behind it, so it is generated with
    the same weights (``RolloutQueue.take`` refuses a batch whose baseline's version differs); with η = 0 the run
    is the synchronous ReMax run bit for bit, and one_step_off keeps the staleness bound."""
    run(model_dir, tmp_path / "sync", 3, "algorithm=remax")
    run(model_dir, tmp_path / "bounded0", 3, "algorithm=remax", "async_training.mode=bounded",
        "async_training.max_staleness=0")
    assert_same_runs(tmp_path / "sync", tmp_path / "bounded0", 3)
    trainer = run(model_dir, tmp_path / "one_step_off", 3, "algorithm=remax", "async_training.mode=one_step_off")
    assert [set(versions) for _, _, _, versions in trainer.sample_log] == [{0}, {0}, {1}]
    trained_each_prompt_once(trainer.sample_log)


def test_prompt_replay_in_async_draws_when_a_batch_is_submitted(model_dir, tmp_path):
    """Prompt replay in the async pipeline: a batch's prompts are mixed with replayed ones when it is submitted, by
    the buffer the trained steps left; η = 0 is the synchronous replay run bit for bit (same draws, same uids), and
    one_step_off trains replayed prompts within the bound."""
    replay = ("data.replay.enable=true", "data.replay.fraction=0.5", "data.replay.capacity=6")
    run(model_dir, tmp_path / "sync", 3, *replay)
    trainer = run(model_dir, tmp_path / "bounded0", 3, *replay, "async_training.mode=bounded",
                  "async_training.max_staleness=0")
    assert_same_runs(tmp_path / "sync", tmp_path / "bounded0", 3)
    assert [row["replay/share"] for row in read_metrics(tmp_path / "sync")] == \
        [row["replay/share"] for row in read_metrics(tmp_path / "bounded0")]
    assert any(uid.startswith("replay-") for _, uids, _, _ in trainer.sample_log for uid in uids)
    one_step_off = run(model_dir, tmp_path / "one_step_off", 3, *replay, "async_training.mode=one_step_off")
    assert all(row["async/staleness_max"] <= 1 for row in read_metrics(tmp_path / "one_step_off"))
    assert any(uid.startswith("replay-") for _, uids, _, _ in one_step_off.sample_log for uid in uids)


def test_dynamic_sampling_in_async_refills_with_the_current_weights(model_dir, tmp_path):
    """Dynamic sampling in the async pipeline: a step keeps its queued batch's informative groups and generates more
    batches with the current weights until it has ``data.train_batch_size`` groups; η = 0 is the synchronous run bit
    for bit, and one_step_off keeps the bound (refilled rows have staleness 0)."""
    dapo = ("algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=20",
            "algorithm.filter_groups.metric=seq_reward", "data.gen_batch_size=8",
            "algorithm.overlong_buffer.enable=true", "algorithm.overlong_buffer.len=2")  # length spreads the rewards
    run(model_dir, tmp_path / "sync", 3, *dapo)
    run(model_dir, tmp_path / "bounded0", 3, *dapo, "async_training.mode=bounded", "async_training.max_staleness=0")
    assert_same_runs(tmp_path / "sync", tmp_path / "bounded0", 3)
    rows = read_metrics(tmp_path / "bounded0")
    assert any(row["dapo/num_gen_batches"] > 1 for row in rows)  # refills ran (measured: 11, 12, 3 batches)
    assert [row["dapo/num_gen_batches"] for row in rows] == \
        [row["dapo/num_gen_batches"] for row in read_metrics(tmp_path / "sync")]
    # four samples a prompt: after an update at lr 1e-2 the tiny model's lengths spread less (N = 2 found 3 of 4
    # informative groups in 20 generation batches)
    run(model_dir, tmp_path / "one_step_off", 3, *dapo, "rollout.n=4", "async_training.mode=one_step_off")
    rows = read_metrics(tmp_path / "one_step_off")
    assert all(row["async/staleness_max"] <= 1 for row in rows)
    assert all(row["dapo/num_gen_batches"] >= 1 for row in rows)


# An environment whose every step is a side effect: one line per call, with the process that made it and the split
# of its prompt.
COUNTING_ENVIRONMENT = '''
import os
from hybridrl.agents.environment import ENVIRONMENTS, Environment, StepResult

@ENVIRONMENTS.register("counting")
class CountingEnvironment(Environment):
    def __init__(self, tools, reward, max_tool_calls=4):
        self.turns = 0

    def reset(self, row):
        self.split = row["extra_info"]["split"]
        return super().reset(row)

    def step(self, model_text):
        with open({log!r}, "a") as log:
            log.write(f"{{os.getpid()}} {{self.split}}\\n")
        self.turns += 1
        return StepResult(observations=[{{"role": "user", "content": "go on"}}], done=self.turns >= 3)
'''


@pytest.fixture(scope="module")
def agent_setup(tmp_path_factory):
    """A tiny model whose digits also end a turn (its generation config), so that random episodes take several
    short turns, and the counting environment as a plugin file."""
    from transformers import AutoTokenizer, GenerationConfig

    root = tmp_path_factory.mktemp("async_agent")
    model = save_tiny_model(root / "model")
    tokenizer, generation = AutoTokenizer.from_pretrained(model), GenerationConfig.from_pretrained(model)
    generation.eos_token_id = [tokenizer.eos_token_id, *tokenizer.convert_tokens_to_ids(list("0123456789"))]
    generation.save_pretrained(model)
    log = root / "calls.log"
    (root / "counting.py").write_text(COUNTING_ENVIRONMENT.format(log=str(log)))
    return model, root / "counting.py", log


def environment_calls(log) -> tuple[int, set]:
    """The logged environment steps of training episodes (the run's last validation has its own prompts, and η = 0
    generates no batch ahead), and the processes that ran them."""
    lines = [line.split() for line in log.read_text().splitlines()]
    return sum(split == "train" for _, split in lines), {pid for pid, _ in lines}


def test_multi_turn_on_a_tensor_pool_in_async_runs_each_environment_step_once(agent_setup, tmp_path):
    """Multi-turn episodes on a standalone pool of one t_g = 2 replica: η = 0 is the synchronous run bit for bit, each
    environment step runs once — in one process, the replica's leader — and one_step_off keeps the bound. The
    response budget is wide enough that no turn is cut by it: every model turn is then answered by one step."""
    model, plugin, log = agent_setup
    agent = ("rollout.n_gpus=2", "rollout.tensor_model_parallel_size=2", "rollout.multi_turn.enable=true",
             "rollout.multi_turn.environment=counting", "rollout.multi_turn.tools=[]",
             "rollout.multi_turn.max_assistant_turns=3", "data.max_response_length=192", f"trainer.plugins=[{plugin}]")
    for name, mode in (("sync", ()), ("bounded0", ("async_training.mode=bounded", "async_training.max_staleness=0"))):
        log.write_text("")
        trainer = run(model, tmp_path / name, 3, *agent, *mode)
        rows = read_metrics(tmp_path / name)
        assert all(row["agent/cut_by_budget"] == 0 and row["agent/env_failures"] == 0 for row in rows), name
        turns = round(sum(row["agent/turns"] * 4 * N for row in rows))  # 4 prompts × N responses a step
        calls, processes = environment_calls(log)
        assert calls == turns > 3 * 4 * N, f"{name}: {calls} environment steps ran for {turns} model turns"
        assert len(processes) == 1, f"{name}: environment steps ran in {len(processes)} processes"
        trained_each_prompt_once(trainer.sample_log)
    assert_same_runs(tmp_path / "sync", tmp_path / "bounded0", 3)
    trainer = run(model, tmp_path / "one_step_off", 3, *agent, "async_training.mode=one_step_off")
    assert all(row["async/staleness_max"] <= 1 for row in read_metrics(tmp_path / "one_step_off"))
    trained_each_prompt_once(trainer.sample_log)
