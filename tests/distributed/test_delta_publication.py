"""``rollout.weight_delta``: a publication through Ray's object store as deltas against the version the replica holds
arrives bit for bit as the whole rows would, fingerprints checked, for fewer bytes; whole at the first version and
every ``full_every``; a replica that missed a version refuses the next delta instead of loading wrong weights."""

from __future__ import annotations

import pytest
import torch

from hybridrl.hybrid_engine.publish import PublishedWeights, WeightPublisher
from hybridrl.utils.tiny_model import TinyModelSpec, build_tiny_model

pytestmark = pytest.mark.distributed


def trained_model():
    """A tiny model whose weights are large against an update of lr 1e-6, as a pretrained model's are against RL's
    steps (the tests' default initialisation is small enough that every bf16 value would move)."""
    model = build_tiny_model(TinyModelSpec(hidden_size=64, intermediate_size=128), vocab_size=96, pad_token_id=0,
                             eos_token_id=1, seed=5)
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(25.0)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)


def step(model, optimizer, seed: int) -> None:
    rows = torch.randint(2, 96, (4, 12), generator=torch.Generator().manual_seed(seed))
    model(input_ids=rows, labels=rows).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def received(reader: PublishedWeights, publication, version: int) -> dict[str, torch.Tensor]:
    tensors = {name: tensor.clone() for name, tensor in reader.stream(checked=True, rows=publication.rows,
                                                                       policy_version=version)}
    reader.verify(publication.expected)
    return tensors


def test_deltas_through_the_object_store_arrive_bit_for_bit_for_fewer_bytes(ray_runtime):
    model, optimizer = trained_model()
    publisher = WeightPublisher(model, tp_size=1, dtype=torch.bfloat16, transport="object_store", delta_full_every=3)
    reader = PublishedWeights(publisher.layout, tp_rank=0)
    whole_bytes = publisher.flat_numel * 2
    fetched = []
    for version in range(1, 6):
        if version > 1:
            step(model, optimizer, seed=version)
        tensors = received(reader, publisher.publish(checked=True, policy_version=version), version)
        for name, param in model.named_parameters():
            assert torch.equal(tensors[name].view(torch.int16), param.detach().to(torch.bfloat16).view(torch.int16)), \
                (version, name)
        fetched.append(reader.fetched_bytes)
    assert fetched[0] == fetched[3] == whole_bytes  # the first version, then whole every 3
    assert all(0 < fetched[i] < whole_bytes / 5 for i in (1, 2, 4)), (fetched, whole_bytes)
    unchanged = received(reader, publisher.publish(checked=True, policy_version=6), 6)  # nothing moved: no values
    assert reader.fetched_bytes == 0
    assert all(torch.equal(unchanged[name], tensors[name]) for name in tensors)


def test_a_replica_that_missed_a_version_refuses_the_next_delta(ray_runtime):
    model, optimizer = trained_model()
    publisher = WeightPublisher(model, tp_size=1, dtype=torch.bfloat16, transport="object_store", delta_full_every=10)
    reader = PublishedWeights(publisher.layout, tp_rank=0)
    received(reader, publisher.publish(checked=True, policy_version=1), 1)
    step(model, optimizer, seed=1)
    publisher.publish(checked=True, policy_version=2)  # never loaded
    step(model, optimizer, seed=2)
    late = publisher.publish(checked=True, policy_version=3)
    with pytest.raises(ValueError, match="made against version 2, but this replica holds version 1"):
        received(reader, late, 3)


def test_a_delta_needs_a_transport_that_moves_bytes():
    model, _ = trained_model()
    with pytest.raises(ValueError, match="travels through the object store or a collective, not a host-shared copy"):
        WeightPublisher(model, tp_size=1, dtype=torch.bfloat16, transport="shared_memory", delta_full_every=3)
