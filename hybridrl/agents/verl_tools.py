"""hybridrl's equivalents of verl's tool classes, so verl's tool config files run unchanged (``tool_config.py``).

- ``verl.tools.gsm8k_tool.Gsm8kTool`` → :class:`Gsm8kAnswerCheck`: the model submits an answer, the tool says
  whether it is right (hybridrl's GSM8K scorer on ``#### <answer>``) and pays the turn verl's step reward: 0 when
  the answer's score rose, -0.05 otherwise (a nudge against resubmitting). The episode's outcome reward still comes
  from the row's reward function on the final answer.
- ``verl.tools.sandbox_fusion_tools.SandboxFusionTool`` → :class:`LocalCodeInterpreter`: the code runs in
  hybridrl's local sandbox (``rewards/sandbox.py``: a subprocess with CPU, memory and wall limits), not on the
  remote SandboxFusion service — its ``sandbox_fusion_url`` is not contacted; ``default_timeout`` bounds a run.
"""

from __future__ import annotations

from typing import Any, Optional

from hybridrl.agents.builtin_tools import run_python_program, sandbox_timeout
from hybridrl.agents.tool_config import timeout_of
from hybridrl.agents.tools import ToolResult
from hybridrl.rewards.gsm8k import compute_score

__all__ = ["Gsm8kAnswerCheck", "LocalCodeInterpreter", "NO_PROGRESS_PENALTY"]

NO_PROGRESS_PENALTY = -0.05
"""verl's step reward for an answer that scores no higher than the one before."""


class Gsm8kAnswerCheck:
    """One episode's answer checker. ``ground_truth``: the row's answer (``tools_kwargs.<name>.create_kwargs``)."""

    def __init__(self, config: dict, ground_truth: Optional[Any] = None, **_: Any) -> None:
        if ground_truth is None:
            raise ValueError("the row gives no ground_truth (extra_info.tools_kwargs.<tool>.create_kwargs)")
        self.ground_truth, self.best = ground_truth, 0.0

    def __call__(self, answer: Any) -> ToolResult:
        text = str(answer)
        marked = text if text.lstrip().startswith("####") else f"#### {text}"
        score = compute_score("openai/gsm8k", marked, self.ground_truth)["score"]
        step_reward = 0.0 if score > self.best else NO_PROGRESS_PENALTY
        self.best = max(self.best, score)
        return ToolResult(f"Current parsed answer={text!r} reward={score:g}", step_reward)


class LocalCodeInterpreter:
    """Runs the model's ``code`` in the local sandbox, killed a little before the tool's timeout (``timeout_s`` or
    verl's ``default_timeout``, as for every entry of the file)."""

    def __init__(self, config: dict, **_: Any) -> None:
        self.wall_timeout_s = sandbox_timeout(timeout_of(config))

    def __call__(self, code: str, **_: Any) -> str:
        return run_python_program(code, self.wall_timeout_s)
