"""Fingerprints of the checked weight sync (``hybrid_engine/checksums.py``) and the shared-memory arena's refusals."""

from __future__ import annotations

import os

import pytest
import torch

from hybridrl.hybrid_engine.checksums import region_fingerprint
from hybridrl.hybrid_engine.plan import box_slices
from hybridrl.hybrid_engine.shared_memory import SharedArena, SharedMemoryUnavailable, arena_offsets

COLUMN_SLICES = [((64, 48), (8, 24)), ((64, 48), (3, 10)), ((64, 47), (1, 9)), ((10, 6, 4), (1, 3)), ((5, 7), (0, 7))]


@pytest.mark.parametrize("shape, columns", COLUMN_SLICES)
def test_column_slice_is_fingerprinted_in_place_as_its_copy(shape, columns):
    """A column slice (rows are contiguous runs, a stride apart) is read in place; aligned or not, it must give the
    fingerprint of its contiguous copy, which is what the other side of the sync computes."""
    full = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    region = ((0, shape[0]), columns, *((0, size) for size in shape[2:]))
    piece = full[box_slices(region)]
    assert int(region_fingerprint(piece, region)) == int(region_fingerprint(piece.contiguous(), region))


def test_fingerprint_adds_over_pieces_and_sees_row_order():
    """Additive: two row blocks sum to the whole. Positional: the same bytes in swapped rows differ."""
    full = torch.randn(9, 6, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    whole = int(region_fingerprint(full, ((0, 9), (0, 6))))
    parts = int(region_fingerprint(full[:4], ((0, 4), (0, 6)))) + int(region_fingerprint(full[4:], ((4, 9), (0, 6))))
    assert parts == whole
    swapped = full.clone()
    swapped[[0, 1]] = swapped[[1, 0]]
    assert int(region_fingerprint(swapped, ((0, 9), (0, 6)))) != whole


def test_arena_holds_aligned_tensors_and_leaves_no_file(tmp_path):
    offsets, nbytes = arena_offsets([(3, 5), (7,)], torch.bfloat16)
    assert offsets == [0, 64] and nbytes == 128  # 30 bytes, then 14 bytes, each from a 64-byte boundary
    arena = SharedArena.create(nbytes, rank=0, directory=str(tmp_path))
    assert not os.path.exists(arena.path) and not list(tmp_path.iterdir())
    arena.view(64, (7,), torch.bfloat16).fill_(2.0)
    assert arena.view(0, (3, 5), torch.bfloat16).abs().sum() == 0 and arena.view(64, (7,), torch.bfloat16).sum() == 14


def test_arena_too_large_for_its_directory_is_refused_with_the_way_out(tmp_path):
    with pytest.raises(SharedMemoryUnavailable, match="cannot hold .* rollout.weight_transfer=plan"):
        SharedArena.create(1 << 62, rank=0, directory=str(tmp_path))
    assert not list(tmp_path.iterdir())
