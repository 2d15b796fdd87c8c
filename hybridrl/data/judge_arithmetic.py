"""``arithmetic_judge``: judging answers to the arithmetic task — the data of the demo's LLM judge.

A prompt is a candidate answer, a question mark and the problem, ``"55?58+7="``; the judge replies with its own
answer, a colon and its verdict, ``"65:0"`` — ``1`` when the candidate is right, ``0`` when it is wrong. Working the
answer out first is what lets a tiny judge judge: comparing two numbers is easy, adding them in the same token is
not; and with the problem last, the answer follows ``=`` as in the task the judge was first trained on. The ground truth is the verdict (``data_source="arithmetic_judge"``, scored by the verdict after the colon); the
whole reply is the SFT target (``extra_info.answer``). A ``wrong_fraction`` share of the candidates is wrong, and
wrong the ways a policy is wrong: a sloppy annotator's carry-less sum (``"55?58+7="``), off by one, off by ten. The
splits are the arithmetic task's: a judge never sees a held-out problem, so it judges the policy's held-out answers
unseen.

The demo's judge (``conf/demo_judge_sft.yaml``) is the demo's GRPO checkpoint fine-tuned on this task; the
GRPO run of ``conf/demo_judge.yaml`` renders ``"{response}?{prompt}"`` — the same text — for every response.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from hybridrl.data.synthetic import SYNTHETIC_TASKS, ArithmeticTask, carry_less_sum

RIGHT, WRONG = "1", "0"


@SYNTHETIC_TASKS.register("arithmetic_judge")
@dataclass(frozen=True)
class ArithmeticJudgeTask(ArithmeticTask):
    """Arithmetic problems each with a candidate answer to judge right (``1``) or wrong (``0``)."""

    wrong_fraction: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 < self.wrong_fraction < 1.0:
            raise ValueError(f"arithmetic_judge task: wrong_fraction must be in (0, 1), got {self.wrong_fraction}")

    def _row(self, expression: str, answer: int, split: str, index: int) -> dict[str, Any]:
        rng = random.Random(f"hybridrl/arithmetic_judge/{split}/{self.seed}/{index}")
        candidate = wrong_answer(expression, answer, rng) if rng.random() < self.wrong_fraction else answer
        row = super()._row(expression, answer, split, index)
        verdict = RIGHT if candidate == answer else WRONG
        return {**row, "data_source": "arithmetic_judge",
                "prompt": [{"role": "user", "content": f"{candidate}?{expression}="}],
                "reward_model": {"style": "rule", "ground_truth": verdict},
                "extra_info": {**row["extra_info"], "candidate": candidate, "answer": f"{answer}:{verdict}"}}


def wrong_answer(expression: str, answer: int, rng: random.Random) -> int:
    """A plausible wrong answer: the carry-less sum where it differs, else off by one or by ten (never negative)."""
    if "+" in expression:
        first, second = (int(operand) for operand in expression.split("+"))
        if carry_less_sum(first, second) != answer and rng.random() < 0.5:
            return carry_less_sum(first, second)
    offsets = [offset for offset in (1, -1, 10, -10) if answer + offset >= 0]
    return answer + rng.choice(offsets)
