"""The :class:`Batch` container passed between the single controller and the worker groups."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from copy import deepcopy
from types import MappingProxyType
from typing import Any

import numpy as np
import torch
from torch import Tensor

from hybridrl.protocol.compare import merge_meta, tensors_equal, values_equal
from hybridrl.protocol.fields import TypedFieldsMixin
from hybridrl.protocol.indexing import (
    RowIndex,
    check_positive_int,
    normalize_rows,
    rows_as_tensor,
    rows_to_numpy,
)
from hybridrl.protocol.serialization import EncodedTensor, decode_tensor, encode_tensor


class Batch(TypedFieldsMixin):
    """Named per-sample fields sharing one batch dimension (dim 0), plus un-split ``meta``.

    - ``tensors``: ``name -> Tensor [B, ...]`` (any dtype, any device; all on dim 0 of size ``B``).
    - ``non_tensors``: ``name -> numpy object array [B]`` of per-sample Python values (strings, ids, dicts). Any
      sequence of length ``B`` is accepted and stored as a 1-D object array.
    - ``meta``: a plain dict of batch-level values (temperature, global token counts, ...) that every split, index
      and chunk carries whole. Each derived Batch holds its own shallow copy of it.

    Row operations (``batch[rows]``, ``chunk``, ``split``, ``unpad``) return *views* where the rows are a contiguous
    run, exactly like torch slicing; gathers (lists, masks, ``repeat_interleave``, ``reorder``) copy. Use
    :meth:`clone` for an independent deep copy. Canonical field names live in :class:`~hybridrl.protocol.Fields`,
    with typed accessors such as ``batch.responses`` (``[B, R]``).

    Pickling (Ray, multiprocessing) moves each tensor as one out-of-band buffer (pickle protocol 5); unpickled
    tensors are on CPU.
    """

    def __init__(
        self,
        tensors: Mapping[str, Tensor] | None = None,
        non_tensors: Mapping[str, Sequence[Any] | np.ndarray] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        if meta is not None and not isinstance(meta, Mapping):
            raise TypeError(f"meta must be a dict, got {type(meta).__name__}")
        both = sorted(set(tensors or {}) & set(non_tensors or {}))
        if both:
            raise ValueError(f"field {both[0]!r} is given both in tensors and in non_tensors")
        self._tensors: dict[str, Tensor] = {}
        self._non_tensors: dict[str, np.ndarray] = {}
        self._meta: dict[str, Any] = dict(meta or {})
        for key, value in (tensors or {}).items():
            if not isinstance(value, Tensor):
                raise TypeError(
                    f"tensors[{key!r}] is a {type(value).__name__}, not a torch.Tensor; "
                    "put per-sample Python values in non_tensors"
                )
            self[key] = value
        for key, value in (non_tensors or {}).items():
            if isinstance(value, Tensor):
                raise TypeError(f"non_tensors[{key!r}] is a torch.Tensor; put it in tensors")
            self[key] = value

    @classmethod
    def _from_fields(cls, tensors: dict[str, Tensor], non_tensors: dict[str, np.ndarray], meta: dict) -> Batch:
        """Build without validation from fields already known to agree (internal: derived batches)."""
        batch = cls.__new__(cls)
        batch._tensors, batch._non_tensors, batch._meta = tensors, non_tensors, dict(meta)
        return batch

    # ----------------------------------------------------------------------------------------------------------------
    # Mapping-like access
    # ----------------------------------------------------------------------------------------------------------------

    def __len__(self) -> int:
        """The batch size ``B``; 0 for a Batch without fields."""
        for tensor in self._tensors.values():
            return tensor.shape[0]
        for array in self._non_tensors.values():
            return len(array)
        return 0

    def keys(self) -> list[str]:
        """All field names: tensor fields first, then non-tensor fields, each in insertion order."""
        return [*self._tensors, *self._non_tensors]

    @property
    def tensors(self) -> Mapping[str, Tensor]:
        """Read-only view of the tensor fields (assign through ``batch[name] = tensor``)."""
        return MappingProxyType(self._tensors)

    @property
    def non_tensors(self) -> Mapping[str, np.ndarray]:
        """Read-only view of the non-tensor fields, each a numpy object array ``[B]``."""
        return MappingProxyType(self._non_tensors)

    @property
    def meta(self) -> dict[str, Any]:
        """Batch-level values that are never split; a plain dict owned by this Batch."""
        return self._meta

    def __contains__(self, key: object) -> bool:
        return key in self._tensors or key in self._non_tensors

    def __iter__(self) -> Iterator[Any]:
        raise TypeError("a Batch is not iterable; use batch.keys() for names, or chunk/split/index for rows")

    def __getitem__(self, key: Any) -> Any:
        """``batch["name"]``: the field (tensor or object array). Any other key selects rows, see :meth:`index`."""
        if isinstance(key, str):
            if key in self._tensors:
                return self._tensors[key]
            if key in self._non_tensors:
                return self._non_tensors[key]
            raise KeyError(self._missing_message(key))
        return self.index(key)

    def __setitem__(self, key: str, value: Any) -> None:
        """Add or replace a field: a ``Tensor [B, ...]`` is a tensor field, a sequence of ``B`` values a non-tensor."""
        if not isinstance(key, str):
            raise TypeError(f"field names are str, got {type(key).__name__}; rows cannot be assigned through indexing")
        if isinstance(value, Tensor):
            if value.ndim == 0:
                raise ValueError(f"tensor field {key!r} is 0-dimensional; fields need a batch dim, put scalars in meta")
            self._check_size(key, value.shape[0])
            self._non_tensors.pop(key, None)
            self._tensors[key] = value
        else:
            array = _to_object_array(key, value)
            self._check_size(key, len(array))
            self._tensors.pop(key, None)
            self._non_tensors[key] = array

    def _check_size(self, key: str, size: int) -> None:
        for other in self.keys():
            if other != key:
                other_size = len(self[other])
                if size != other_size:
                    raise ValueError(
                        f"field {key!r} has batch size {size} (dim 0), but field {other!r} has {other_size}"
                    )
                return

    def _typed_tensor(self, name: str) -> Tensor:
        if name in self._tensors:
            return self._tensors[name]
        if name in self._non_tensors:
            raise KeyError(f"field {name!r} is a non-tensor field here, expected a tensor")
        raise KeyError(self._missing_message(name))

    def _missing_message(self, key: str) -> str:
        return f"no field {key!r}; tensors: {list(self._tensors)}, non-tensors: {list(self._non_tensors)}"

    # ----------------------------------------------------------------------------------------------------------------
    # Field-wise operations (rows unchanged)
    # ----------------------------------------------------------------------------------------------------------------

    def select(self, *keys: str) -> Batch:
        """A Batch with only the named fields (tensor or non-tensor; storage shared), and a copy of ``meta``."""
        names = self._checked_keys("select", keys)
        return self._from_fields(
            {k: v for k, v in self._tensors.items() if k in names},
            {k: v for k, v in self._non_tensors.items() if k in names},
            self._meta,
        )

    def pop(self, *keys: str) -> Batch:
        """Remove the named fields from this Batch and return them as a new Batch (with a copy of ``meta``)."""
        popped = self.select(*keys)
        for key in popped.keys():
            self._tensors.pop(key, None)
            self._non_tensors.pop(key, None)
        return popped

    def _checked_keys(self, method: str, keys: tuple[Any, ...]) -> set[str]:
        if len(keys) == 1 and isinstance(keys[0], (list, tuple)):
            keys = tuple(keys[0])  # tolerate select(["a", "b"])
        if not keys:
            raise ValueError(f"{method} needs at least one field name")
        missing = [key for key in keys if key not in self]
        if missing:
            raise KeyError(f"{method}: " + self._missing_message(missing[0]))
        return set(keys)

    def union(self, other: Batch) -> Batch:
        """Fields of both batches in a new Batch (storage shared); ``meta`` is merged.

        Both must have the same batch size (unless one has no fields). A field present in both must be equal —
        tensors by dtype, shape and value (NaN equals NaN), non-tensors element-wise — else ``ValueError``; the same
        holds for a ``meta`` key present in both.
        """
        if not isinstance(other, Batch):
            raise TypeError(f"union expects a Batch, got {type(other).__name__}")
        if self.keys() and other.keys() and len(self) != len(other):
            raise ValueError(f"union of batches with different sizes: {len(self)} vs {len(other)}")
        tensors, non_tensors = dict(self._tensors), dict(self._non_tensors)
        for key, tensor in other._tensors.items():
            _check_union_field(key, self, tensor, key in self._tensors and tensors_equal(tensors[key], tensor))
            tensors[key] = tensors.get(key, tensor)
        for key, array in other._non_tensors.items():
            same = key in self._non_tensors and values_equal(non_tensors[key], array)
            _check_union_field(key, self, array, same)
            non_tensors[key] = non_tensors.get(key, array)
        return self._from_fields(tensors, non_tensors, merge_meta([self._meta, other._meta], "union"))

    def with_meta(self, **values: Any) -> Batch:
        """A Batch sharing this one's fields, with ``meta`` updated by ``values``."""
        return self._from_fields(dict(self._tensors), dict(self._non_tensors), {**self._meta, **values})

    # ----------------------------------------------------------------------------------------------------------------
    # Row operations
    # ----------------------------------------------------------------------------------------------------------------

    def index(self, positions: Any) -> Batch:
        """The rows named by ``positions``, as a Batch (``meta`` copied).

        ``positions`` may be an int (returns a Batch of **one** row, dims kept; negative counts from the end), a
        slice or range, a list / numpy array / tensor of ints (any order, repeats allowed), or a bool mask of ``B``
        entries. Slices give views; other kinds copy. ``batch[positions]`` is the same call.
        """
        return self._take(normalize_rows(positions, len(self)))

    def _take(self, rows: RowIndex) -> Batch:
        if isinstance(rows, slice):
            tensors = {k: t[rows] for k, t in self._tensors.items()}
        else:
            tensors = {k: t.index_select(0, rows.to(t.device)) for k, t in self._tensors.items()}
        numpy_rows = rows_to_numpy(rows)
        non_tensors = {k: a[numpy_rows] for k, a in self._non_tensors.items()}
        return self._from_fields(tensors, non_tensors, self._meta)

    def chunk(self, num_chunks: int) -> list[Batch]:
        """Split into ``num_chunks`` equal, contiguous Batches (views), e.g. one per data-parallel rank.

        Requires ``len(self) % num_chunks == 0``; otherwise pad first with :meth:`pad_to_multiple` and drop the padding
        from the gathered result with :meth:`unpad`.
        """
        num_chunks = check_positive_int("num_chunks", num_chunks)
        if len(self) % num_chunks:
            raise ValueError(
                f"cannot chunk a batch of {len(self)} rows into {num_chunks} equal parts; "
                f"use batch.pad_to_multiple({num_chunks}) first and unpad(pad_count) the result"
            )
        size = len(self) // num_chunks
        return [self._take(slice(i * size, (i + 1) * size, 1)) for i in range(num_chunks)]

    def split(self, sizes: Sequence[int]) -> list[Batch]:
        """Consecutive Batches (views) of the given sizes, which must be ints >= 0 summing to ``len(self)``."""
        sizes = list(sizes)
        if any(isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0 for s in sizes):
            raise ValueError(f"split sizes must be ints >= 0, got {sizes}")
        if sum(sizes) != len(self):
            raise ValueError(f"split sizes {sizes} sum to {sum(sizes)}, but the batch has {len(self)} rows")
        bounds = np.cumsum([0, *sizes]).tolist()
        return [self._take(slice(start, stop, 1)) for start, stop in zip(bounds[:-1], bounds[1:])]

    def split_every(self, size: int) -> list[Batch]:
        """Consecutive Batches (views) of ``size`` rows each, the last one shorter if ``size`` does not divide."""
        size = check_positive_int("size", size)
        full, rest = divmod(len(self), size)
        return self.split([size] * full + ([rest] if rest else []))

    def pad_to_multiple(self, multiple: int) -> tuple[Batch, int]:
        """Pad to a multiple of ``multiple`` rows by repeating rows from the start (cyclically, so it also works when
        ``len(self) < multiple``); returns ``(padded, pad_count)``. Without padding needed, a shallow copy and 0.

        The padded rows are real samples, so anything computed on them is valid but must be dropped with
        ``unpad(pad_count)`` before it is used (they would otherwise count twice).
        """
        multiple = check_positive_int("multiple", multiple)
        size = len(self)
        pad_count = -size % multiple
        if pad_count == 0:
            return self._take(slice(0, size, 1)), 0
        rows = torch.cat([torch.arange(size), torch.arange(pad_count) % size])
        return self._take(rows), pad_count

    def unpad(self, pad_count: int) -> Batch:
        """Drop the last ``pad_count`` rows (the inverse of :meth:`pad_to_multiple` after a gather); a view."""
        if isinstance(pad_count, bool) or not isinstance(pad_count, (int, np.integer)):
            raise TypeError(f"pad_count must be an int, got {type(pad_count).__name__}")
        if not 0 <= pad_count <= len(self):
            raise ValueError(f"pad_count must be in [0, {len(self)}], got {pad_count}")
        return self._take(slice(0, len(self) - int(pad_count), 1))

    @classmethod
    def concat(cls, batches: Sequence[Batch]) -> Batch:
        """Rows of all ``batches`` in order (copies), e.g. to gather worker outputs.

        All batches must have the same tensor and non-tensor field names, and each tensor field the same dtype,
        device and trailing shape. ``meta`` is the first batch's, extended by keys only later batches have; a key
        present in several batches must hold equal values in all of them, else ``ValueError`` (a per-shard value such
        as a worker's timing does not belong in meta).
        """
        batches = list(batches)
        if not batches:
            raise ValueError("Batch.concat needs at least one batch")
        for i, batch in enumerate(batches):
            if not isinstance(batch, Batch):
                raise TypeError(f"Batch.concat: item {i} is a {type(batch).__name__}, not a Batch")
        first = batches[0]
        for i, batch in enumerate(batches[1:], start=1):
            _check_same_fields(first, batch, i)
        tensors = {key: _cat_field(key, [b._tensors[key] for b in batches]) for key in first._tensors}
        non_tensors = {key: np.concatenate([b._non_tensors[key] for b in batches]) for key in first._non_tensors}
        return cls._from_fields(tensors, non_tensors, merge_meta([b._meta for b in batches], "concat"))

    def repeat_interleave(self, repeats: int) -> Batch:
        """Each row ``repeats`` times consecutively, ``[p0, p0, p1, p1, ...]`` (one prompt per ``rollout.n`` sample)."""
        repeats = check_positive_int("repeats", repeats)
        return self._take(torch.arange(len(self)).repeat_interleave(repeats))

    def reorder(self, indices: Any) -> Batch:
        """Rows in the order ``indices`` (a permutation of ``range(B)``: row ``i`` of the result is ``indices[i]``).

        Raises ``ValueError`` if ``indices`` is not a permutation; use :meth:`index` for a general gather.
        """
        rows = rows_as_tensor(normalize_rows(indices, len(self)), len(self))
        if rows.numel() != len(self) or not torch.equal(torch.sort(rows).values, torch.arange(len(self))):
            raise ValueError(f"reorder needs a permutation of range({len(self)}), got {rows.tolist()[:16]}")
        return self._take(rows)

    def permute(self, indices: Any) -> Batch:
        """Alias of :meth:`reorder`."""
        return self.reorder(indices)

    # ----------------------------------------------------------------------------------------------------------------
    # Device, memory, copies
    # ----------------------------------------------------------------------------------------------------------------

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """All tensor fields moved to ``device`` (no copy for tensors already there)."""
        tensors = {k: t.to(device, non_blocking=non_blocking) for k, t in self._tensors.items()}
        return self._from_fields(tensors, dict(self._non_tensors), self._meta)

    def cpu(self) -> Batch:
        """All tensor fields on CPU."""
        return self.to("cpu")

    def contiguous(self) -> Batch:
        """All tensor fields contiguous in memory (copies only those that are not)."""
        tensors = {k: t.contiguous() for k, t in self._tensors.items()}
        return self._from_fields(tensors, dict(self._non_tensors), self._meta)

    def clone(self) -> Batch:
        """A deep copy: tensors cloned, non-tensor values and ``meta`` deep-copied."""
        tensors = {k: t.clone() for k, t in self._tensors.items()}
        non_tensors = {k: deepcopy(a) for k, a in self._non_tensors.items()}
        return self._from_fields(tensors, non_tensors, deepcopy(self._meta))

    def __copy__(self) -> Batch:
        return self._from_fields(dict(self._tensors), dict(self._non_tensors), self._meta)

    def __deepcopy__(self, memo: dict) -> Batch:
        return self.clone()

    @property
    def nbytes(self) -> int:
        """Bytes held by the tensor fields (``numel * element_size``; non-tensors are not counted)."""
        return sum(t.numel() * t.element_size() for t in self._tensors.values())

    def __repr__(self) -> str:
        tensors = ", ".join(f"{k}: {list(t.shape)} {_dtype_name(t)}" for k, t in self._tensors.items())
        return (
            f"{type(self).__name__}(len={len(self)}, tensors={{{tensors}}}, "
            f"non_tensors={list(self._non_tensors)}, meta={list(self._meta)})"
        )

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickle tensors as numpy arrays so protocol 5 (and Ray) moves their memory out of band, without copies."""
        encoded = {k: encode_tensor(t) for k, t in self._tensors.items()}
        return _rebuild_batch, (type(self), encoded, self._non_tensors, self._meta)


def _dtype_name(tensor: Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def _rebuild_batch(
    cls: type[Batch], encoded: dict[str, EncodedTensor], non_tensors: dict[str, np.ndarray], meta: dict
) -> Batch:
    """Unpickling counterpart of :meth:`Batch.__reduce__`."""
    return cls({k: decode_tensor(v) for k, v in encoded.items()}, non_tensors, meta)


def _to_object_array(key: str, values: Any) -> np.ndarray:
    """``values`` (one per sample) as a 1-D numpy object array; a 1-D object array is kept as is."""
    if isinstance(values, np.ndarray):
        if values.ndim == 0:
            raise ValueError(f"non-tensor field {key!r} is a 0-dim array; put batch-level scalars in meta")
        if values.dtype == object and values.ndim == 1:
            return values
        return np.fromiter(values, dtype=object, count=len(values))
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Sequence):
        raise TypeError(
            f"non-tensor field {key!r} must be a sequence with one value per sample, got {type(values).__name__}"
        )
    return np.fromiter(values, dtype=object, count=len(values))


def _check_union_field(key: str, left: Batch, value: Any, equal: bool) -> None:
    if key not in left:
        return
    if isinstance(value, Tensor) != (key in left._tensors):
        raise ValueError(f"union: field {key!r} is a tensor in one batch and a non-tensor in the other")
    if not equal:
        raise ValueError(f"union: field {key!r} is present in both batches with different values")


def _check_same_fields(first: Batch, other: Batch, position: int) -> None:
    for kind, want, got in (
        ("tensor", first._tensors, other._tensors),
        ("non-tensor", first._non_tensors, other._non_tensors),
    ):
        if set(want) != set(got):
            missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
            raise ValueError(
                f"Batch.concat: batch {position} {kind} fields differ from batch 0's (missing {missing}, extra {extra})"
            )


def _cat_field(key: str, parts: list[Tensor]) -> Tensor:
    first = parts[0]
    for i, part in enumerate(parts[1:], start=1):
        if part.dtype != first.dtype or part.shape[1:] != first.shape[1:] or part.device != first.device:
            raise ValueError(
                f"Batch.concat: field {key!r} of batch {i} is {list(part.shape)} {part.dtype} on {part.device}, "
                f"batch 0 has {list(first.shape)} {first.dtype} on {first.device} "
                "(trailing dims, dtype and device must match)"
            )
    return torch.cat(parts, dim=0)
