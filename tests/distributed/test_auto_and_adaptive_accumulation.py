"""``ppo_micro_batch_size_per_gpu: auto`` and adaptive accumulation on 2 gloo ranks (real FSDP2, tiny model, fp32).

- **auto**: the micro-batch the sizing picks for a budget fits it when measured (CPU live-tensor peak after a real
  optimizer step, Adam moments included), the next size up does not fit the usable part, and training with it gives
  the same update as the explicit micro-batch — and as the plain single-batch reference of the invariance tests.
- **adaptive**: with the accumulation steps raised (2 → 4) or lowered (2 → 1) by the control, one update equals the
  reference optimizer steps over mini-batches of ``micro × K × world`` sequences, at the learning rate × √(K/2).
"""

from __future__ import annotations

import math

import pytest
import torch
from gloo_spawn import run_on_gloo
from test_grad_accum_invariance import (
    ACTOR_SETTINGS,
    BATCH,
    HORIZON,
    OPTIM,
    engine_for,
    make_data,
    reference_actor_loss,
    reference_log_probs,
    relative_error,
)
from transformers import AutoModelForCausalLM

from hybridrl.config.schema import (
    ActorConfig,
    AdaptiveAccumulationConfig,
    DataConfig,
    MicroBatchSizingConfig,
    ModelConfig,
    RolloutConfig,
    TrainConfig,
    TrainerConfig,
)
from hybridrl.config.sizes import role_plan
from hybridrl.protocol import Batch
from hybridrl.utils.tiny_model import save_tiny_model
from hybridrl.engines.losses import PolicyLoss, SequenceForward
from hybridrl.engines.micro_batches import MicroBatching
from hybridrl.autotune.adaptive_accumulation import AccumulationControl
from hybridrl.autotune.auto_micro_batch import resolve_plan
from hybridrl.autotune.grad_noise import NoiseScaleEstimate, NoiseScaleMonitor
from hybridrl.autotune.memory_sizing import DecoderShape, Precision, estimate_micro_batch_bytes, probe_peak_bytes

pytestmark = pytest.mark.distributed

WORLD, HEADROOM = 2, 0.15
SIZED_PROMPT, SIZED_RESPONSE = 256, 256  # the longest *expected* sequence the sizing plans for; the data is shorter
LOSS = PolicyLoss(forward=SequenceForward(), temperature=1.0, loss_scale_factor=HORIZON,
                  actor=ActorConfig(loss_agg_mode="token-mean", entropy_coeff=0.01, use_kl_loss=True, kl_loss_coef=0.1,
                                    kl_loss_type="low_var_kl", **ACTOR_SETTINGS))


def sizing_config(model_dir, budget_mb: int, micro: int | str = "auto") -> TrainConfig:
    """8 prompts × n=1, one mini-batch of 8 over 2 ranks: 4 sequences per rank."""
    return TrainConfig(model=ModelConfig(path=str(model_dir), dtype="float32"),
                       actor=ActorConfig(ppo_mini_batch_size=BATCH, ppo_micro_batch_size_per_gpu=micro,
                                         micro_batch_sizing=MicroBatchSizingConfig(memory_budget_mb=budget_mb,
                                                                                   headroom=HEADROOM)),
                       rollout=RolloutConfig(n=1),
                       data=DataConfig(train_batch_size=BATCH, max_prompt_length=SIZED_PROMPT,
                                       max_response_length=SIZED_RESPONSE),
                       trainer=TrainerConfig(device="cpu", n_gpus_per_node=WORLD))


def analytic_bytes(model_dir, micro_batch_size: int) -> float:
    config = AutoModelForCausalLM.from_pretrained(model_dir).config
    return estimate_micro_batch_bytes(DecoderShape.from_hf_config(config), micro_batch_size,
                                      SIZED_PROMPT + SIZED_RESPONSE, world_size=WORLD, precision=Precision()).total


def parameters(engine) -> dict[str, torch.Tensor]:
    return {name: param.detach().full_tensor() for name, param in engine.model.named_parameters()}


def run_auto(rank, world, model_dir, batch, budget_mb) -> dict:
    config = sizing_config(model_dir, budget_mb)
    engine = engine_for("actor", model_dir, rank, world, micro_batching=None)
    plan, sized = resolve_plan(config, "actor", engine.model, role_plan(config, "actor"), dp=engine.dp,
                               device=torch.device("cpu"), optimizer=engine.optimizer)
    engine.micro_batching = MicroBatching(micro_batch_size=plan.micro_batch_size_per_gpu)
    engine.train_epochs(batch, LOSS, mini_batch_size=plan.local_mini_batch_sequences)
    explicit_plan = role_plan(sizing_config(model_dir, budget_mb, micro=2), "actor")
    explicit = engine_for("actor", model_dir, rank, world,
                          micro_batching=MicroBatching(micro_batch_size=explicit_plan.micro_batch_size_per_gpu))
    explicit.train_epochs(batch, LOSS, mini_batch_size=explicit_plan.local_mini_batch_sequences)
    seq_len = SIZED_PROMPT + SIZED_RESPONSE
    measured = {size: probe_peak_bytes(engine.model, size, seq_len, dp=engine.dp, optimizer=engine.optimizer)
                for size in (plan.micro_batch_size_per_gpu, 2 * plan.micro_batch_size_per_gpu)}
    return dict(micro=plan.micro_batch_size_per_gpu, steps=plan.grad_accum_steps, line=sized.line(),
                usable=sized.decision.usable_bytes, predicted=sized.decision.predicted_bytes, measured=measured,
                auto=parameters(engine), explicit=parameters(explicit))


def run_adaptive(rank, world, model_dir, batch, new_steps) -> dict:
    engine = engine_for("actor", model_dir, rank, world,  # AdamW lr 1e-3, constant schedule
                        micro_batching=MicroBatching(micro_batch_size=1))
    monitor = NoiseScaleMonitor(engine.model, engine.dp)
    engine.hooks.append(monitor)
    control = AccumulationControl.from_config(
        AdaptiveAccumulationConfig(enable=True, min_steps=1, max_steps=4, lr_scaling="sqrt", min_updates=0),
        engine.optimizer, engine.scheduler, micro_batch_size=1, reference_steps=2, world_size=world,
        local_step_sequences=len(batch), monitor=monitor)
    control.attach(engine)
    # A constructed noise scale far above (or below) the current mini-batch of 2 steps × 5 tokens
    b_simple = 1e6 if new_steps > 2 else 1e-3
    control.update(10.0, NoiseScaleEstimate(1.0, b_simple, b_simple, 1.0, b_simple, num_updates=1))
    assert control.steps == new_steps
    # as the actor worker runs it: the control's micro × K is the mini-batch
    metrics = engine.train_epochs(batch, LOSS, mini_batch_size=control.local_mini_batch_size)
    return dict(metrics=metrics, schedule_steps=engine.scheduler.last_epoch, params=parameters(engine))


def run_on_rank(rank, world, model_dir, data, budget_mb, out_path):
    local = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    batch = Batch(tensors={name: tensor[local] for name, tensor in data.items()})
    results = dict(auto=run_auto(rank, world, model_dir, batch, budget_mb),
                   raised=run_adaptive(rank, world, model_dir, batch, new_steps=4),
                   lowered=run_adaptive(rank, world, model_dir, batch, new_steps=1))
    if rank == 0:
        torch.save(results, out_path)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("auto_adaptive") / "actor")


@pytest.fixture(scope="module")
def data(model_dir):
    data = make_data()
    with torch.no_grad():
        current = reference_log_probs(AutoModelForCausalLM.from_pretrained(model_dir), data)
    data["old_log_probs"] = (current + data.pop("log_prob_noise")) * data["response_mask"]
    data["ref_log_probs"] = (current + data.pop("ref_noise")) * data["response_mask"]
    return data


@pytest.fixture(scope="module")
def budget_mb(model_dir):
    """A whole-MiB budget whose usable part holds 2 sequences of 512 tokens per rank but not 4."""
    fits, too_big = analytic_bytes(model_dir, 2), analytic_bytes(model_dir, 4)
    budget = math.ceil((fits + too_big) / 2 / (1 - HEADROOM) / 2**20)
    assert fits <= (1 - HEADROOM) * budget * 2**20 < too_big
    return budget


@pytest.fixture(scope="module")
def results(model_dir, data, budget_mb, tmp_path_factory):
    out_path = tmp_path_factory.mktemp("results") / "results.pt"
    run_on_gloo(WORLD, run_on_rank, model_dir, data, budget_mb, out_path)
    return torch.load(out_path)


def reference_update(model_dir, data, row_groups, lr) -> tuple[dict, dict]:
    """``(parameters before, after)`` of plain AdamW steps, one per group of rows, each over that group alone."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    before = {name: param.detach().clone() for name, param in model.named_parameters()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=OPTIM.weight_decay, eps=OPTIM.eps)
    for rows in row_groups:
        optimizer.zero_grad()
        reference_actor_loss(model, {name: tensor[rows] for name, tensor in data.items()}, "token-mean").backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    return before, {name: param.detach() for name, param in model.named_parameters()}


def update_error(engine_params, before, after) -> float:
    return relative_error({name: engine_params[name] - before[name] for name in before},
                          {name: after[name] - before[name] for name in before})


def test_auto_fits_the_budget_and_trains_like_the_explicit_micro_batch(results, model_dir, data, budget_mb):
    auto = results["auto"]
    assert (auto["micro"], auto["steps"]) == (2, 2)  # 2 × 2 × 2 ranks = 8 sequences
    assert auto["predicted"] <= auto["usable"] == pytest.approx((1 - HEADROOM) * budget_mb * 2**20)
    assert "micro_batch_size=2, grad_accum_steps=2" in auto["line"] and "(configured)" in auto["line"]
    measured = auto["measured"]
    assert measured[2] <= budget_mb * 2**20, measured  # a real forward/backward at 512 tokens fits the budget
    assert measured[4] > auto["usable"], measured  # and the next size up would not have fitted
    for name, tensor in auto["auto"].items():
        assert torch.equal(tensor, auto["explicit"][name]), name
    before, after = reference_update(model_dir, data, [list(range(BATCH))], lr=OPTIM.lr)
    assert update_error(auto["auto"], before, after) <= 1e-5


@pytest.mark.parametrize("case,steps,row_groups", [
    ("raised", 4, [list(range(BATCH))]),  # 1 × 4 × 2 ranks: one step over all 8 rows
    ("lowered", 1, [[0, 4], [1, 5], [2, 6], [3, 7]]),  # 1 × 1 × 2 ranks: each rank's next row, four steps
], ids=["2->4", "2->1"])
def test_update_with_changed_steps_equals_the_reference(results, model_dir, data, case, steps, row_groups):
    result = results[case]
    multiplier = math.sqrt(steps / 2)
    metrics = result["metrics"]
    assert metrics["accumulation/grad_accum_steps"] == steps
    assert metrics["accumulation/effective_batch_sequences"] == steps * WORLD
    assert metrics["accumulation/lr_multiplier"] == pytest.approx(multiplier)
    assert metrics["lr"] == pytest.approx(OPTIM.lr * multiplier)
    assert result["schedule_steps"] == len(row_groups) * steps / 2  # the schedule advanced by samples: 2 either way
    before, after = reference_update(model_dir, data, row_groups, lr=OPTIM.lr * multiplier)
    assert update_error(result["params"], before, after) <= 1e-5
