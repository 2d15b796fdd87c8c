"""Batched, parallel, fault-tolerant rule-based scoring: ``RewardScorer(...).score(...) -> (scores [B], info)``.

The trainer decodes responses to text and hands the scorer one batch of strings per step. Each sample is scored by
the reward function in a persistent worker process (:class:`~hybridrl.rewards.worker_pool.RewardWorkerPool`), so a
function that raises, hangs past ``timeout_s``, crashes its process, or returns NaN / a non-number scores **0** and is
counted in :class:`ScoreInfo` (and logged once per batch) — it never stops or hangs the run.

``num_workers=0`` scores in the calling process instead: fastest to debug (breakpoints work), but a hanging function
then hangs the caller, and math-verify's inner timeout only works on the main thread. Use it for tests and
debugging, not for training.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

import torch

from hybridrl.rewards.custom import RewardFunctionSource
from hybridrl.rewards.outcome import FAILURE_STATUSES, OK, ScoreOutcome, call_reward_fn
from hybridrl.rewards.registry import check_data_sources
from hybridrl.rewards.worker_pool import RewardWorkerPool

__all__ = ["RewardScorer", "ScoreInfo", "build_reward_scorer", "default_num_reward_workers"]

logger = logging.getLogger(__name__)


def default_num_reward_workers() -> int:
    """Worker processes used when none is given: the CPUs this process may use, at most 8, at least 1."""
    try:
        available = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        available = os.cpu_count() or 1
    return max(1, min(8, available))


@dataclass
class ScoreInfo:
    """What happened while scoring one batch of ``B`` samples.

    Attributes:
        statuses: per sample, ``"ok"`` or a failure status (``error``, ``invalid``, ``timeout``, ``crashed``).
        messages: one line per failed sample, ``"sample i (data_source=...): <status>: <why>"``.
        extras: per extra key a list of ``B`` values returned next to the score (``None`` where a sample had none).
    """

    statuses: list[str]
    messages: list[str] = field(default_factory=list)
    extras: dict[str, list[Any]] = field(default_factory=dict)

    def count(self, status: str) -> int:
        """Samples with the given status."""
        return sum(1 for item in self.statuses if item == status)

    @property
    def num_failed(self) -> int:
        """Samples that scored 0 because the reward function failed (any failure status)."""
        return sum(1 for item in self.statuses if item != OK)

    def scattered(self, positions: Sequence[int], size: int) -> "ScoreInfo":
        """This info of a subset of ``size`` samples, each at its ``positions`` entry; the others ``ok``, no extras;
        the messages name the samples by their positions."""
        statuses, extras = [OK] * size, {key: [None] * size for key in self.extras}
        for subset_index, position in enumerate(positions):
            statuses[position] = self.statuses[subset_index]
            for key, values in self.extras.items():
                extras[key][position] = values[subset_index]
        messages = [_renumbered(message, positions) for message in self.messages]
        return ScoreInfo(statuses, messages, extras)

    def metrics(self, prefix: str = "reward/") -> dict[str, float]:
        """Failure counts (``reward/num_error``, ``…/num_timeout``, ``…/num_invalid``, ``…/num_crashed``) and the
        mean of each numeric extra over the samples that returned it (``reward/acc``)."""
        metrics = {f"{prefix}num_{status}": float(self.count(status)) for status in FAILURE_STATUSES}
        for key, values in self.extras.items():
            numeric = [float(value) for value in values if isinstance(value, Real)]  # bools count as 0/1
            if numeric:
                metrics[f"{prefix}{key}"] = sum(numeric) / len(numeric)
        return metrics



REWARD_EXTRA_PREFIX = "reward_extra/"


def reward_extra(name: str) -> str:
    """The row field a trainer keeps the reward function's extra value ``name`` in (``acc`` of ``{"score": …,
    "acc": …}``)."""
    return REWARD_EXTRA_PREFIX + name


def _renumbered(message: str, positions: Sequence[int]) -> str:
    """``"sample i ..."`` of a subset as ``"sample positions[i] ..."``."""
    head, _, rest = message.partition(" ")
    number, space, tail = rest.partition(" ")
    if head != "sample" or not number.isdigit() or int(number) >= len(positions):
        return message
    return f"sample {positions[int(number)]}{space}{tail}"


class RewardScorer:
    """Scores batches of responses with one reward function, in parallel, with a per-sample timeout.

    Args:
        reward_fn: ``None`` or a :class:`RewardFunctionSource` without a path for the built-in functions routed by
            ``data_source``; a ``RewardFunctionSource(path, name)`` for a user's file; or a module-level function.
        timeout_s: per-sample limit in seconds (wall clock, from when a worker starts on the sample).
        num_workers: worker processes (started on first use, then reused); ``0`` scores in this process, without
            timeout protection. Default: :func:`default_num_reward_workers`.

    Use as a context manager, or call :meth:`close`, to stop the workers (they also stop with the process).
    """

    def __init__(
        self,
        reward_fn: RewardFunctionSource | Callable[..., Any] | None = None,
        *,
        timeout_s: float = 10.0,
        num_workers: int | None = None,
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"custom_reward_function.timeout_s must be > 0, got {timeout_s}")
        self.source = RewardFunctionSource() if reward_fn is None else reward_fn
        if isinstance(self.source, RewardFunctionSource):
            self._function = self.source.load()  # load here first, so a bad path/name fails now and clearly
        elif callable(self.source):
            self._function = self.source
        else:
            raise TypeError(f"reward_fn must be a RewardFunctionSource or a callable, got {type(reward_fn).__name__}")
        self.timeout_s = float(timeout_s)
        self.num_workers = default_num_reward_workers() if num_workers is None else int(num_workers)
        if self.num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        self._pool = RewardWorkerPool(self.source, self.num_workers) if self.num_workers > 0 else None

    @classmethod
    def from_config(cls, config: Any, *, num_workers: int | None = None) -> RewardScorer:
        """Build from a :class:`~hybridrl.config.schema.CustomRewardConfig` (``path``, ``name``, ``reward_kwargs``,
        ``timeout_s``)."""
        return cls(RewardFunctionSource.from_config(config), timeout_s=config.timeout_s, num_workers=num_workers)

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the running workers (empty before first use or with ``num_workers=0``)."""
        return self._pool.worker_pids if self._pool is not None else []

    def score(
        self,
        data_sources: Sequence[str],
        solution_strs: Sequence[str],
        ground_truths: Sequence[Any],
        extra_infos: Sequence[dict | None] | None = None,
    ) -> tuple[torch.Tensor, ScoreInfo]:
        """Score ``B`` responses.

        Args:
            data_sources, solution_strs, ground_truths: one per sample (``B`` each); ``solution_strs`` are the
                decoded responses (without the prompt).
            extra_infos: one dict (or ``None``) per sample; default ``None`` for all.

        Returns:
            ``(scores, info)``: ``scores`` is a float32 tensor ``[B]`` (0 where a sample failed); ``info`` counts
            failures and carries the extras (see :class:`ScoreInfo`).

        Raises:
            ValueError: if the sequences differ in length, or (built-in functions) a ``data_source`` is unknown.
        """
        tasks = self._tasks(data_sources, solution_strs, ground_truths, extra_infos)
        if self._pool is None:
            outcomes = [call_reward_fn(self._function, task) for task in tasks]
        else:
            outcomes = self._pool.run(tasks, self.timeout_s) if tasks else []
        return _summarize(outcomes, data_sources)

    def _tasks(self, data_sources, solution_strs, ground_truths, extra_infos) -> list[tuple[Any, ...]]:
        size = len(data_sources)
        if extra_infos is None:
            extra_infos = [None] * size
        lengths = {"data_sources": size, "solution_strs": len(solution_strs),
                   "ground_truths": len(ground_truths), "extra_infos": len(extra_infos)}
        if len(set(lengths.values())) != 1:
            raise ValueError(f"RewardScorer.score needs one value per sample in each argument, got lengths {lengths}")
        if isinstance(self.source, RewardFunctionSource) and self.source.is_builtin:
            check_data_sources(data_sources)
        for index, text in enumerate(solution_strs):
            if not isinstance(text, str):
                raise TypeError(f"solution_strs[{index}] is a {type(text).__name__}; decode responses to str first")
        return [tuple(sample) for sample in zip(data_sources, solution_strs, ground_truths, extra_infos)]

    def close(self) -> None:
        """Stop the worker processes (a later :meth:`score` starts new ones)."""
        if self._pool is not None:
            self._pool.close()

    def __enter__(self) -> RewardScorer:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def _summarize(outcomes: list[ScoreOutcome], data_sources: Sequence[str]) -> tuple[torch.Tensor, ScoreInfo]:
    scores = torch.tensor([outcome.score if outcome.status == OK else 0.0 for outcome in outcomes],
                          dtype=torch.float32)
    info = ScoreInfo(statuses=[outcome.status for outcome in outcomes])
    for index, outcome in enumerate(outcomes):
        if outcome.status != OK:
            info.messages.append(
                f"sample {index} (data_source={data_sources[index]!r}): {outcome.status}: {outcome.message}"
            )
        for key, value in outcome.extras.items():
            info.extras.setdefault(key, [None] * len(outcomes))[index] = value
    if info.messages:
        counts = {status: info.count(status) for status in FAILURE_STATUSES if info.count(status)}
        logger.warning("reward: %d of %d samples scored 0 because the reward function failed %s; first: %s",
                       info.num_failed, len(outcomes), counts, info.messages[0])
    return scores, info


def build_reward_scorer(custom_reward_function: Any, *, num_workers: int | None = None) -> RewardScorer:
    """The trainer's scorer from ``config.custom_reward_function`` (built-in functions when ``path`` is null)."""
    return RewardScorer.from_config(custom_reward_function, num_workers=num_workers)
