"""The invariance test for the Bradley–Terry loss: one optimizer step's gradient (and update) is the same for every
way of cutting the pair batch.

DP ∈ {1, 2} (real FSDP2 over gloo) × micro-batch ∈ {1, 2, whole} pairs × {padded, packed}, with per-pair margins and
the centring regulariser — each compared with a plain single-process PyTorch reference written out below that scores
every sequence on its own, unpadded (relative error ≤ 1e-5). The optimizer step also runs with
``fsdp.grad_sync=micro_batch`` (a reduce-scatter after every micro-batch, counted): same update.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from hybridrl.config.rm_schema import RMLossConfig
from hybridrl.config.schema import ModelConfig, OptimConfig
from hybridrl.data.preference import PairFields
from hybridrl.protocol import Batch
from hybridrl.utils.collectives import CollectiveCounter
from hybridrl.utils.tiny_model import TinyModelSpec, save_tiny_model
from hybridrl.engines.base import TrainingEngine
from hybridrl.engines.losses import BradleyTerryLoss
from hybridrl.engines.micro_batches import DataParallelGroup, MicroBatching
from hybridrl.modeling.fsdp import ShardingOptions, shard_model
from hybridrl.modeling.model_builder import build_model
from hybridrl.engines.optim import build_optimizer, build_scheduler
from gloo_spawn import run_on_gloo

pytestmark = pytest.mark.distributed

PAIRS, PROMPT, RESPONSE = 8, 5, 6
MICRO = ("1", "2", "whole")
MARGIN, CENTER_COEF = 0.1, 0.05
NUM_LAYERS = TinyModelSpec().num_layers  # the model save_tiny_model builds by default
OPTIM = OptimConfig(lr=1e-3, weight_decay=0.01, eps=1e-4)  # eps as in test_grad_accum_invariance: see the note there


def make_pairs(seed: int = 0) -> dict[str, torch.Tensor]:
    """Ragged pairs: a shared prompt of 1..5 tokens (left pad), chosen and rejected responses of 1..6 tokens."""
    generator = torch.Generator().manual_seed(seed)
    prompt_lengths = [5, 1, 3, 5, 2, 4, 5, 3]
    data = {}
    for side, response_lengths in (("chosen", [6, 1, 4, 2, 6, 3, 1, 5]), ("rejected", [2, 6, 1, 5, 3, 6, 4, 1])):
        input_ids = torch.randint(4, 60, (PAIRS, PROMPT + RESPONSE), generator=generator)
        mask = torch.zeros_like(input_ids)
        for row, (p, r) in enumerate(zip(prompt_lengths, response_lengths)):
            mask[row, PROMPT - p:PROMPT + r] = 1
        data[f"{side}_input_ids"], data[f"{side}_attention_mask"] = input_ids * mask, mask
    data[PairFields.REJECTED_INPUT_IDS][:, :PROMPT] = data[PairFields.CHOSEN_INPUT_IDS][:, :PROMPT]  # same prompt
    data[PairFields.MARGIN] = torch.rand(PAIRS, generator=generator)
    return data


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("rm_accum")
    reward_model = AutoModelForSequenceClassification.from_pretrained(save_tiny_model(root / "base"), num_labels=1)
    torch.nn.init.normal_(reward_model.score.weight, std=0.5)  # a head with some signal, stored so loads agree
    reward_model.save_pretrained(root / "reward")
    return root / "reward", make_pairs()


# ---------------------------------------------------------------- the plain single-process reference (no hybridrl)
def reference_loss(model, data):
    """Σ over the pairs in ``data`` of the per-pair loss, divided by PAIRS (the whole batch's pair count)."""
    total = 0.0
    for row in range(len(data[PairFields.MARGIN])):
        rewards = []
        for side in ("chosen", "rejected"):
            ids = data[f"{side}_input_ids"][row][data[f"{side}_attention_mask"][row].bool()]
            rewards.append(model(input_ids=ids[None]).logits[0, 0])  # one unpadded sequence at a time
        chosen, rejected = rewards
        margin = data[PairFields.MARGIN][row] + MARGIN
        total = total - torch.log(torch.sigmoid(chosen - rejected - margin))
        total = total + CENTER_COEF * (chosen + rejected) ** 2
    return total / PAIRS


def reference_model_and_gradients(model_dir, data):
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32)
    reference_loss(model, data).backward()
    return model, {name: param.grad.clone() for name, param in model.named_parameters()}


# ---------------------------------------------------------------- hybridrl on N gloo ranks
def run_cases(rank, world, model_dir, data, cases, out_path):
    from torch.distributed.device_mesh import init_device_mesh

    local = slice(rank * PAIRS // world, (rank + 1) * PAIRS // world)
    batch = Batch(tensors={name: tensor[local] for name, tensor in data.items()})
    results = {}
    for micro, packed, full_step, grad_sync in cases:
        model = build_model(ModelConfig(path=str(model_dir), dtype="float32"), "reward_model")
        shard_model(model, init_device_mesh("cpu", (world,)), ShardingOptions())
        optimizer = build_optimizer(model, OPTIM)
        micro_batching = MicroBatching(micro_batch_size=len(batch) if micro == "whole" else int(micro),
                                       grad_sync=grad_sync)
        engine = TrainingEngine(model, dp=DataParallelGroup(rank=rank, size=world), micro_batching=micro_batching,
                                optimizer=optimizer, scheduler=build_scheduler(optimizer, OPTIM, 10))
        loss = BradleyTerryLoss(packed=packed, loss=RMLossConfig(margin=MARGIN, center_coef=CENTER_COEF))
        if full_step:  # through the engine's own step, as the RM worker runs it
            model.train()
            with CollectiveCounter() as counter:
                engine.optimizer_step(batch, loss)
            results[("reduce_scatters", micro, packed, full_step, grad_sync)] = counter.total("reduce_scatter")
            tensors = {name: param.detach().full_tensor() for name, param in model.named_parameters()}
        else:
            engine.accumulate_gradients(batch, loss)
            tensors = {name: param.grad.full_tensor() for name, param in model.named_parameters()}
        results[(micro, packed, full_step, grad_sync)] = tensors
    if rank == 0:
        torch.save(results, out_path)


def relative_error(tensors, reference):
    numerator = sum(float((tensors[name] - reference[name]).pow(2).sum()) for name in reference)
    denominator = sum(float(reference[name].pow(2).sum()) for name in reference)
    return (numerator / denominator) ** 0.5


GRADIENT_CASES = [(micro, packed, False, "step") for micro, packed in itertools.product(MICRO, (False, True))]
STEP_CASES = [("2", True, True, "step"), ("1", False, True, "micro_batch")]  # fsdp.grad_sync: once, or every micro


@pytest.fixture(scope="module", params=[1, 2], ids=["dp1", "dp2"])
def engine_results(request, setup, tmp_path_factory):
    model_dir, data = setup
    out_path = tmp_path_factory.mktemp(f"rm_dp{request.param}") / "results.pt"
    run_on_gloo(request.param, run_cases, model_dir, data, GRADIENT_CASES + STEP_CASES, out_path)
    return request.param, torch.load(out_path)


def test_gradient_equals_single_batch_reference(engine_results, setup):
    _, engine_results = engine_results
    model_dir, data = setup
    _, reference = reference_model_and_gradients(model_dir, data)
    assert sum(float(g.abs().sum()) for g in reference.values()) > 0
    errors = {(micro, packed): relative_error(engine_results[(micro, packed, False, "step")], reference)
              for micro, packed, _, _ in GRADIENT_CASES}
    assert max(errors.values()) <= 1e-5, errors


@pytest.mark.parametrize("case", STEP_CASES, ids=lambda case: f"micro{case[0]}-sync_{case[3]}")
def test_optimizer_step_equals_reference(engine_results, setup, case):
    world, engine_results = engine_results
    model_dir, data = setup
    model, _ = reference_model_and_gradients(model_dir, data)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, eps=OPTIM.eps)
    before = {name: param.detach().clone() for name, param in model.named_parameters()}
    optimizer.step()
    update = {name: param.detach() - before[name] for name, param in model.named_parameters()}
    engine_update = {name: engine_results[case][name] - before[name] for name in update}
    assert relative_error(engine_update, update) <= 1e-5
    # one reduce-scatter per shard group (layers + root) per step, or per micro-batch with micro_batch
    micro, grad_sync = int(case[0]), case[3]
    steps = PAIRS // world // micro if grad_sync == "micro_batch" else 1
    expected = (NUM_LAYERS + 1) * steps if world > 1 else 0
    assert engine_results[("reduce_scatters", *case)] == expected


def test_per_micro_batch_normalisation_is_caught(setup):
    """Guard on the guard: averaging per-micro-batch means over unequal micro-batches is far outside the tolerance."""
    model_dir, data = setup
    _, reference = reference_model_and_gradients(model_dir, data)
    wrong = {}
    for part in (slice(0, 2), slice(2, 8)):  # 2 + 6 pairs, each normalised by its own count, then averaged
        _, grads = reference_model_and_gradients(model_dir, {name: tensor[part] for name, tensor in data.items()})
        size = part.stop - part.start
        for name, grad in grads.items():  # the reference divides by PAIRS: rescale to this part's own mean
            wrong[name] = wrong.get(name, 0) + grad * PAIRS / size / 2
    assert relative_error(wrong, reference) > 1e-2
