"""One-step arithmetic word problems for chat models: a real task a 135M instruct model starts weak at, not hopeless.

Each problem is one sentence about a person and a count that goes up or down (*"Mia has 34 stickers and buys 27
more. How many stickers does Mia have now?"*); the model must read which way the count moves and do one two-digit
addition or subtraction. SmolLM2-135M-Instruct answers about 30 % of them right out of the box — it often
subtracts where the story adds — which leaves room for RL to show on **held-out** problems.

Rows use verl's schema with a chat prompt (``prompt = [{"role": "user", "content": ...}]``), ``data_source =
"arithmetic_word_problems"`` (scored like GSM8K: the number after ``####``, else the last number —
:mod:`hybridrl.rewards.gsm8k`) and ``reward_model.ground_truth`` the answer. Training and held-out problems are
disjoint by construction: a fixed hash of the problem's wording puts ``val_fraction`` of all problems in the held-out
bucket, and the training stream redraws any problem that falls there. Row ``i`` of either stream is a pure function
of ``(seed, i)``: the files are the same on every machine.

    python -m hybridrl.data.preprocess word-problems --output data/word_problems
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["WORD_PROBLEMS_DATA_SOURCE", "WordProblems"]

WORD_PROBLEMS_DATA_SOURCE = "arithmetic_word_problems"
INSTRUCTION = "Answer with just the number."
_NAMES = ("Mia", "Tom", "Ava", "Leo", "Zoe", "Sam", "Ivy", "Max", "Lily", "Ben", "Emma", "Noah")
_THINGS = ("apples", "stickers", "marbles", "books", "coins", "pencils", "cards", "shells")
_MORE = ("buys {b} more", "finds {b} more", "gets {b} more from a friend", "wins {b} more")
_FEWER = ("gives away {b}", "loses {b}", "sells {b}", "gives {b} to a friend")
_SPLIT_SALT = "hybridrl/word_problems/split/v1"


@dataclass(frozen=True)
class WordProblems:
    """The task (see the module docstring): ``max_operand`` bounds both counts (the second is at least 2)."""

    seed: int = 1
    max_operand: int = 20
    val_fraction: float = 0.1

    def problem(self, rng: random.Random) -> tuple[str, int]:
        """One problem's text (with the answer instruction) and its answer."""
        name, thing = rng.choice(_NAMES), rng.choice(_THINGS)
        first, second = rng.randint(min(10, self.max_operand - 1), self.max_operand), rng.randint(2, self.max_operand)
        if rng.random() < 0.5:
            change, answer = rng.choice(_MORE), first + second
        else:
            second = min(second, first - 1)
            change, answer = rng.choice(_FEWER), first - second
        story = f"{name} has {first} {thing} and {change.format(b=second)}."
        return f"{story} How many {thing} does {name} have now? {INSTRUCTION}", answer

    def held_out(self, text: str) -> bool:
        """Whether ``text`` is in the held-out bucket (fixed: independent of ``seed``)."""
        digest = hashlib.sha256(f"{_SPLIT_SALT}/{text}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < self.val_fraction

    def rows(self, split: str, count: int) -> list[dict[str, Any]]:
        """The first ``count`` rows of ``split`` (``train``: the training stream; ``val``: distinct held-out
        problems)."""
        rows, seen = [], set()
        for text, answer in self._stream(split):
            if split == "val" and text in seen:
                continue
            seen.add(text)
            rows.append({"data_source": WORD_PROBLEMS_DATA_SOURCE, "prompt": [{"role": "user", "content": text}],
                         "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(answer)},
                         "extra_info": {"split": split, "index": len(rows)}})
            if len(rows) == count:
                return rows
        raise AssertionError("unreachable: the stream is infinite")  # pragma: no cover

    def _stream(self, split: str) -> Iterator[tuple[str, int]]:
        rng = random.Random(f"{self.seed}/{split}")
        while True:
            text, answer = self.problem(rng)
            if self.held_out(text) == (split == "val"):
                yield text, answer
