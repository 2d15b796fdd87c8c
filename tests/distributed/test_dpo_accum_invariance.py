"""The invariance test for the preference-optimisation losses (``hybridrl dpo``): one optimizer step's gradient is the
same for every way of cutting the pair batch.

DP ∈ {1, 2} (real FSDP2 over gloo) × micro-batch ∈ {1, 2, whole} pairs × {padded, packed} × DPO with label smoothing
(cDPO), IPO, SimPO, ORPO (its likelihood term a mean over the batch's chosen tokens) and KTO (labelled rows, the step's
reference point z₀ given, unequal label weights) — each compared with a plain single-process PyTorch reference written out below that scores
every sequence on its own, unpadded, and sums its response tokens' log-probs by hand (relative error ≤ 1e-5).
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from gloo_spawn import run_on_gloo
from test_rm_accum_invariance import PAIRS, PROMPT, make_pairs, relative_error

from hybridrl.config.dpo_schema import DPOLossConfig
from hybridrl.config.schema import ModelConfig, OptimConfig
from hybridrl.data.preference import PairFields
from hybridrl.engines.base import TrainingEngine
from hybridrl.engines.micro_batches import DataParallelGroup, MicroBatching
from hybridrl.engines.optim import build_optimizer, build_scheduler
from hybridrl.engines.preference_losses import PreferenceOptimizationLoss
from hybridrl.modeling.fsdp import ShardingOptions, shard_model
from hybridrl.modeling.model_builder import build_model
from hybridrl.protocol import Batch
from hybridrl.utils.tiny_model import save_tiny_model

pytestmark = pytest.mark.distributed

RESPONSE = 6
MICRO = ("1", "2", "whole")
LOSSES = {"dpo": DPOLossConfig(type="dpo", beta=0.5, label_smoothing=0.2), "ipo": DPOLossConfig(type="ipo", beta=0.5),
          "simpo": DPOLossConfig(type="simpo", beta=2.0, simpo_gamma=0.3), "orpo": DPOLossConfig(type="orpo", beta=0.7),
          "kto": DPOLossConfig(type="kto", beta=0.8, desirable_weight=1.3, undesirable_weight=0.7)}
STEP_KL = 0.25
OPTIM = OptimConfig(lr=1e-3, weight_decay=0.0, eps=1e-4)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    data = make_pairs(seed=1)
    generator = torch.Generator().manual_seed(2)
    data[PairFields.REFERENCE_CHOSEN_LOG_PROBS] = -10 * torch.rand(PAIRS, generator=generator)
    data[PairFields.REFERENCE_REJECTED_LOG_PROBS] = -10 * torch.rand(PAIRS, generator=generator)
    chosen_tokens = data[PairFields.CHOSEN_ATTENTION_MASK][:, PROMPT:].sum()
    data[PairFields.STEP_CHOSEN_TOKENS] = chosen_tokens.expand(PAIRS).clone()
    data[PairFields.DESIRABLE] = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0])
    data[PairFields.STEP_KL] = torch.full((PAIRS,), STEP_KL)
    data[PairFields.STEP_LABEL_COUNTS] = torch.tensor([[4.0, 4.0]]).expand(PAIRS, 2).clone()
    return save_tiny_model(tmp_path_factory.mktemp("dpo_accum") / "policy"), data


# ---------------------------------------------------------------- the plain single-process reference (no hybridrl)
def side_log_prob(model, data, side, row):
    """Σ log π(token) over the response of one side of one pair, the sequence scored on its own, unpadded."""
    mask = data[f"{side}_attention_mask"][row]
    ids = data[f"{side}_input_ids"][row][mask.bool()]
    prompt = int(mask[:PROMPT].sum())
    log_probs = F.log_softmax(model(input_ids=ids[None]).logits[0].float(), dim=-1)
    return sum(log_probs[position - 1, ids[position]] for position in range(prompt, len(ids))), len(ids) - prompt


def log_odds(mean_log_prob):
    return mean_log_prob - torch.log(1 - torch.exp(mean_log_prob))


def reference_loss(model, data, config: DPOLossConfig):
    total = 0.0
    chosen_tokens = int(data[PairFields.CHOSEN_ATTENTION_MASK][:, PROMPT:].sum())
    for row in range(PAIRS):
        if config.type == "kto":  # the completion side only; desirable rows pushed above z₀, the others below
            completion, _ = side_log_prob(model, data, "chosen", row)
            ratio = completion - data[PairFields.REFERENCE_CHOSEN_LOG_PROBS][row]
            if data[PairFields.DESIRABLE][row] > 0.5:
                total = total + config.desirable_weight * (1 - torch.sigmoid(config.beta * (ratio - STEP_KL)))
            else:
                total = total + config.undesirable_weight * (1 - torch.sigmoid(config.beta * (STEP_KL - ratio)))
            continue
        (chosen, chosen_length), (rejected, rejected_length) = (side_log_prob(model, data, side, row)
                                                                for side in ("chosen", "rejected"))
        if config.type == "orpo":  # the NLL is a mean over every chosen token of the batch, the odds term over pairs
            ratio = log_odds(chosen / chosen_length) - log_odds(rejected / rejected_length)
            total = total - chosen * PAIRS / chosen_tokens - config.beta * F.logsigmoid(ratio)
            continue
        if config.type == "simpo":
            logit = config.beta * (chosen / chosen_length - rejected / rejected_length) - config.simpo_gamma
            total = total - F.logsigmoid(logit)
            continue
        margin = ((chosen - data[PairFields.REFERENCE_CHOSEN_LOG_PROBS][row])
                  - (rejected - data[PairFields.REFERENCE_REJECTED_LOG_PROBS][row]))
        if config.type == "ipo":  # the log-ratios' per-token means
            mean_margin = ((chosen - data[PairFields.REFERENCE_CHOSEN_LOG_PROBS][row]) / chosen_length
                           - (rejected - data[PairFields.REFERENCE_REJECTED_LOG_PROBS][row]) / rejected_length)
            total = total + (mean_margin - 1 / (2 * config.beta)) ** 2
        else:
            smoothing = config.label_smoothing
            total = total - (1 - smoothing) * F.logsigmoid(config.beta * margin) \
                - smoothing * F.logsigmoid(-config.beta * margin)
    return total / PAIRS


def reference_gradients(model_dir, data, config):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    loss = reference_loss(model, data, config)
    loss.backward()
    return float(loss.detach()), {name: param.grad.clone() for name, param in model.named_parameters()}


# ---------------------------------------------------------------- hybridrl on N gloo ranks
def run_cases(rank, world, model_dir, data, cases, out_path):
    from torch.distributed.device_mesh import init_device_mesh

    local = slice(rank * PAIRS // world, (rank + 1) * PAIRS // world)
    batch = Batch(tensors={name: tensor[local] for name, tensor in data.items()})
    results = {}
    for loss_name, micro, packed in cases:
        model = build_model(ModelConfig(path=str(model_dir), dtype="float32"), "actor")
        shard_model(model, init_device_mesh("cpu", (world,)), ShardingOptions())
        optimizer = build_optimizer(model, OPTIM)
        micro_batching = MicroBatching(micro_batch_size=len(batch) if micro == "whole" else int(micro))
        engine = TrainingEngine(model, dp=DataParallelGroup(rank=rank, size=world), micro_batching=micro_batching,
                                optimizer=optimizer, scheduler=build_scheduler(optimizer, OPTIM, 10))
        loss = PreferenceOptimizationLoss(RESPONSE, LOSSES[loss_name], packed=packed)
        metrics = engine.accumulate_gradients(batch, loss)
        results[(loss_name, micro, packed)] = ({name: param.grad.full_tensor()
                                                for name, param in model.named_parameters()}, metrics)
    if rank == 0:
        torch.save(results, out_path)


CASES = list(itertools.product(LOSSES, MICRO, (False, True)))


@pytest.fixture(scope="module", params=[1, 2], ids=["dp1", "dp2"])
def engine_results(request, setup, tmp_path_factory):
    model_dir, data = setup
    out_path = tmp_path_factory.mktemp(f"dpo_dp{request.param}") / "results.pt"
    run_on_gloo(request.param, run_cases, model_dir, data, CASES, out_path)
    return torch.load(out_path)


@pytest.mark.parametrize("loss_name", list(LOSSES))
def test_gradient_and_loss_equal_the_single_batch_reference(engine_results, setup, loss_name):
    model_dir, data = setup
    value, reference = reference_gradients(model_dir, data, LOSSES[loss_name])
    assert sum(float(g.abs().sum()) for g in reference.values()) > 0 and math.isfinite(value)
    errors = {}
    for micro, packed in itertools.product(MICRO, (False, True)):
        gradients, metrics = engine_results[(loss_name, micro, packed)]
        errors[(micro, packed)] = relative_error(gradients, reference)
        assert metrics["loss"] == pytest.approx(value, rel=1e-5), (micro, packed)
        if loss_name == "kto":  # its per-label mean rewards are shares too: the same whatever the split
            first = engine_results[(loss_name, "whole", False)][1]
            for name in ("desirable_reward", "undesirable_reward", "reward_gap", "reference_point"):
                assert metrics[name] == pytest.approx(first[name], rel=1e-5, abs=1e-7), (name, micro, packed)
    assert max(errors.values()) <= 1e-5, errors
