"""MoE routing record and replay (``hybridrl.modeling.routing_replay``) on tiny random Mixtral and Qwen3-MoE models:
replaying a forward's own routing reproduces it bit for bit (outputs and gradients); after the router moves, replay
routes every token to the recorded experts while the gate weights — and the gradients into the router — are the
moved router's own; a dense model and a mismatched record are refused."""

from __future__ import annotations

import pytest
import torch

from hybridrl.modeling.routing_replay import recorded_routing, replayed_routing, routers, routing_agreement
from hybridrl.utils.tiny_model import TinyModelSpec, build_tiny_model

ARCHITECTURES = ("mixtral", "qwen3_moe")


def tiny_moe(architecture):
    torch.manual_seed(0)
    return build_tiny_model(TinyModelSpec(architecture=architecture), 60, pad_token_id=0, eos_token_id=1).float()


def batch():
    return torch.randint(4, 60, (3, 9), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_replaying_a_forwards_own_routing_changes_nothing(architecture):
    model, ids = tiny_moe(architecture), batch()
    with recorded_routing(model) as record:
        plain = model(input_ids=ids).logits
    plain.sum().backward()
    plain_grads = {name: param.grad.clone() for name, param in model.named_parameters()}
    model.zero_grad()
    experts = [calls[0] for calls in record]
    assert len(experts) == len(routers(model)) == model.config.num_hidden_layers
    assert all(chosen.shape == (ids.numel(), model.config.num_experts_per_tok) for chosen in experts)
    with replayed_routing(model, experts):
        replayed = model(input_ids=ids).logits
    replayed.sum().backward()
    assert torch.equal(replayed, plain)
    for name, param in model.named_parameters():
        assert torch.equal(param.grad, plain_grads[name]), name


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_replay_keeps_the_recorded_experts_after_the_router_moves(architecture):
    model, ids = tiny_moe(architecture), batch()
    with recorded_routing(model) as record:
        model(input_ids=ids)
    experts = [calls[0] for calls in record]
    with torch.no_grad():  # the update moved the routers
        for router in routers(model):
            router.weight.add_(torch.randn_like(router.weight) * 2.0)
    with recorded_routing(model) as moved:
        free = model(input_ids=ids).logits
    assert routing_agreement(experts, [calls[0] for calls in moved]) < 0.9  # many tokens now route elsewhere
    with recorded_routing(model) as used, replayed_routing(model, experts):
        replayed = model(input_ids=ids).logits
    assert routing_agreement(experts, [calls[0] for calls in used]) == 1.0  # ... but not under replay
    assert not torch.allclose(replayed, free)
    replayed.sum().backward()
    assert all(router.weight.grad is not None and router.weight.grad.abs().sum() > 0 for router in routers(model))


def test_gate_weights_are_the_routers_own_probabilities_at_the_recorded_experts():
    model = tiny_moe("qwen3_moe")
    router = routers(model)[0]
    hidden = torch.randn(5, model.config.hidden_size)
    chosen = torch.tensor([[0, 1], [2, 3], [3, 0], [1, 2], [0, 3]])
    captured = []
    handle = router.register_forward_hook(lambda module, args, output: captured.append(output))
    with replayed_routing(model, [chosen] + [None] * (len(routers(model)) - 1)):
        router(hidden)  # only the first router runs here
    handle.remove()
    logits, scores, indices = captured[0]
    probabilities = torch.softmax(logits.float(), dim=-1).gather(-1, chosen)
    expected = probabilities / probabilities.sum(-1, keepdim=True) if router.norm_topk_prob else probabilities
    assert torch.equal(indices, chosen) and torch.allclose(scores, expected.to(scores.dtype))


def test_refusals():
    dense = build_tiny_model(TinyModelSpec(), 60, pad_token_id=0, eos_token_id=1)
    with pytest.raises(ValueError, match="needs a mixture-of-experts model"), replayed_routing(dense, []):
        pass
    model = tiny_moe("mixtral")
    with pytest.raises(ValueError, match="3 layers of recorded experts for a model with 2 routers"):
        with replayed_routing(model, [torch.zeros(1, 2, dtype=torch.long)] * 2 + [torch.zeros(1, 2)]):
            pass
    wrong = [torch.zeros(4, 2, dtype=torch.long) for _ in routers(model)]
    with pytest.raises(ValueError, match="the replayed forward must see the recorded tokens"):
        with replayed_routing(model, wrong):
            model(input_ids=batch())


# The installed hooks (install_routing_replay): a [B, T, routers, k] record travels as a forward keyword and is laid
# out as each forward lays out its tokens.

def rollout_rows():
    """Two rows of [left-padded prompt | right-padded response]: P = 5, R = 4; the first and last columns are padding
    in both rows, so the padded forward trims them and the record must be laid out from column 1."""
    ids = torch.randint(4, 60, (2, 9), generator=torch.Generator().manual_seed(2))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1, 1, 1, 0]])
    return ids * mask, mask


def recorded_rows(model, ids, mask):
    """The model's own routing of the rows, as [B, T, routers, k] (-1 at padding)."""
    from hybridrl.modeling.positions import position_ids_from_mask

    with recorded_routing(model) as record:
        model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask))
    experts = torch.stack([calls[0].view(*ids.shape, -1) for calls in record], dim=2)
    return experts.masked_fill(~mask.bool()[..., None, None], -1)


def moved(model, scale=2.0):
    with torch.no_grad():
        for router in routers(model):
            router.weight.add_(torch.randn(router.weight.shape, generator=torch.Generator().manual_seed(3)) * scale)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_padded_and_packed_forwards_replay_the_same_routing(architecture):
    from hybridrl.modeling.routing_replay import install_routing_replay
    from hybridrl.modeling.sequences import response_log_probs

    model = tiny_moe(architecture)
    ids, mask = rollout_rows()
    experts = recorded_rows(model, ids, mask)
    state = install_routing_replay(model)
    own, _ = response_log_probs(model, ids, mask, 4)
    replayed_own, _ = response_log_probs(model, ids, mask, 4, routed_experts=experts)
    assert torch.allclose(replayed_own, own, atol=1e-6) and state.agreement() == 1.0
    moved(model)
    state.reset()
    free, _ = response_log_probs(model, ids, mask, 4)
    padded, _ = response_log_probs(model, ids, mask, 4, routed_experts=experts)
    assert state.agreement() < 0.9  # the moved routers would route elsewhere ...
    packed, _ = response_log_probs(model, ids, mask, 4, packed=True, routed_experts=experts)
    assert torch.allclose(packed, padded, atol=1e-5)  # ... both layouts replay the record
    assert (free - padded).abs().max() > 1e-3
    with recorded_routing(model) as used:  # the experts the padded forward used are the record's at real tokens
        response_log_probs(model, ids, mask, 4, routed_experts=experts)
    kept = torch.stack([calls[0].view(2, -1, experts.shape[-1]) for calls in used], dim=2)
    assert kept.shape[1] == 7  # columns 1..7: the trimmed forward
    trimmed = experts[:, 1:8]
    real = trimmed[..., 0, 0] >= 0
    assert torch.equal(kept[real].sort(-1).values, trimmed[real].sort(-1).values)


def test_measuring_only_routes_on_its_own_and_counts_the_agreement():
    from hybridrl.modeling.routing_replay import install_routing_replay
    from hybridrl.modeling.sequences import response_log_probs

    model = tiny_moe("qwen3_moe")
    ids, mask = rollout_rows()
    experts = recorded_rows(model, ids, mask)
    moved(model)
    state = install_routing_replay(model, replay=False)
    free, _ = response_log_probs(model, ids, mask, 4)
    measured, _ = response_log_probs(model, ids, mask, 4, routed_experts=experts)
    assert torch.equal(measured, free)
    assert state.recorded == int(mask.sum()) * len(routers(model))  # real tokens × routers, padding not counted
    assert 0 < state.agreement() < 0.9


def test_a_checkpointed_layer_replays_the_same_routing_when_it_recomputes():
    from hybridrl.modeling.routing_replay import install_routing_replay
    from hybridrl.modeling.sequences import response_log_probs

    grads = []
    for checkpointed in (False, True):
        model = tiny_moe("mixtral")
        ids, mask = rollout_rows()
        experts = recorded_rows(model, ids, mask)
        moved(model)
        install_routing_replay(model)
        if checkpointed:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        log_probs, _ = response_log_probs(model, ids, mask, 4, routed_experts=experts)
        log_probs.sum().backward()
        grads.append({name: param.grad for name, param in model.named_parameters()})
    for name, grad in grads[0].items():
        assert torch.allclose(grads[1][name], grad, atol=1e-6), name


def test_installing_on_a_dense_model_is_refused():
    from hybridrl.modeling.routing_replay import install_routing_replay

    with pytest.raises(ValueError, match="needs a mixture-of-experts model"):
        install_routing_replay(build_tiny_model(TinyModelSpec(), 60, pad_token_id=0, eos_token_id=1))


def test_a_record_that_reaches_no_router_is_refused():
    """R3 on a batch with recorded routing whose forwards never pass it on (here: a forward without the keyword):
    refused, not silently trained on the trainer's own routing."""
    from hybridrl.engines.micro_batches import DataParallelGroup
    from hybridrl.protocol import Batch, Fields
    from hybridrl.workers.routing import ActorRouting

    model = tiny_moe("qwen3_moe")
    ids, mask = rollout_rows()
    batch = Batch(tensors={Fields.INPUT_IDS: ids, Fields.ROUTED_EXPERTS: recorded_rows(model, ids, mask)})
    routing = ActorRouting(model, "R3")
    with pytest.raises(RuntimeError, match="no router of the model saw it"):
        routing.measured(batch, DataParallelGroup(), lambda: model(input_ids=ids))
    with pytest.raises(ValueError, match="the batch has no 'routed_experts'"):
        routing.measured(Batch(tensors={Fields.INPUT_IDS: ids}), DataParallelGroup(), lambda: None)
