"""PPO-ptx and EWC on 2 real gloo ranks (FSDP2, micro-batches of 1) against a plain one-process SGD reference.

Two optimizer steps (two mini-batches) with SGD(lr) and no effective clipping, so each update is exactly
``-lr × gradient``: step 1 checks RL + ptx (EWC's pull is zero at the anchor), step 2 adds EWC's ``λ F (θ − θ*)``.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from gloo_spawn import run_on_gloo
from hybridrl.config.schema import ModelConfig, OptimConfig
from hybridrl.protocol import Batch
from hybridrl.utils.tiny_model import save_tiny_model
from hybridrl.engines.anti_forgetting import EWCRegularizer, PtxHook
from hybridrl.engines.base import TrainingEngine
from hybridrl.engines.losses import PolicyLoss, SequenceForward, SFTLoss
from hybridrl.engines.micro_batches import DataParallelGroup, MicroBatching

pytestmark = pytest.mark.distributed

ROWS, PTX_ROWS, PROMPT, RESPONSE, WORLD = 8, 8, 4, 5, 2
LR, PTX_COEF, EWC_COEF = 0.05, 0.7, 50.0


def make_rows(count: int, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(4, 60, (count, PROMPT + RESPONSE), generator=generator)
    mask = torch.ones_like(input_ids)
    mask[::3, :2] = 0
    for row in range(count):
        mask[row, PROMPT + 1 + row % (RESPONSE - 1):] = 0  # ragged responses: 2..5 tokens
    input_ids = input_ids * mask
    return dict(input_ids=input_ids, attention_mask=mask, responses=input_ids[:, PROMPT:].clone(),
                response_mask=mask[:, PROMPT:].clone(), advantages=torch.randn(count, RESPONSE, generator=generator),
                old_log_probs=-torch.rand(count, RESPONSE, generator=generator))


def rank_rows(data, rank, world):
    count = len(data["input_ids"])
    return {name: tensor[rank * count // world:(rank + 1) * count // world] for name, tensor in data.items()}


def global_chunk(data, chunk, num_chunks, world=WORLD):
    """Rows of mini-batch ``chunk``: that chunk of every rank's part, in rank order (what the ranks see)."""
    count = len(data["input_ids"])
    per_rank = count // world
    size = per_rank // num_chunks
    index = torch.cat([torch.arange(rank * per_rank + chunk * size, rank * per_rank + (chunk + 1) * size)
                       for rank in range(world)])
    return {name: tensor[index] for name, tensor in data.items()}


def run_rank(rank, world, model_dir, rl, ptx, out_path):
    from torch.distributed.device_mesh import init_device_mesh

    from hybridrl.modeling.fsdp import ShardingOptions, shard_model
    from hybridrl.modeling.model_builder import build_model
    from hybridrl.engines.optim import build_scheduler

    model = build_model(ModelConfig(path=str(model_dir), dtype="float32"), "actor")
    shard_model(model, init_device_mesh("cpu", (world,)), ShardingOptions())
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    engine = TrainingEngine(model, dp=DataParallelGroup(rank=rank, size=world),
                            micro_batching=MicroBatching(micro_batch_size=1), optimizer=optimizer,
                            scheduler=build_scheduler(optimizer, OptimConfig(lr=LR), 10), grad_clip=1e9)
    mine, forward = Batch(tensors=rank_rows(rl, rank, world)), SequenceForward()
    model.train()
    ewc = EWCRegularizer(model, EWC_COEF, engine.dp)
    ewc.estimate_fisher(engine, mine.split([len(mine) // 2] * 2), SFTLoss(forward))
    engine.hooks.append(ewc)
    ptx_hook = PtxHook(Batch(tensors=rank_rows(ptx, rank, world)), 2, SFTLoss(forward), PTX_COEF)
    metrics = engine.train_epochs(mine, PolicyLoss(forward=forward, temperature=1.0), mini_batch_size=len(mine) // 2,
                                  hooks=[ptx_hook])
    params = {name: param.detach().full_tensor() for name, param in model.named_parameters()}
    if rank == 0:
        torch.save(dict(params=params, metrics=metrics), out_path)


# ---------------------------------------------------------------- the plain single-process reference
def log_probs(model, data):
    mask = data["attention_mask"]
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    logits = model(input_ids=data["input_ids"], attention_mask=mask, position_ids=positions).logits
    return logits[:, PROMPT - 1:-1].log_softmax(-1).gather(-1, data["responses"].unsqueeze(-1)).squeeze(-1)


def token_mean(values, data):
    mask = data["response_mask"].float()
    return (values * mask).sum() / mask.sum()


def ppo_loss(model, data):
    ratio = torch.exp(log_probs(model, data) - data["old_log_probs"])
    advantages = data["advantages"]
    clipped = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(0.8, 1.2))
    return token_mean(torch.where(advantages < 0, torch.minimum(clipped, -advantages * 3.0), clipped), data)


def gradients(model, loss):
    model.zero_grad()
    loss.backward()
    return [param.grad.clone() for param in model.parameters()]


def reference_params(model_dir, rl, ptx, ewc_coef=EWC_COEF, ptx_coef=PTX_COEF):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    anchor = [param.detach().clone() for param in model.parameters()]
    fisher = [torch.zeros_like(param) for param in anchor]
    for chunk in range(2):  # each rank gave half its rows to each Fisher batch
        for total, grad in zip(fisher, gradients(model, token_mean(-log_probs(model, global_chunk(rl, chunk, 2)),
                                                                   global_chunk(rl, chunk, 2)))):
            total += grad.pow(2) / 2
    for step in range(2):
        mini_batch, sft = global_chunk(rl, step, 2), global_chunk(ptx, step, 2)
        loss = ppo_loss(model, mini_batch) + ptx_coef * token_mean(-log_probs(model, sft), sft)
        grads = gradients(model, loss)
        with torch.no_grad():
            for param, grad, f, a in zip(model.parameters(), grads, fisher, anchor):
                param -= LR * (grad + ewc_coef * f * (param - a))
    return dict(model.named_parameters())


def test_ptx_and_ewc_update_equals_reference(tmp_path):
    model_dir = save_tiny_model(tmp_path / "model")
    rl, ptx = make_rows(ROWS, 0), make_rows(PTX_ROWS, 1)
    run_on_gloo(WORLD, run_rank, model_dir, rl, ptx, tmp_path / "out.pt")
    out = torch.load(tmp_path / "out.pt")
    expected = reference_params(model_dir, rl, ptx)
    start = dict(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).named_parameters())
    for name, param in expected.items():
        moved = (param - start[name]).detach()
        assert torch.allclose(out["params"][name] - start[name], moved, atol=1e-6, rtol=1e-4), name
    assert out["metrics"]["ewc/penalty"] > 0 and out["metrics"]["ptx/sft_loss"] > 0
    # each term matters: the reference without it is far outside the tolerance used above
    for ablated in (reference_params(model_dir, rl, ptx, ewc_coef=0.0), reference_params(model_dir, rl, ptx, ptx_coef=0.0)):
        gap = max(float((out["params"][name] - param).abs().max()) for name, param in ablated.items())
        assert gap > 1e-4


def ewc_rank(rank, world, model_dir, rl, checkpoint, out_path, save):
    """Save EWC (anchor at the start weights, Fisher from ``rl``) on ``world`` ranks, or load it after moving the
    weights; rank 0 writes the gathered anchor and Fisher."""
    from torch.distributed.device_mesh import init_device_mesh

    from hybridrl.engines.anti_forgetting import like_param
    from hybridrl.modeling.fsdp import ShardingOptions, shard_model
    from hybridrl.modeling.model_builder import build_model

    model = build_model(ModelConfig(path=str(model_dir), dtype="float32"), "actor")
    shard_model(model, init_device_mesh("cpu", (world,)), ShardingOptions())
    dp = DataParallelGroup(rank=rank, size=world)
    if save:
        engine = TrainingEngine(model, dp=dp, micro_batching=MicroBatching(micro_batch_size=2))
        model.train()
        ewc = EWCRegularizer(model, EWC_COEF, dp)
        ewc.estimate_fisher(engine, [Batch(tensors=rank_rows(rl, rank, world))], SFTLoss(SequenceForward()))
        ewc.save(checkpoint)
    else:
        with torch.no_grad():
            for param in model.parameters():
                param.add_(1.0)  # the loaded anchor must be the saved one, not the current weights
        ewc = EWCRegularizer.load(checkpoint, model, EWC_COEF, dp)
    full = {f"{kind}/{name}": like_param(param, tensor).full_tensor()
            for name, param, anchor, fisher in zip(ewc.names, ewc.params, ewc.anchor, ewc.fisher)
            for kind, tensor in (("anchor", anchor), ("fisher", fisher))}
    if rank == 0:
        torch.save(full, out_path)


def test_ewc_state_saved_on_two_ranks_loads_on_one(tmp_path):
    model_dir = save_tiny_model(tmp_path / "model")
    rl = make_rows(ROWS, 0)
    run_on_gloo(2, ewc_rank, model_dir, rl, tmp_path / "ewc", tmp_path / "saved.pt", True)
    run_on_gloo(1, ewc_rank, model_dir, rl, tmp_path / "ewc", tmp_path / "loaded.pt", False)
    saved, loaded = torch.load(tmp_path / "saved.pt"), torch.load(tmp_path / "loaded.pt")
    start = dict(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).named_parameters())
    assert saved.keys() == loaded.keys() and len(saved) == 2 * len(start)
    for key in saved:
        assert torch.equal(saved[key], loaded[key]), key
    assert all(torch.equal(saved[f"anchor/{name}"], param.detach()) for name, param in start.items())
    assert sum(float(saved[key].sum()) for key in saved if key.startswith("fisher/")) > 0
