"""Shared builders for the algorithm tests: ragged response masks and random per-token tensors."""

from __future__ import annotations

import pytest
import torch


def build_ragged_mask(
    batch: int, length: int, generator: torch.Generator, holes: bool = False, edge_rows: bool = True
) -> torch.Tensor:
    """A right-padded 0/1 float mask ``[batch, length]`` with random lengths in ``[0, length]``.

    With ``edge_rows`` (and room for them) row 0 has a length-1 response and row 1 is fully masked, so every test
    sees both edge cases. With ``holes`` some valid tokens are also masked mid-response (multi-turn observations).
    """
    lengths = torch.randint(0, length + 1, (batch,), generator=generator)
    if edge_rows and batch >= 3 and length >= 1:
        lengths[0], lengths[1] = 1, 0
    mask = (torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)).float()
    if holes:
        mask = mask * (torch.rand(batch, length, generator=generator) > 0.25).float()
    return mask


@pytest.fixture(scope="session")
def ragged_mask():
    """The :func:`build_ragged_mask` builder (session-scoped, so hypothesis tests may use it)."""
    return build_ragged_mask
