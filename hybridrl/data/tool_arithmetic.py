"""``tool_arithmetic``: two-digit multiplication, which a tiny model cannot do in its head but can with a calculator.

Prompts are ``"37*58="`` (``data_source="arithmetic"``: the arithmetic reward scores the final answer exactly). The
SFT view is a set of *imperfect demonstrations* as conversations: a share ``sft_tool_rate`` of them calls the
calculator in the Hermes format and copies its result; the rest are a sloppy annotator's mental estimates (the
product rounded to tens, right only when it ends in 0). SFT therefore teaches the format but uses the tool only
part of the time; RL with the agent loop (``rollout.multi_turn``) learns that calling it pays.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from hybridrl.data.sft import SFTExample
from hybridrl.data.synthetic import SYNTHETIC_TASKS, ArithmeticTask

TOOL_NAME = "calculator"


def tool_call_text(expression: str) -> str:
    """The model's tool call, exactly as ``hybridrl.agents.tools.format_tool_call`` writes it."""
    call = json.dumps({"name": TOOL_NAME, "arguments": {"expression": expression}})
    return f"<tool_call>\n{call}\n</tool_call>"


@SYNTHETIC_TASKS.register("tool_arithmetic")
@dataclass(frozen=True)
class ToolArithmeticTask(ArithmeticTask):
    """Multiplication of two operands in ``[min_operand, max_operand]`` (the arithmetic task's splits and rows)."""

    operators: str = "*"
    min_operand: int = 10
    max_operand: int = 99
    sft_tool_rate: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.min_operand <= self.max_operand:
            raise ValueError(f"tool_arithmetic task: need 0 <= min_operand <= max_operand, got {self.min_operand}, "
                             f"{self.max_operand}")
        if not 0.0 <= self.sft_tool_rate <= 1.0:
            raise ValueError(f"tool_arithmetic task: sft_tool_rate must be in [0, 1], got {self.sft_tool_rate}")

    def _operand(self, rng: random.Random, maximum: int | None) -> int:
        return rng.randint(self.min_operand, self.max_operand)

    def sft_examples(self, num_examples: int | None = None, start: int = 0) -> list[SFTExample]:
        """Conversations: the prompt, then the demonstration's turns (see the module docstring)."""
        return [self._demonstration(row) for row in self.train_rows(num_examples, start)]

    def _demonstration(self, row: dict[str, Any]) -> SFTExample:
        expression, index = row["extra_info"]["expression"], row["extra_info"]["index"]
        answer = row["reward_model"]["ground_truth"]
        rng = random.Random(f"hybridrl/tool_arithmetic/demo/{self.seed}/{index}")
        if rng.random() < self.sft_tool_rate:
            turns = ({"role": "assistant", "content": tool_call_text(expression)},
                     {"role": "tool", "content": answer}, {"role": "assistant", "content": answer})
        else:
            estimate = str(round(int(answer), -1))
            turns = ({"role": "assistant", "content": estimate},)
        return SFTExample(prompt=row["prompt"], response=turns[-1]["content"], turns=turns)
