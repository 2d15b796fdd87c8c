"""MoE routing replay under Ulysses sequence parallelism: each rank of an SP = 2 group routes its share of the
positions to the recorded experts of exactly those positions, so the split forward replays what one whole-sequence
forward replays — log-probs and gradients equal to fp32 reduction order, padded and packed rows, after the routers
have moved (so own routing and the record disagree and a misplaced record would show)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from gloo_spawn import run_on_gloo
from test_grad_accum_invariance import relative_error

from hybridrl.modeling.positions import position_ids_from_mask
from hybridrl.modeling.routing_replay import install_routing_replay, recorded_routing, routers
from hybridrl.modeling.sequences import response_log_probs
from hybridrl.modeling.ulysses import install_ulysses, sequence_parallel_layout
from hybridrl.utils.tiny_model import TinyModelSpec, build_tiny_model

pytestmark = pytest.mark.distributed

SPEC = TinyModelSpec(architecture="qwen3_moe", hidden_size=128, num_heads=4, num_kv_heads=2)
RESPONSE = 5


def tiny_moe():
    torch.manual_seed(0)
    return build_tiny_model(SPEC, 60, pad_token_id=0, eos_token_id=1).float()


def rows_and_record():
    """Three rows [left-padded prompt of 6 | response of 5] (odd length 11: SP pads it), the model's own routing of
    them as [B, T, routers, k] (-1 at padding), and then routers moved by a seeded step."""
    model = tiny_moe()
    ids = torch.randint(4, 60, (3, 11), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[:, 0] = mask[:, -1] = 0  # padding in every row at both ends: the padded forward trims them
    mask[0, :2] = 0
    mask[1, -2:] = 0
    ids = ids * mask
    with torch.no_grad(), recorded_routing(model) as record:
        model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask))
    experts = torch.stack([calls[0].view(*ids.shape, -1) for calls in record], dim=2)
    return ids, mask, experts.masked_fill(~mask.bool()[..., None, None], -1)


def with_moved_routers(model):
    with torch.no_grad():
        for router in routers(model):
            router.weight.add_(torch.randn(router.weight.shape, generator=torch.Generator().manual_seed(3)) * 2.0)
    return model


def replayed(model, ids, mask, experts, packed):
    model.zero_grad()
    log_probs, _ = response_log_probs(model, ids, mask, RESPONSE, packed=packed, routed_experts=experts)
    log_probs.sum().backward()
    return log_probs.detach(), {name: param.grad.clone() for name, param in model.named_parameters()}


def split_rank(rank, world, ids, mask, experts, out_path):
    layout = sequence_parallel_layout(2)
    results = {}
    for packed in (False, True):
        model = with_moved_routers(tiny_moe())
        install_ulysses(model, layout.sp)
        state = install_routing_replay(model)
        log_probs, grads = replayed(model, ids, mask, experts, packed)
        for grad in grads.values():  # each rank holds SP × its positions' share: the group's sum over SP
            dist.all_reduce(grad)
            grad /= 2
        results[packed] = (log_probs, grads, state.recorded)
    if rank == 0:
        torch.save(results, out_path)


def test_split_sequences_replay_the_recorded_routing(tmp_path):
    ids, mask, experts = rows_and_record()
    out = tmp_path / "split.pt"
    run_on_gloo(2, split_rank, ids, mask, experts, out)
    split = torch.load(out, weights_only=False)
    for packed in (False, True):
        model = with_moved_routers(tiny_moe())
        free, _ = response_log_probs(model, ids, mask, RESPONSE, packed=packed)
        install_routing_replay(model)
        log_probs, grads = replayed(model, ids, mask, experts, packed)
        assert (free - log_probs).abs().max() > 1e-3, packed  # the record routes differently from the moved routers
        split_log_probs, split_grads, recorded = split[packed]
        assert torch.allclose(split_log_probs, log_probs, atol=1e-5), packed
        assert relative_error(split_grads, grads) <= 1e-5, packed
        # rank 0 routed its half of the real tokens by the record (padding, Ulysses' included, routes on its own)
        assert 0 < recorded < int(mask.sum()) * len(routers(model)), packed
