"""Synthetic verifiable tasks: prompts generated from a seed, each with an exactly checkable answer.

They let the whole RL loop run — and visibly learn — on a tiny model with the character tokenizer
(:func:`hybridrl.utils.tiny_model.build_char_tokenizer`), with no data files. A task produces rows in the same
schema as the file datasets (:mod:`hybridrl.data.records`), so loaders, rewards and logging treat both alike.

``arithmetic`` (:class:`ArithmeticTask`)
    Problems ``"<a><op><b>="`` such as ``"23+45="`` with ground truth ``"68"``; ``data_source="arithmetic"``,
    scored by exact numeric match (:mod:`hybridrl.rewards.arithmetic`). Each operand has ``min_digits`` to
    ``max_digits`` digits (the digit count is drawn first, so short numbers are not rare); operators come from
    ``operators`` (any of ``+ - * /``); ``max_first_operand`` / ``max_second_operand``, when set, draw that operand
    uniformly from ``0..max`` instead (the demo uses ``0..29 + 0..9``: learnable by a tiny model in minutes). Subtraction swaps operands to stay non-negative unless ``allow_negative``;
    division is always exact (``a = b × q``, ``b ≥ 1``). Every character is in the char tokenizer's vocabulary.

    - **Training stream**: row ``i`` is a pure function of ``(seed, i)`` — :meth:`~ArithmeticTask.train_row` — so
      the stream is infinite, reproducible and random-access (:meth:`~ArithmeticTask.iter_train_rows`);
      :meth:`~ArithmeticTask.train_rows` takes its first ``num_train`` rows for a loader's epoch. Problems may repeat.
    - **Held-out set**: :meth:`~ArithmeticTask.validation_rows`, ``num_val`` distinct problems. Train and
      validation are disjoint *by construction*: a fixed hash of the problem text puts a ``val_fraction`` share of
      the problem space in the held-out bucket; the training stream redraws any problem in that bucket. The bucket
      and the held-out set do not depend on ``seed``, so validation scores compare across runs.
    - **SFT view**: :meth:`~ArithmeticTask.sft_examples` — (prompt, response) pairs whose response is the answer,
      to warm-start a tiny model (:mod:`hybridrl.data.sft`). ``sft_drop_carry_rate`` makes these demonstrations
      *imperfect*, as real ones are: that share of the addition demonstrations comes from a sloppy annotator who
      adds digit by digit and forgets every carry (``"58+7="`` → ``"55"``, not ``"65"``). SFT then learns the carry
      only half-heartedly; RL with the exact-match reward is what makes it reliable — the demo's point. The RL
      stream and the held-out set are never noisy.

Add a task: subclass nothing — write a class with the same methods and ``@SYNTHETIC_TASKS.register("name")`` it;
``data.synthetic_task=name`` then selects it (:func:`build_synthetic_task`).
"""

from __future__ import annotations

import difflib

import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from hybridrl.data.sft import SFTExample, sft_examples_from_rows
from hybridrl.utils.registry import Registry

__all__ = ["SYNTHETIC_TASKS", "ArithmeticTask", "build_synthetic_task", "carry_less_sum"]

SYNTHETIC_TASKS: Registry[type] = Registry("synthetic task")

_OPERATORS = "+-*/"
_SPLIT_SALT = "hybridrl/arithmetic/split/v1"  # changing it reshuffles which problems are held out
_VAL_SEED = "hybridrl/arithmetic/val/v1"


@SYNTHETIC_TASKS.register("arithmetic")
@dataclass(frozen=True)
class ArithmeticTask:
    """Integer arithmetic problems with exact answers (see the module docstring)."""

    seed: int = 1
    min_digits: int = 1
    max_digits: int = 2
    operators: str = "+-"
    allow_negative: bool = False
    num_train: int = 8192
    num_val: int = 256
    val_fraction: float = 0.1
    max_first_operand: int | None = None
    max_second_operand: int | None = None
    sft_drop_carry_rate: float = 0.0

    def __post_init__(self) -> None:
        if not 1 <= self.min_digits <= self.max_digits <= 9:
            raise ValueError(f"arithmetic task: need 1 <= min_digits <= max_digits <= 9, got min_digits="
                             f"{self.min_digits}, max_digits={self.max_digits}")
        if not self.operators or any(op not in _OPERATORS for op in self.operators):
            raise ValueError(f"arithmetic task: operators={self.operators!r} must be a non-empty string of "
                             f"{_OPERATORS!r}")
        if not 0.0 <= self.sft_drop_carry_rate <= 1.0:
            raise ValueError(f"arithmetic task: sft_drop_carry_rate must be in [0, 1], got {self.sft_drop_carry_rate}")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"arithmetic task: val_fraction must be in (0, 1), got {self.val_fraction}")
        for name in ("max_first_operand", "max_second_operand"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"arithmetic task: {name} must be null or >= 1, got {getattr(self, name)}")
        for name in ("num_train", "num_val"):
            if getattr(self, name) < 1:
                raise ValueError(f"arithmetic task: {name} must be >= 1, got {getattr(self, name)}")

    # ------------------------------------------------------------------------------------------------ problems
    def _operand(self, rng: random.Random, maximum: int | None) -> int:
        if maximum is not None:
            return rng.randint(0, maximum)
        digits = rng.randint(self.min_digits, self.max_digits)
        return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)

    def _draw_problem(self, rng: random.Random) -> tuple[str, int]:
        """``(expression, answer)``, e.g. ``("23+45", 68)``."""
        operator = rng.choice(self.operators)
        first, second = self._operand(rng, self.max_first_operand), self._operand(rng, self.max_second_operand)
        if operator == "+":
            return f"{first}+{second}", first + second
        if operator == "-":
            if not self.allow_negative and first < second:
                first, second = second, first
            return f"{first}-{second}", first - second
        if operator == "*":
            return f"{first}*{second}", first * second
        divisor = max(second, 1)
        return f"{first * divisor}/{divisor}", first

    def is_held_out(self, expression: str) -> bool:
        """True if ``expression`` (``"23+45"``) belongs to the validation bucket (a fixed hash of the text)."""
        digest = hashlib.sha256(f"{_SPLIT_SALT}:{expression}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < self.val_fraction

    def _row(self, expression: str, answer: int, split: str, index: int) -> dict[str, Any]:
        return {
            "data_source": "arithmetic",
            "prompt": [{"role": "user", "content": f"{expression}="}],
            "ability": "arithmetic",
            "reward_model": {"style": "rule", "ground_truth": str(answer)},
            "extra_info": {"split": split, "index": index, "expression": expression},
        }

    # ---------------------------------------------------------------------------------------------- the splits
    def train_row(self, index: int) -> dict[str, Any]:
        """Row ``index`` of the training stream: a pure function of ``(seed, index)``, never a held-out problem."""
        rng = random.Random(f"hybridrl/arithmetic/train/{self.seed}/{index}")
        for _ in range(10_000):
            expression, answer = self._draw_problem(rng)
            if not self.is_held_out(expression):
                return self._row(expression, answer, "train", index)
        raise ValueError(f"arithmetic task: could not draw a training problem outside the held-out bucket "
                         f"(val_fraction={self.val_fraction} leaves too few problems)")

    def iter_train_rows(self, start: int = 0) -> Iterator[dict[str, Any]]:
        """The infinite training stream from row ``start`` on."""
        index = start
        while True:
            yield self.train_row(index)
            index += 1

    def train_rows(self, num_rows: int | None = None, start: int = 0) -> list[dict[str, Any]]:
        """Rows ``start .. start + num_rows - 1`` of the stream (default ``num_train`` rows)."""
        count = self.num_train if num_rows is None else num_rows
        return [self.train_row(index) for index in range(start, start + count)]

    def validation_rows(self) -> list[dict[str, Any]]:
        """The held-out set: ``num_val`` distinct problems from the validation bucket, the same for every seed."""
        rng = random.Random(_VAL_SEED)
        seen: set[str] = set()
        rows: list[dict[str, Any]] = []
        for _ in range(200 * self.num_val):
            expression, answer = self._draw_problem(rng)
            if expression in seen or not self.is_held_out(expression):
                continue
            seen.add(expression)
            rows.append(self._row(expression, answer, "val", len(rows)))
            if len(rows) == self.num_val:
                return rows
        raise ValueError(
            f"arithmetic task: only {len(rows)} distinct held-out problems found, num_val={self.num_val} asked; "
            "lower num_val, or widen the problem space (more digits or operators, a larger val_fraction)"
        )

    def sft_examples(self, num_examples: int | None = None, start: int = 0) -> list[SFTExample]:
        """Training-stream prompts paired with their answers as the target response.

        The answer is exact, except that a ``sft_drop_carry_rate`` share of additions (drawn per example from
        ``(seed, index)``) carries the sloppy annotator's carry-less sum instead (:func:`carry_less_sum`).
        """
        rows = self.train_rows(num_examples, start)
        if self.sft_drop_carry_rate > 0.0:
            rows = [self._sloppy_annotation(row) for row in rows]
        return sft_examples_from_rows(rows)

    def _sloppy_annotation(self, row: dict[str, Any]) -> dict[str, Any]:
        expression, index = row["extra_info"]["expression"], row["extra_info"]["index"]
        rng = random.Random(f"hybridrl/arithmetic/sft-noise/{self.seed}/{index}")
        if "+" not in expression or rng.random() >= self.sft_drop_carry_rate:
            return row
        first, second = (int(operand) for operand in expression.split("+"))
        return {**row, "reward_model": {**row["reward_model"], "ground_truth": str(carry_less_sum(first, second))}}


def carry_less_sum(first: int, second: int) -> int:
    """Digit-by-digit sum with every carry dropped: ``carry_less_sum(58, 7) == 55``, ``carry_less_sum(95, 17) == 2``."""
    result, place = 0, 1
    while first or second:
        result += (first % 10 + second % 10) % 10 * place
        first, second, place = first // 10, second // 10, place * 10
    return result


def build_synthetic_task(name: str, *, seed: int = 1, **options: Any) -> Any:
    """The registered task ``name`` built with ``seed`` and task-specific ``options``.

    Raises:
        ValueError: naming ``data.synthetic_task`` and the valid names if ``name`` is unknown.
    """
    if name not in SYNTHETIC_TASKS:
        raise ValueError(f"data.synthetic_task={name!r} is unknown; valid names: {', '.join(SYNTHETIC_TASKS.names())}")
    task = SYNTHETIC_TASKS[name]
    _check_options(name, task, options)
    try:
        return task(seed=seed, **options)
    except TypeError as error:  # a value of the wrong kind reached the task's own checks
        raise ValueError(f"data.synthetic_task_kwargs: {error} (task {name!r})") from None


def _check_options(name: str, task: Any, options: dict[str, Any]) -> None:
    """Every option must be one of the task's fields, of its type (an int where an int is expected, …)."""
    import dataclasses
    import typing

    if not dataclasses.is_dataclass(task):
        return
    hints = typing.get_type_hints(task)
    fields = [field.name for field in dataclasses.fields(task) if field.name != "seed"]
    for key, value in options.items():
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"data.synthetic_task_kwargs.{key}={value!r}: task {name!r} has no such option{hint}; "
                             f"its options: {', '.join(fields)}")
        expected = tuple(kind for kind in typing.get_args(hints[key]) or (hints[key],) if isinstance(kind, type))
        if float in expected:
            expected += (int,)
        if expected and not isinstance(value, expected) or isinstance(value, bool) and bool not in expected:
            kinds = " or ".join(kind.__name__ for kind in expected if kind is not type(None)) or "null"
            raise ValueError(f"data.synthetic_task_kwargs.{key}={value!r}: must be {kinds}")
