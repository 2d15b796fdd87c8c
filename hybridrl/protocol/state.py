"""A ``Batch`` as plain data for a weights-only checkpoint (tensors, lists of Python values, a dict) and back."""

from __future__ import annotations

from typing import Any

import numpy as np

from hybridrl.protocol.batch import Batch


def plain(value: Any) -> Any:
    """``value`` with numpy arrays and scalars (as parquet readers leave in ``extra_info``) turned into Python lists
    and numbers, recursively through dicts, lists and tuples."""
    if isinstance(value, np.ndarray):
        return [plain(item) for item in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


def batch_state(batch: Batch) -> dict[str, Any]:
    """``{"tensors": {name: Tensor}, "non_tensors": {name: list}, "meta": dict}`` — loadable with
    ``torch.load(weights_only=True)``: non-tensor values become plain Python (:func:`plain`)."""
    return {"tensors": dict(batch.tensors), "non_tensors": {name: [plain(value) for value in values]
                                                            for name, values in batch.non_tensors.items()},
            "meta": plain(dict(batch.meta))}


def batch_from_state(state: dict[str, Any]) -> Batch:
    """The ``Batch`` that :func:`batch_state` saved."""
    return Batch(state["tensors"], state["non_tensors"], state["meta"])
