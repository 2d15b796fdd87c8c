"""Wall-clock timing of a step's phases (generate, reward, log-probs, updates, sync), reported as metrics."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator


class PhaseTimer:
    """Accumulates seconds per named phase; ``metrics()`` gives ``timing/<phase>`` and ``timing/step`` (their sum)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started

    def total(self) -> float:
        return sum(self.seconds.values())

    def metrics(self) -> dict[str, float]:
        return {**{f"timing/{name}": value for name, value in self.seconds.items()}, "timing/step": self.total()}
