"""Delta weight sync (``hybrid_engine/delta.py``): every frame takes the receiver to the sender's buffer bit for bit,
the smallest kind is chosen, whole buffers go out when they should, and a delta against another version is refused."""

from __future__ import annotations

import pytest
import torch

from hybridrl.hybrid_engine.delta import (DeltaFrame, DeltaReceiver, DeltaSender, apply_delta, delta_nbytes,
                                          encode_delta, pack_flags, unpack_flags)


def bits(tensor: torch.Tensor) -> list[int]:
    return tensor.view(torch.int16 if tensor.element_size() == 2 else torch.int32).tolist()


def stepped(buffer: torch.Tensor, share: float, seed: int) -> torch.Tensor:
    """``buffer`` after an update that moves about ``share`` of its values (the others keep their bits)."""
    generator = torch.Generator().manual_seed(seed)
    moved = torch.rand(buffer.numel(), generator=generator) < share
    noise = torch.randn(buffer.numel(), generator=generator).to(buffer.dtype)
    return torch.where(moved, buffer + noise, buffer)


def reference_apply(held: torch.Tensor, frame: DeltaFrame) -> torch.Tensor:
    """The slow reference: decode the positions one bit at a time and write each value."""
    if frame.kind == "full":
        return frame.values.clone()
    if frame.kind == "indices":
        positions = [int(p) for p in frame.positions]
    else:
        positions = [i for i in range(frame.numel) if int(frame.positions[i // 8]) >> (i % 8) & 1]
    out = held.clone()
    for position, value in zip(positions, frame.values):
        out[position] = value
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("share", [0.0, 0.01, 0.1, 0.3, 0.9])
def test_a_frame_takes_the_held_buffer_to_the_new_one_bit_for_bit(dtype, share):
    old = torch.randn(1001, generator=torch.Generator().manual_seed(0)).to(dtype)
    new = stepped(old, share, seed=1)
    frame = encode_delta(old, new, version=2, base_version=1)
    assert bits(reference_apply(old, frame)) == bits(new)
    assert bits(apply_delta(old.clone(), 1, frame)) == bits(new)
    changed = int((old.view(torch.int16 if dtype == torch.bfloat16 else torch.int32)
                   != new.view(torch.int16 if dtype == torch.bfloat16 else torch.int32)).sum())
    sizes = delta_nbytes(new.numel(), changed, new.element_size())
    assert frame.nbytes == min(sizes["indices"], sizes["mask"]) if frame.kind != "full" else sizes["full"]
    if frame.kind != "full":
        assert frame.nbytes < 0.5 * sizes["full"]
    assert frame.kind == ("indices" if share <= 0.01 else "mask" if share <= 0.3 else "full")


def test_bits_decide_what_changed_signed_zeros_and_nans_included():
    old = torch.tensor([0.0, 1.0, float("nan"), 2.0] * 16, dtype=torch.bfloat16)
    new = old.clone()
    new[0] = -0.0  # equal as numbers, not as bits
    new.view(torch.int16)[2] = 0x7FC1  # another NaN's bits
    frame = encode_delta(old, new, version=1, base_version=0)
    assert frame.kind == "indices" and frame.positions.tolist() == [0, 2]
    assert bits(apply_delta(old.clone(), 0, frame)) == bits(new)


def test_the_bitmask_packs_and_unpacks_every_flag():
    for numel in (1, 7, 8, 9, 64, 1000):
        flags = torch.rand(numel, generator=torch.Generator().manual_seed(numel)) < 0.3
        mask = pack_flags(flags)
        assert mask.numel() == -(-numel // 8)
        assert [int(mask[i // 8]) >> (i % 8) & 1 for i in range(numel)] == flags.int().tolist()
        assert torch.equal(unpack_flags(mask, numel), flags)


def test_a_sender_and_a_receiver_stay_equal_over_versions_with_a_whole_buffer_every_n():
    sender, receiver = DeltaSender(max_share=0.5, full_every=3), DeltaReceiver()
    buffer = torch.randn(4096, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    kinds = []
    for version in range(1, 8):
        buffer = stepped(buffer, 0.02, seed=version)
        frame = sender.encode(buffer, version)
        kinds.append(frame.kind)
        assert bits(receiver.receive(frame)) == bits(buffer) and receiver.version == version
    assert kinds == ["full", "indices", "indices", "full", "indices", "indices", "full"]
    assert DeltaSender(full_every=1).encode(buffer, 1).kind == "full"


def test_a_forgotten_sender_sends_the_next_version_whole():
    sender = DeltaSender(full_every=100)
    buffer = torch.zeros(512, dtype=torch.bfloat16)
    sender.encode(buffer, 1)
    assert sender.encode(stepped(buffer, 0.01, seed=3), 2).kind == "indices"
    sender.forget()
    assert sender.encode(buffer, 3).kind == "full"


def test_a_delta_against_another_version_or_layout_is_refused():
    sender, receiver = DeltaSender(full_every=100), DeltaReceiver()
    buffer = torch.zeros(512, dtype=torch.bfloat16)
    receiver.receive(sender.encode(buffer, 1))
    skipped = sender.encode(stepped(buffer, 0.01, seed=4), 2)  # never delivered
    late = sender.encode(stepped(buffer, 0.01, seed=5), 3)
    with pytest.raises(ValueError, match="made against version 2, but this replica holds version 1: a publication "
                                         "was lost or repeated"):
        receiver.receive(late)
    assert receiver.version == 1 and bits(receiver.buffer) == bits(buffer)  # nothing half-applied
    receiver.receive(skipped)
    with pytest.raises(ValueError, match="does not fit the held buffer of 256"):
        apply_delta(torch.zeros(256, dtype=torch.bfloat16), 2, late)
    held = torch.zeros(16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="names 2 positions for 3 values"):
        apply_delta(held, 1, DeltaFrame("indices", 2, 1, 16, torch.ones(3, dtype=torch.bfloat16),
                                        torch.tensor([0, 5], dtype=torch.int32)))
    with pytest.raises(ValueError, match="names 1 positions for 3 values"):
        apply_delta(held, 1, DeltaFrame("mask", 2, 1, 16, torch.ones(3, dtype=torch.bfloat16),
                                        torch.tensor([1, 0], dtype=torch.uint8)))
    with pytest.raises(ValueError, match="unknown delta frame kind 'xor'"):
        apply_delta(held, 1, DeltaFrame("xor", 2, 1, 16, torch.ones(3, dtype=torch.bfloat16)))
    assert not held.any()  # a refused frame writes nothing
    with pytest.raises(ValueError, match="1-D and contiguous"):
        encode_delta(torch.zeros(4, 4), torch.zeros(4, 4), 1, 0)
    with pytest.raises(ValueError, match="same buffer layout"):
        encode_delta(torch.zeros(4), torch.zeros(5), 1, 0)


@pytest.mark.parametrize("bad", [{"max_share": 0.0}, {"max_share": 1.5}, {"full_every": 0}])
def test_sender_settings_out_of_range_are_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        DeltaSender(**bad)
