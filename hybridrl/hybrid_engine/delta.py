"""Delta weight sync: send only the values of a flat weight buffer that changed since the version the receiver holds.

At RL learning rates a step changes a small share of a model's bf16 values (the fp32 master weights move by less
than half a bf16 unit almost everywhere), so a publication can carry those values and their positions instead of the
whole buffer. The unit here is one flat buffer — what one trainer rank sends one replica rank per version (its rows
of every parameter, cast to the engine dtype: ``publish.py``) — so the codec sits below any transport.

- :class:`DeltaSender` (the writer's side) keeps the buffer it sent last and turns the next one into a
  :class:`DeltaFrame`: the whole buffer (``full``), or the changed positions with their new values, as ``int32``
  indices or as a bitmask, whichever is smaller. It sends the whole buffer when nothing was sent yet, when the delta
  would not be smaller than ``max_share`` of the whole, and every ``full_every`` versions.
- :class:`DeltaReceiver` (the reader's side) keeps the buffer it holds and applies a frame to it. A frame is made
  against one base version: applied to any other (a lost or repeated publication) it is refused, never merged.

"Changed" is decided on the bits (the buffer viewed as integers), so the receiver's buffer equals the sender's bit for
bit — ``-0.0`` against ``0.0`` and NaN payloads included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

KINDS = ("full", "indices", "mask")

_BITS_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass(frozen=True)
class DeltaFrame:
    """One version of a flat buffer, whole or as a delta against ``base_version``.

    ``kind``: ``full`` (``values`` is the buffer ``[numel]``), ``indices`` (``positions`` int32 ``[changed]``, sorted,
    and ``values`` ``[changed]``), or ``mask`` (``positions`` uint8 ``[ceil(numel / 8)]``, bit ``i % 8`` of byte
    ``i // 8`` set where value ``i`` changed, and ``values`` ``[changed]`` in position order).
    ``base_version``: the version a delta applies to (``None`` for ``full``)."""

    kind: str
    version: int
    base_version: Optional[int]
    numel: int
    values: torch.Tensor
    positions: Optional[torch.Tensor] = None

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data the frame carries (what a transport sends)."""
        extra = 0 if self.positions is None else self.positions.numel() * self.positions.element_size()
        return self.values.numel() * self.values.element_size() + extra


def _bits(buffer: torch.Tensor) -> torch.Tensor:
    """``buffer`` (1-D, contiguous) viewed as integers of its element size, to compare values bit for bit."""
    if buffer.dim() != 1 or not buffer.is_contiguous():
        raise ValueError(f"a delta buffer must be 1-D and contiguous, got shape {tuple(buffer.shape)}")
    return buffer.view(_BITS_VIEW[buffer.element_size()])


def changed_flags(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """bool ``[numel]``: where ``new``'s bits differ from ``old``'s (same numel and dtype)."""
    if old.shape != new.shape or old.dtype != new.dtype:
        raise ValueError(f"a delta needs the same buffer layout: {tuple(old.shape)} {old.dtype} against "
                         f"{tuple(new.shape)} {new.dtype}")
    return _bits(old) != _bits(new)


_BIT_WEIGHTS = (1, 2, 4, 8, 16, 32, 64, 128)


def pack_flags(flags: torch.Tensor) -> torch.Tensor:
    """bool ``[numel]`` as a bitmask: uint8 ``[ceil(numel / 8)]``, flag ``i`` at bit ``i % 8`` of byte ``i // 8``."""
    padded = flags.view(torch.uint8)
    if flags.numel() % 8:
        padded = torch.cat([padded, padded.new_zeros(8 - flags.numel() % 8)])
    weights = torch.tensor(_BIT_WEIGHTS, dtype=torch.uint8, device=flags.device)
    return (padded.view(-1, 8) * weights).sum(dim=1, dtype=torch.uint8)


def unpack_flags(mask: torch.Tensor, numel: int) -> torch.Tensor:
    """The bool ``[numel]`` flags :func:`pack_flags` packed into ``mask``."""
    weights = torch.tensor(_BIT_WEIGHTS, dtype=torch.uint8, device=mask.device)
    return ((mask.unsqueeze(1) & weights) != 0).flatten()[:numel]


def delta_nbytes(numel: int, changed: int, element_size: int) -> dict[str, int]:
    """Bytes each kind of frame would carry for a buffer of ``numel`` values of which ``changed`` differ."""
    return {"full": numel * element_size,
            "indices": changed * (4 + element_size),
            "mask": -(-numel // 8) + changed * element_size}


def encode_delta(old: torch.Tensor, new: torch.Tensor, version: int, base_version: int,
                 max_share: float = 0.5) -> DeltaFrame:
    """``new`` as the smallest frame against ``old`` (the buffer of ``base_version``); the whole buffer when no delta
    is under ``max_share`` of its bytes."""
    flags = changed_flags(old, new)
    sizes = delta_nbytes(new.numel(), int(torch.count_nonzero(flags)), new.element_size())
    kinds = ("indices", "mask") if new.numel() < 2 ** 31 else ("mask",)  # int32 positions
    kind = min(kinds, key=sizes.__getitem__)
    if sizes[kind] >= max_share * sizes["full"]:
        return DeltaFrame("full", version, None, new.numel(), new)
    positions = torch.nonzero(flags).flatten()  # (masked_select is ~15x slower on CPU)
    if kind == "indices":
        return DeltaFrame("indices", version, base_version, new.numel(), new[positions], positions.to(torch.int32))
    return DeltaFrame("mask", version, base_version, new.numel(), new[positions], pack_flags(flags))


def apply_delta(held: Optional[torch.Tensor], held_version: Optional[int], frame: DeltaFrame) -> torch.Tensor:
    """The buffer of ``frame.version``: ``frame``'s values written into ``held`` (in place) for a delta, the frame's
    own buffer for a whole one. Raises ``ValueError`` when the delta was made against another version than
    ``held_version`` or another layout than ``held``'s."""
    if frame.kind == "full":
        return frame.values
    if frame.kind not in KINDS:
        raise ValueError(f"unknown delta frame kind {frame.kind!r} (one of {KINDS})")
    if held is None or held_version != frame.base_version:
        raise ValueError(f"a weight delta of version {frame.version} is made against version {frame.base_version}, "
                         f"but this replica holds version {held_version}: a publication was lost or repeated")
    if held.numel() != frame.numel or held.dtype != frame.values.dtype:
        raise ValueError(f"a weight delta for {frame.numel} {frame.values.dtype} values does not fit the held buffer "
                         f"of {held.numel()} {held.dtype} values")
    if frame.kind == "indices":
        positions = frame.positions.long()
    else:
        positions = torch.nonzero(unpack_flags(frame.positions, frame.numel)).flatten()
    if positions.numel() != frame.values.numel():
        raise ValueError(f"a weight delta names {positions.numel()} positions for {frame.values.numel()} values")
    held[positions] = frame.values
    return held


class DeltaSender:
    """The writer's side for one flat buffer: remembers what it sent last (a copy: ``numel`` values) and encodes
    each new version against it. ``full_every``: a whole buffer at least every this many versions (``1``: always
    whole, delta off)."""

    def __init__(self, max_share: float = 0.5, full_every: int = 10) -> None:
        if not 0 < max_share <= 1:
            raise ValueError(f"max_share must be in (0, 1], got {max_share}")
        if full_every < 1:
            raise ValueError(f"full_every must be >= 1, got {full_every}")
        self.max_share, self.full_every = max_share, full_every
        self._sent: Optional[torch.Tensor] = None
        self._sent_version: Optional[int] = None
        self._since_full = 0

    def encode(self, buffer: torch.Tensor, version: int) -> DeltaFrame:
        """The frame that takes a receiver holding the last sent version to ``buffer`` (``version``). A whole frame
        holds ``buffer`` itself: do not change it before the frame is sent."""
        same_layout = self._sent is not None and self._sent.shape == buffer.shape and self._sent.dtype == buffer.dtype
        if not same_layout or self._since_full + 1 >= self.full_every:
            frame = DeltaFrame("full", version, None, buffer.numel(), buffer)
        else:
            frame = encode_delta(self._sent, buffer, version, self._sent_version, self.max_share)
        self._since_full = 0 if frame.kind == "full" else self._since_full + 1
        if same_layout:
            self._sent.copy_(buffer)
        else:
            self._sent = buffer.clone()
        self._sent_version = version
        return frame

    def forget(self) -> None:
        """Send the next version whole (a receiver restarted or was added)."""
        self._sent, self._sent_version, self._since_full = None, None, 0


class DeltaReceiver:
    """The reader's side for one flat buffer: the buffer it holds and its version."""

    def __init__(self) -> None:
        self.buffer: Optional[torch.Tensor] = None
        self.version: Optional[int] = None

    def receive(self, frame: DeltaFrame) -> torch.Tensor:
        """The buffer of ``frame.version`` (kept for the next frame; do not modify it). A whole frame's values are
        copied (they may be read-only, as a buffer from Ray's object store is)."""
        self.buffer = frame.values.clone() if frame.kind == "full" else apply_delta(self.buffer, self.version, frame)
        self.version = frame.version
        return self.buffer
