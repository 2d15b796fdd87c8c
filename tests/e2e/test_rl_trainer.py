"""Whole GRPO runs on a tiny model through Ray + FSDP2 on 2 CPU ranks: determinism and exact resume; the Prometheus
endpoint scraped during a run."""

from __future__ import annotations

import importlib.util
import json
import socket
import threading
import urllib.error
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from hybridrl.config import load_config
from hybridrl.trainers.rl_trainer import RLTrainer
from hybridrl.utils.memory import CUDA_MEMORY_KEYS
from hybridrl.utils.prometheus import prometheus_name, scrape
from hybridrl.utils.tiny_model import save_tiny_model
from hybridrl.utils.tracking import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.distributed]

DASHBOARD = Path(__file__).resolve().parents[2] / "monitoring" / "grafana_dashboard.json"
COMPARED = ("critic/score/mean", "actor/pg_loss", "actor/grad_norm", "actor/ppo_kl", "response_length/mean")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("e2e") / "model")


def run_config(model_dir, run_dir, steps, *extra):
    return load_config([
        f"model.path={model_dir}", "model.dtype=float32", f"trainer.default_local_dir={run_dir}",
        f"trainer.total_training_steps={steps}", "trainer.logger=[jsonl]", "trainer.val_before_train=false",
        "trainer.ray.num_cpus=4", "data.synthetic_task_kwargs={max_digits: 1, operators: '+', num_val: 8}",
        "data.train_batch_size=4", "rollout.n=2", "actor.ppo_mini_batch_size=2", "actor.ppo_micro_batch_size_per_gpu=2",
        "data.max_response_length=3", "actor.optim.lr=1e-3", "actor.use_kl_loss=true", *extra,
    ])


def final_weights(run_dir, step):
    target = run_dir / f"model_step{step}.pt"
    dcp_to_torch_save(str(run_dir / "checkpoints" / f"global_step_{step}" / "actor" / "dcp"), str(target))
    return torch.load(target, weights_only=True)["model"]


def test_fixed_seed_run_is_deterministic_and_resume_is_exact(model_dir, tmp_path):
    """The fewest steps that show both: step 1 twice from the seed (determinism), then steps 2 and 3 once straight and
    once resumed from step 1's checkpoint (a resumed run carries on, with the optimizer's, loader's and sampler's
    state, for more than one step)."""
    straight = tmp_path / "straight"
    RLTrainer(run_config(model_dir, straight, 3)).fit()
    interrupted = tmp_path / "interrupted"
    RLTrainer(run_config(model_dir, interrupted, 1)).fit()  # stops after 1 step, checkpoint at step 1
    resumed = RLTrainer(run_config(model_dir, interrupted, 3, "trainer.resume_mode=auto")).fit()
    assert resumed.global_step == 3

    full_rows, resumed_rows = read_metrics(straight), read_metrics(interrupted)
    assert [row["step"] for row in resumed_rows] == [1, 2, 3]
    for full, again in zip(full_rows, resumed_rows):
        for key in COMPARED:
            assert full[key] == again[key], (full["step"], key)  # bit for bit on CPU
    straight_weights, resumed_weights = final_weights(straight, 3), final_weights(interrupted, 3)
    assert straight_weights.keys() == resumed_weights.keys()
    for name in straight_weights:
        assert torch.equal(straight_weights[name], resumed_weights[name]), name
    assert not torch.equal(straight_weights["lm_head.weight"], final_weights(interrupted, 1)["lm_head.weight"])


@pytest.mark.long
def test_resume_rejects_a_checkpoint_of_another_model(model_dir, tmp_path):
    run_dir = tmp_path / "run"
    RLTrainer(run_config(model_dir, run_dir, 1)).fit()
    other = save_tiny_model(tmp_path / "other", seed=1)
    with pytest.raises(ValueError, match="was trained from model.path"):
        RLTrainer(run_config(other, run_dir, 2, "trainer.resume_mode=auto")).fit()


@pytest.mark.parametrize("variant", [
    pytest.param(["algorithm=remax", "rollout.n=1", "data.train_batch_size=4", "actor.ppo_mini_batch_size=2",
                  "actor.ppo_micro_batch_size_per_gpu=1"], marks=pytest.mark.long),  # 32 s in the parallel suite
    ["algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=20",
     "algorithm.filter_groups.metric=seq_reward", "data.gen_batch_size=8",  # DAPO's larger generation batch
     "algorithm.overlong_buffer.enable=true", "algorithm.overlong_buffer.len=2", "actor.clip_ratio_high=0.28",
     "actor.log_grad_noise_scale=true", "actor.ppo_micro_batch_size_per_gpu=1"],
    ["algorithm=gae", "trainer.critic_warmup=1", "critic.ppo_mini_batch_size=2", "critic.ppo_micro_batch_size_per_gpu=1",
     "critic.fsdp.optimizer_offload=true",  # a no-op on CPU workers: its exactness is tests/distributed/test_optimizer_offload.py
     "critic.fsdp.grad_sync=micro_batch", "actor.fsdp.grad_sync=micro_batch",  # workers sync every micro-batch
     "actor.fsdp.fsdp_size=1", "critic.fsdp.fsdp_size=1"],  # HSDP: replicated over the 2 ranks, sharded over 1
    pytest.param(["actor.optim.state_precision=8bit"],  # torchao AdamW8bit on FSDP2 shards
                 marks=[pytest.mark.long,
                        pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="needs torchao")]),
    # exactly on-policy (one mini-batch per step): the old-log-prob forward is skipped (actor.old_log_prob=auto);
    # and parameters gathered per micro-batch (every other run here uses gather_once=auto, on for CPU)
    pytest.param(["actor.ppo_mini_batch_size=4", "actor.use_kl_loss=false", "actor.fsdp.gather_once=false"],
                 marks=pytest.mark.long),
], ids=["remax", "dapo", "ppo_gae", "adamw_8bit", "on_policy"])  # make test keeps dapo and ppo_gae; CI runs all
def test_algorithm_variants_run_end_to_end(model_dir, tmp_path, variant):
    result = RLTrainer(run_config(model_dir, tmp_path / "run", 2, "trainer.save_at_end=false", *variant)).fit()
    assert result.global_step == 2
    rows = read_metrics(tmp_path / "run")
    assert all(row["actor/skipped_step"] == 0 for row in rows if "actor/skipped_step" in row)
    if "algorithm=gae" in variant:
        assert "critic/vf_loss" in rows[0] and "actor/pg_loss" not in rows[0]  # warm-up: critic only
        assert "actor/pg_loss" in rows[1]
    on_policy = "actor.ppo_mini_batch_size=4" in variant
    assert all(("timing_worker/compute_log_prob" in row) is not on_policy for row in rows)
    if on_policy:  # π_old = π_θ: the ratio is exactly 1
        assert all(row["actor/ppo_kl"] == 0 and row["actor/pg_clipfrac"] == 0 for row in rows)
    if "algorithm.filter_groups.enable=true" in variant:
        assert all(row["dapo/num_gen_batches"] >= 1 for row in rows)
        assert all("actor/grad_noise/b_simple" in row for row in rows)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.long  # a whole run scraped while it trains: 55 s inside the parallel suite (2026-12-02)
def test_prometheus_endpoint_during_a_run_matches_the_dashboard(model_dir, tmp_path):
    port = free_port()
    config = run_config(model_dir, tmp_path / "run", 2, "trainer.save_at_end=false", "trainer.logger=[jsonl,prometheus]",
                        f"trainer.monitoring.prometheus_port={port}", "trainer.monitoring.price_per_gpu_hour=1.5",
                        "algorithm=gae", "critic.ppo_mini_batch_size=2", "critic.ppo_micro_batch_size_per_gpu=2")
    scrapes: list[dict[str, float]] = []
    done = threading.Event()

    def scraper() -> None:
        while not done.is_set():
            try:
                scrapes.append(scrape(f"http://127.0.0.1:{port}/metrics"))
            except (urllib.error.URLError, ConnectionError):
                pass  # not serving yet (workers starting) or already closed
            done.wait(0.2)

    thread = threading.Thread(target=scraper, daemon=True)
    thread.start()
    try:
        result = RLTrainer(config).fit()
    finally:
        done.set()
        thread.join()
    assert result.global_step == 2
    steps = sorted({int(sample["hybridrl_step"]) for sample in scrapes if "hybridrl_step" in sample})
    assert steps and steps[-1] >= 1  # served while the run is live (the endpoint closes with the run)
    exported = set().union(*scrapes)
    for name in ("hybridrl_actor_grad_norm", "hybridrl_critic_score_mean", "hybridrl_actor_ppo_kl",
                 "hybridrl_timing_update_actor", "hybridrl_actor_memory_host_rss_gib", "hybridrl_time_eta_s",
                 "hybridrl_cost_projected", "hybridrl_actor_comm_grad_reduce_s", "hybridrl_critic_comm_grad_reduce_s"):
        assert name in exported, name
    for row in read_metrics(tmp_path / "run"):  # 2 ranks: FSDP2 reduce-scatters gradients inside every update
        for role in ("actor", "critic"):
            assert 0 < row[f"{role}/comm/grad_reduce_s"] < row[f"timing/update_{role}"], (role, row["step"])
            assert 0 < row[f"{role}/comm/param_gather_s"] < row[f"timing/update_{role}"], (role, row["step"])
    gpu_only = {prometheus_name(f"actor/{key}") for key, _ in CUDA_MEMORY_KEYS}
    plotted = {target["expr"].split("{")[0] for panel in json.loads(DASHBOARD.read_text())["panels"]
               for target in panel["targets"]}
    assert plotted - gpu_only <= exported, sorted(plotted - gpu_only - exported)


def test_a_teacher_with_the_students_weights_has_no_kl_until_the_student_moves(model_dir, tmp_path):
    """On-policy distillation end to end (``algorithm.distillation``): the teacher's log-probs of the student's own
    samples reach the advantages. A teacher holding the student's starting weights scores step 1's samples exactly
    as the student does (reverse KL 0, to the last bit); after an update the student has moved and the KL is not 0.
    Exactly on-policy (one mini-batch), the old-log-prob forward stays on: the KL needs it."""
    result = RLTrainer(run_config(model_dir, tmp_path / "run", 2, "trainer.save_at_end=false",
                                  "actor.ppo_mini_batch_size=4", "actor.use_kl_loss=false",
                                  f"algorithm.distillation.teacher_path={model_dir}",
                                  "algorithm.distillation.task_weight=0")).fit()
    assert result.global_step == 2
    first, second = read_metrics(tmp_path / "run")
    assert first["distill/reverse_kl_per_token"] == 0.0 and second["distill/reverse_kl_per_token"] != 0.0
    assert all("timing_worker/compute_log_prob" in row for row in (first, second))
    assert first["distill/teacher_log_prob"] < 0
