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


class RunClock:
    """ETA and cost of a run from its measured step times (the planner's roofline is the estimate before any step).

    The first step carries one-off costs (worker start, compilation, engine warm-up): once two steps are measured,
    the rate is taken from the second step on. ``mark(step)`` after each logged step returns
    ``time/elapsed_s``, ``time/seconds_per_step``, ``time/eta_s`` and, with a price, ``cost/so_far`` and
    ``cost/projected`` (price × devices × hours).

    Args:
        total_steps: the run's last step.
        start_step: the step the run starts from (a resumed run's checkpoint step).
        num_devices: devices the job holds (for the cost).
        price_per_gpu_hour: ``None``: no cost figures.
        clock: seconds, monotonic (``time.perf_counter``).
    """

    def __init__(self, total_steps: int, *, start_step: int = 0, num_devices: int = 1,
                 price_per_gpu_hour: float | None = None, clock=time.perf_counter) -> None:
        self.total_steps, self.start_step = total_steps, start_step
        self.num_devices, self.price_per_gpu_hour = num_devices, price_per_gpu_hour
        self._clock = clock
        self._started = clock()
        self._marks: list[tuple[int, float]] = []

    def seconds_per_step(self) -> float:
        """Mean seconds per step, excluding the first step once a later one is measured."""
        if len(self._marks) >= 2:
            (first_step, first_time), (last_step, last_time) = self._marks[0], self._marks[-1]
            return (last_time - first_time) / (last_step - first_step)
        step, when = self._marks[0]
        return (when - self._started) / (step - self.start_step)

    def mark(self, step: int) -> dict[str, float]:
        """Record that ``step`` just finished; ``{}`` for a step that is not new (e.g. validation before training)."""
        if step <= self.start_step or (self._marks and step <= self._marks[-1][0]):
            return {}
        now = self._clock()
        self._marks.append((step, now))
        per_step = self.seconds_per_step()
        elapsed, eta = now - self._started, per_step * max(0, self.total_steps - step)
        metrics = {"time/elapsed_s": elapsed, "time/seconds_per_step": per_step, "time/eta_s": eta}
        if self.price_per_gpu_hour is not None:
            rate = self.price_per_gpu_hour * self.num_devices / 3600
            metrics.update({"cost/so_far": rate * elapsed, "cost/projected": rate * (elapsed + eta)})
        return metrics


def format_duration(seconds: float) -> str:
    """``1h02m``, ``3m05s`` or ``42s``."""
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else (f"{minutes}m{secs:02d}s" if minutes else f"{secs}s")
