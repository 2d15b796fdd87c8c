"""Equality of field and meta values, used to decide whether two batches agree (``union``, ``concat``)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor


def tensors_equal(left: Tensor, right: Tensor) -> bool:
    """Same dtype, shape and values; NaN equals NaN (a field and its copy must compare equal)."""
    if left is right:
        return True
    if left.dtype != right.dtype or left.shape != right.shape:
        return False
    right = right.to(left.device)
    if torch.equal(left, right):
        return True
    if left.is_floating_point() or left.is_complex():
        return bool(torch.allclose(left, right, rtol=0.0, atol=0.0, equal_nan=True))
    return False


def values_equal(left: Any, right: Any) -> bool:
    """Structural equality for tensors, numpy arrays (object arrays element-wise), dicts, lists, tuples and scalars.

    Never raises: values that cannot be compared (``==`` raising or returning a non-bool) count as different.
    """
    if left is right:
        return True
    if isinstance(left, Tensor) or isinstance(right, Tensor):
        return isinstance(left, Tensor) and isinstance(right, Tensor) and tensors_equal(left, right)
    if isinstance(left, np.ndarray) or isinstance(right, np.ndarray):
        return _arrays_equal(left, right)
    if isinstance(left, Mapping) and isinstance(right, Mapping):
        return left.keys() == right.keys() and all(values_equal(left[k], right[k]) for k in left)
    if isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
        return type(left) is type(right) and _sequences_equal(left, right)
    if isinstance(left, float) and isinstance(right, float) and math.isnan(left) and math.isnan(right):
        return True
    try:
        return bool(left == right)
    except Exception:  # noqa: BLE001 - e.g. ambiguous truth value of a foreign array type
        return False


def merge_meta(metas: Sequence[Mapping[str, Any]], operation: str) -> dict[str, Any]:
    """The union of ``metas`` in order; a key present in several must have equal values, else ``ValueError``."""
    merged: dict[str, Any] = {}
    for position, meta in enumerate(metas):
        for key, value in meta.items():
            if key in merged and not values_equal(merged[key], value):
                raise ValueError(
                    f"{operation}: meta[{key!r}] disagrees between batches ({_short(merged[key])} vs "
                    f"{_short(value)} in batch {position}); meta holds batch-level values only"
                )
            merged.setdefault(key, value)
    return merged


def _arrays_equal(left: Any, right: Any) -> bool:
    if not (isinstance(left, np.ndarray) and isinstance(right, np.ndarray)) or left.shape != right.shape:
        return False
    if left.dtype == object or right.dtype == object:
        return _sequences_equal(left.ravel().tolist(), right.ravel().tolist())
    return bool(np.array_equal(left, right, equal_nan=left.dtype.kind in "fc" and right.dtype.kind in "fc"))


def _sequences_equal(left: Sequence[Any], right: Sequence[Any]) -> bool:
    return len(left) == len(right) and all(values_equal(a, b) for a, b in zip(left, right))


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
