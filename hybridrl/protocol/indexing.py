"""Turning the many ways to name rows (int, slice, list, numpy array, tensor, bool mask) into one canonical form.

The canonical form is either a ``slice`` with a positive step (so tensors are sliced as views, no copy) or a 1-D int64
CPU tensor of non-negative row numbers (a gather, which copies).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Union

import numpy as np
import torch
from torch import Tensor

RowIndex = Union[slice, Tensor]
"""A ``slice`` with ``step > 0`` and bounds within ``[0, B]``, or an int64 CPU tensor ``[K]`` of rows in ``[0, B)``."""


def normalize_rows(positions: Any, length: int) -> RowIndex:
    """Canonicalise ``positions`` for a batch of ``length`` rows.

    Accepted: a Python/numpy int (one row, kept as a batch of 1; negative counts from the end), a ``slice`` or
    ``range``, a list/tuple/numpy array/tensor of ints (any order, repeats allowed, negatives count from the end), or a
    bool mask of exactly ``length`` entries. Raises ``TypeError`` for other kinds (floats, bare bools),
    ``IndexError`` for rows out of range and ``ValueError`` for a mask of the wrong length or a multi-dimensional index.
    """
    if isinstance(positions, (bool, np.bool_)):
        raise TypeError("a bare bool is not a row index; use a bool mask with one entry per row")
    if isinstance(positions, (int, np.integer)):
        return _single_row(int(positions), length)
    if isinstance(positions, slice):
        start, stop, step = positions.indices(length)
        if step > 0:
            return slice(start, max(start, stop), step)
        return torch.arange(start, stop, step, dtype=torch.int64)  # torch cannot view with a negative step
    index = _as_index_tensor(positions)
    if index.ndim == 0:
        if index.dtype == torch.bool or index.is_floating_point() or index.is_complex():
            raise TypeError(f"a 0-dim {index.dtype} tensor is not a row index")
        return _single_row(int(index), length)
    if index.ndim != 1:
        raise ValueError(f"row index must be 1-D, got shape {list(index.shape)}")
    if index.dtype == torch.bool:
        if index.numel() != length:
            raise ValueError(f"bool mask has {index.numel()} entries but the batch has {length} rows")
        return index.nonzero().flatten()
    if index.is_floating_point() or index.is_complex():
        raise TypeError(f"row index must hold integers or bools, got dtype {index.dtype}")
    return _checked_rows(index.to(torch.int64), length)


def rows_to_numpy(rows: RowIndex) -> slice | np.ndarray:
    """The same rows in a form that indexes a numpy (object) array."""
    return rows if isinstance(rows, slice) else rows.numpy()


def rows_as_tensor(rows: RowIndex, length: int) -> Tensor:
    """Explicit row numbers ``[K]`` int64, expanding a slice."""
    if isinstance(rows, slice):
        return torch.arange(length, dtype=torch.int64)[rows]
    return rows


def check_positive_int(name: str, value: Any) -> int:
    """``value`` as an int >= 1, else a ``ValueError``/``TypeError`` naming the argument."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return int(value)


def _single_row(row: int, length: int) -> slice:
    if not -length <= row < length:
        raise IndexError(f"row {row} is out of range for a batch of {length} rows")
    row %= length
    return slice(row, row + 1, 1)


def _as_index_tensor(positions: Any) -> Tensor:
    if isinstance(positions, Tensor):
        return positions.detach().cpu()
    if isinstance(positions, range):
        return torch.tensor(positions, dtype=torch.int64)
    if isinstance(positions, np.ndarray):
        if positions.dtype == object:
            raise TypeError("row index must hold integers or bools, got a numpy object array")
        return torch.from_numpy(np.ascontiguousarray(positions))
    if isinstance(positions, Sequence) and not isinstance(positions, (str, bytes)):
        if len(positions) == 0:
            return torch.empty(0, dtype=torch.int64)
        return torch.from_numpy(np.asarray(positions))
    raise TypeError(
        f"cannot index rows with {type(positions).__name__}; use an int, slice, list, numpy array, tensor or bool mask"
    )


def _checked_rows(index: Tensor, length: int) -> Tensor:
    if index.numel() == 0:
        return index
    low, high = int(index.min()), int(index.max())
    if low < -length or high >= length:
        bad = low if low < -length else high
        raise IndexError(f"row {bad} is out of range for a batch of {length} rows")
    return torch.where(index < 0, index + length, index)
