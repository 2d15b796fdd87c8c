"""Per-group sync intervals on 2 real gloo ranks vs slow references written here: interval 1 everywhere is plain
all-reduce DDP, exactly; intervals > 1 equal "each replica takes k local steps, then the group's weights are averaged"."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gloo_spawn import run_on_gloo
from hybridrl.workers.local_sgd import PeriodicSync, default_group_of, profile_gradient_change, propose_intervals

STEPS, WORLD, LR = 6, 2, 0.1


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


def group_of(name: str) -> str:
    return "first" if name.startswith("0.") else "last"


def data(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(5, 4, generator=generator), torch.randn(5, 3, generator=generator)


def loss_of(model, rank, step):
    inputs, targets = data(rank, step)
    return ((model(inputs) - targets) ** 2).mean()


def run_rank(rank, world, intervals, out_path):
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.5)
    sync = PeriodicSync(model, intervals, group_of=group_of)
    for step in range(STEPS):
        optimizer.zero_grad()
        loss_of(model, rank, step).backward()
        sync.before_step()
        optimizer.step()
        sync.after_step()
    torch.save({"params": {n: p.detach() for n, p in model.named_parameters()}, "bytes": sync.stats.total_bytes},
               f"{out_path}.{rank}")


def ddp_reference() -> dict[str, torch.Tensor]:
    """One model; each step's gradient is the mean of the ranks' gradients (what DDP computes)."""
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.5)
    for step in range(STEPS):
        optimizer.zero_grad()
        (sum(loss_of(model, rank, step) for rank in range(WORLD)) / WORLD).backward()
        optimizer.step()
    return {n: p.detach() for n, p in model.named_parameters()}


def local_reference(interval: int) -> list[dict[str, torch.Tensor]]:
    """Both groups local: WORLD separate replicas, each with its own optimizer, weights averaged every ``interval``."""
    replicas = [make_model() for _ in range(WORLD)]
    optimizers = [torch.optim.SGD(model.parameters(), lr=LR, momentum=0.5) for model in replicas]
    for step in range(STEPS):
        for rank, (model, optimizer) in enumerate(zip(replicas, optimizers)):
            optimizer.zero_grad()
            loss_of(model, rank, step).backward()
            optimizer.step()
        if (step + 1) % interval == 0:
            with torch.no_grad():
                for params in zip(*(model.parameters() for model in replicas)):
                    mean = sum(params) / WORLD
                    for param in params:
                        param.copy_(mean)
    return [{n: p.detach() for n, p in model.named_parameters()} for model in replicas]


def run(tmp_path, intervals):
    run_on_gloo(WORLD, run_rank, intervals, str(tmp_path / "out"))
    return [torch.load(tmp_path / f"out.{rank}") for rank in range(WORLD)]


@pytest.mark.distributed
def test_interval_one_is_ddp_exactly(tmp_path):
    results = run(tmp_path, {"first": 1, "last": 1})
    reference = ddp_reference()
    for result in results:
        for name, tensor in reference.items():
            assert torch.allclose(result["params"][name], tensor, atol=1e-6), name
    parameter_bytes = sum(p.numel() * 4 for p in make_model().parameters())
    assert results[0]["bytes"] == STEPS * parameter_bytes


@pytest.mark.distributed
def test_intervals_equal_local_steps_then_averaging(tmp_path):
    results = run(tmp_path, {"first": 3, "last": 3})
    reference = local_reference(3)
    for rank, result in enumerate(results):
        for name, tensor in reference[rank].items():
            assert torch.allclose(result["params"][name], tensor, atol=1e-6), (rank, name)
    # step 6 is a multiple of 3: the replicas were just averaged, so they agree exactly
    assert torch.equal(results[0]["params"]["0.weight"], results[1]["params"]["0.weight"])
    parameter_bytes = sum(p.numel() * 4 for p in make_model().parameters())
    assert results[0]["bytes"] == 2 * parameter_bytes  # two averagings instead of six gradient all-reduces


def test_default_groups_of_a_decoder():
    assert default_group_of("model.embed_tokens.weight") == "embed"
    assert default_group_of("lm_head.weight") == "embed"
    assert default_group_of("model.layers.3.self_attn.q_proj.weight") == "attn.3"
    assert default_group_of("model.layers.3.mlp.up_proj.weight") == "mlp.3"
    assert default_group_of("model.layers.0.input_layernorm.weight") == "norm.0"
    assert default_group_of("model.norm.weight") == "norm"


def test_unknown_group_and_bad_interval_are_refused():
    with pytest.raises(ValueError, match="'middle'"):
        PeriodicSync(make_model(), {"middle": 2}, group_of=group_of)
    with pytest.raises(ValueError, match="'first'"):
        PeriodicSync(make_model(), {"first": 0}, group_of=group_of)


def test_profile_and_proposal_against_a_hand_computed_rate():
    model = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 0.0]]))
    inputs = [torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 2.0]])]
    # loss = (w·x)²/2 → gradient (w·x) x: step 0 gives [1, 0], step 1 gives [0, 0] → relative change 1
    rates = profile_gradient_change(model, [lambda x=x: (model(x) ** 2).sum() / 2 for x in inputs],
                                    group_of=lambda name: "w")
    assert rates == pytest.approx({"w": 1.0})
    proposal = propose_intervals({"a": 0.9, "b": 0.5, "c": 0.1, "d": 0.01})
    assert proposal == {"a": 1, "b": 2, "c": 5, "d": 10}
