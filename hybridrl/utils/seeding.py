"""Deterministic seeds derived from several parts (run seed, step, rank, ...) without collisions.

``seed + 1000 * rank`` style offsets collide (step 1000 of rank 0 = step 0 of rank 1); hashing the parts does not.
"""

from __future__ import annotations

import hashlib


def derive_seed(*parts: object) -> int:
    """A 31-bit seed that is a pure function of ``parts`` (ints or strings), e.g. ``derive_seed(seed, step, rank)``."""
    digest = hashlib.sha256("/".join(str(part) for part in parts).encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF
