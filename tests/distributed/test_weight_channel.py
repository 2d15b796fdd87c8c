"""``rollout.weight_transfer=collective``: the trainer's FSDP ranks send their published rows to a replica's ranks over
a process group of their own (gloo here), and each replica rank assembles, streams and checks full tensors.

Four gloo processes: ranks 0-1 are the trainer (a tiny Llama, FSDP2 over their own group), ranks 2-3 a
tensor-parallel replica of 2. The default group only passes the address and the fingerprints around, as the
controller does. The same over NCCL: ``tests/gpu/test_weight_channel_gpu.py``."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from gloo_spawn import run_on_gloo
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

from hybridrl.hybrid_engine.channel import ChannelAddress, WeightChannel, host_channel
from hybridrl.hybrid_engine.delta import DeltaFrame
from hybridrl.hybrid_engine.publish import PublishedWeights, WeightPublisher
from hybridrl.utils.tiny_model import TinyModelSpec, build_tiny_model

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(180)]


def tiny_llama() -> torch.nn.Module:
    spec = TinyModelSpec(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64)
    return build_tiny_model(spec, vocab_size=48, pad_token_id=0, eos_token_id=1, seed=3)


def shared(value, rank: int):
    """Rank 0's ``value`` on every rank (the controller's hand-over)."""
    box = [value if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def summed(expected, layout, device) -> torch.Tensor:
    """The writers' fingerprints ``[tp_size, params]`` summed, on every rank (the controller sums them)."""
    total = expected.clone() if expected is not None else torch.zeros((layout.tp_size, len(layout.names)),
                                                                      dtype=torch.int64)
    total = total.to(device)
    dist.all_reduce(total)
    return total.cpu()


def publish_twice_over_a_channel(rank: int, world: int, writers: int = 2, backend: str = "gloo",
                                 delta: bool = False) -> None:
    """Ranks ``0 … writers-1``: the trainer; the others: one replica. ``backend="nccl"``: a GPU per rank.
    ``delta``: publications as deltas (``rollout.weight_delta``): versions 2 and 4 change only the embedding, 3
    changes nothing (a delta of no values: the next frame must still be read as the next)."""
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    trainer = dist.new_group(list(range(writers)))
    store, address = host_channel(writers, world - writers, backend, host="127.0.0.1") if rank == 0 else (None, None)
    address = shared(address, rank)
    channel = WeightChannel.join(address, rank)
    reference = tiny_llama()
    if rank < writers:
        model = tiny_llama().to(device)
        fully_shard(model, mesh=DeviceMesh.from_group(trainer, device.type))
        publisher = WeightPublisher(model, tp_size=world - writers, dtype=torch.bfloat16, group=trainer,
                                    transport="collective", delta_full_every=10 if delta else 0)
        publisher.channels[0] = channel
        layout = shared(publisher.layout, rank)
    else:
        layout = shared(None, rank)
        reader = PublishedWeights(layout, tp_rank=rank - writers, rank=rank, channel=channel)
    # each publication must be the one its load receives; the scale is the embedding's (every tensor's when whole)
    scales = [1.0, 2.0, 2.0, 4.0] if delta else [1.0, 2.0]
    whole = sum(param.numel() * 2 for param in reference.parameters())
    for version, scale in enumerate(scales, start=1):
        if rank < writers:
            expected = publisher.publish(checked=True, policy_version=version).expected
            # the readers receive only after this barrier: a send that waited for its receiver would hang here
            dist.barrier()
            summed(expected, layout, device)
            with torch.no_grad():
                for param in list(model.parameters())[:1 if delta else None]:
                    param.to_local().mul_(scales[version] / scale if version < len(scales) else 1.0)
        else:
            dist.barrier()
            total = summed(None, layout, device)
            received = dict(reader.stream(checked=True, policy_version=version))
            reader.verify(total)
            assert list(received) == [name for name, _ in reference.named_parameters()]
            for index, (name, param) in enumerate(reference.named_parameters()):
                assert received[name].device == device, name
                factor = scale if index == 0 or not delta else 1.0
                assert torch.equal(received[name].cpu(), (param.detach() * factor).to(torch.bfloat16)), name
            if not delta or version == 1:
                assert reader.fetched_bytes == whole
            elif version == 3:
                assert reader.fetched_bytes == 0  # nothing changed
            else:
                assert 0 < reader.fetched_bytes < whole / 4, (version, reader.fetched_bytes, whole)
    dist.barrier()


@pytest.mark.parametrize("delta", [False, True], ids=["whole", "delta"])
def test_trainer_ranks_send_published_rows_to_a_replica_over_their_own_group(delta):
    run_on_gloo(4, publish_twice_over_a_channel, 2, "gloo", delta)


def a_publication_of_another_version(rank: int, world: int) -> None:
    """Writer 0 sends version 3; the reader, loading version 4, refuses it before taking the rows."""
    store, address = host_channel(1, 1, host="127.0.0.1") if rank == 0 else (None, None)
    channel = WeightChannel.join(shared(address, rank), rank)
    if rank == 0:
        channel.send(DeltaFrame("full", 3, None, 6, torch.arange(6, dtype=torch.float32)))
    else:
        with pytest.raises(ValueError, match="trainer rank 0 sent the weights of version 3 where version 4 was "
                                             "expected: a publication was not paired with its load"):
            channel.receive(torch.float32, policy_version=4)
    dist.barrier()
    if rank == 0:
        channel.abandon()  # the rows were never received: nothing to wait for


def test_a_publication_that_was_not_paired_with_its_load_is_refused():
    run_on_gloo(2, a_publication_of_another_version)


def test_a_channel_rank_outside_the_group_and_an_unknown_backend_are_refused():
    with pytest.raises(ValueError, match="channel rank 3 is outside its 3 members"):
        WeightChannel.join(ChannelAddress("127.0.0.1", 1, writers=1, readers=2), 3)
    with pytest.raises(ValueError, match="backend must be one of"):
        host_channel(1, 1, backend="mpi", host="127.0.0.1")


def test_a_collective_reader_without_its_channel_is_refused():
    from hybridrl.hybrid_engine.publish import PublishedLayout

    layout = PublishedLayout(path="", nbytes=0, names=(), shapes=(), offsets=(), dtype=torch.float32, tp_size=1,
                             regions=((),), transport="collective")
    with pytest.raises(ValueError, match="has not joined its channel"):
        PublishedWeights(layout, tp_rank=0)
