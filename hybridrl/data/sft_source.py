"""Where SFT examples come from, step by step: the SFT trainer's batches and the PPO-ptx term's batches.

Step ``s`` with ``size`` examples takes examples ``s·size .. s·size + size − 1``: of the files' rows cycled in order,
or of a synthetic task's infinite SFT stream. A pure function of the step, so a resumed run needs no state to
continue with the same SFT data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

from hybridrl.data.io import read_rows
from hybridrl.data.sft import SFTExample, sft_examples_from_rows
from hybridrl.data.synthetic import build_synthetic_task

__all__ = ["SFTSource", "build_sft_source"]


@dataclass(frozen=True)
class SFTSource:
    """SFT examples from a fixed list (cycled) or from a synthetic ``task`` (its ``sft_examples(count, start)``)."""

    examples: Sequence[SFTExample] = ()
    task: Any = None

    def take(self, step: int, size: int) -> list[SFTExample]:
        """The ``size`` examples of step ``step`` (0-based)."""
        if self.task is not None:
            return self.task.sft_examples(size, start=step * size)
        return [self.examples[(step * size + offset) % len(self.examples)] for offset in range(size)]


def build_sft_source(train_files: Sequence[str], synthetic_task: Optional[str] = None,
                     synthetic_task_kwargs: Optional[dict[str, Any]] = None, seed: int = 1) -> SFTSource:
    """From ``train_files`` if any (every row, files in order), else the SFT view of ``synthetic_task``.

    Raises:
        ValueError: if neither is given, a file yields no rows, or the task has no SFT view.
    """
    if train_files:
        examples = []
        for path in train_files:
            rows = read_rows(path).rows
            examples += sft_examples_from_rows([row.row for row in rows], [row.where for row in rows])
        if not examples:
            raise ValueError(f"SFT files {list(train_files)} hold no rows")
        return SFTSource(examples=examples)
    if synthetic_task is None:
        raise ValueError("no SFT data: give SFT files or a synthetic task")
    task = build_synthetic_task(synthetic_task, seed=seed, **dict(synthetic_task_kwargs or {}))
    if not callable(getattr(task, "sft_examples", None)):
        raise ValueError(f"synthetic task {synthetic_task!r} has no SFT view (an sft_examples method)")
    return SFTSource(task=task)
