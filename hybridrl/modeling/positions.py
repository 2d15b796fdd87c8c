"""Position ids of left-padded rows: the one convention every forward in hybridrl uses (padded, packed, grouped)."""

from __future__ import annotations

import torch


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` position ids counting only real tokens (0 at each row's first real token; pads get 0)."""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp_min(0)
