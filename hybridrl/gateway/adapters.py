"""Agents written with other libraries, as ``async def agent(row, client)`` functions the trainer runs.

- :func:`openai_agents_sdk`: an OpenAI Agents SDK ``Agent`` (``pip install 'hybridrl[agents]'``), run by the SDK's
  own ``Runner`` on the episode's client through its Chat Completions model — its function tools, handoffs and
  guardrails run as the SDK runs them; every model call goes through the gateway and is captured.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Union

Row = Mapping[str, Any]
# The SDK's words (openai-agents 0.24) for a reply cut by the length limit before any text or tool call.
BUDGET_SPENT = "finish_reason='length'"


def openai_agents_sdk(agent: Any, *, reward: Optional[Callable[[Row, Any], Optional[float]]] = None,
                      max_turns: int = 10, model_name: str = "policy"):
    """An ``agent(row, client)`` that runs an OpenAI Agents SDK agent on the row's ``prompt``.

    Args:
        agent: an ``agents.Agent``, or a function ``row -> Agent`` (instructions or tools that depend on the row).
        reward: ``reward(row, final_output) -> float | None``; without it the episode's reward is left to the data
            source's reward function (``None``), which scores the last reply. An episode that spends its response
            budget (``data.max_response_length``) before a final answer is scored with ``final_output=""``: the
            gateway's empty reply there ends with ``finish_reason='length'``, which the SDK raises on, and a long
            tool loop would otherwise fail (unscored, untrained) instead of earning a low reward.
        max_turns: the SDK's bound on model calls per episode (past it the SDK raises: the episode fails, counted).
        model_name: the model name sent to the gateway (it serves the policy whatever the name).
    """
    async def run_sdk_agent(row: Row, client: Any) -> Union[float, None]:
        from agents import OpenAIChatCompletionsModel, RunConfig, Runner
        from agents.exceptions import ModelBehaviorError

        starting = agent(row) if callable(agent) and not _is_sdk_agent(agent) else agent
        config = RunConfig(model=OpenAIChatCompletionsModel(model=model_name, openai_client=client),
                           tracing_disabled=True)
        try:
            result = await Runner.run(starting, input=_input_items(row["prompt"]), run_config=config,
                                      max_turns=max_turns)
            final_output = result.final_output
        except ModelBehaviorError as error:
            if BUDGET_SPENT not in str(error):
                raise
            final_output = ""
        return reward(row, final_output) if reward is not None else None
    return run_sdk_agent


def _is_sdk_agent(candidate: Any) -> bool:
    from agents import Agent

    return isinstance(candidate, Agent)


def _input_items(prompt: Any) -> Union[str, list[dict[str, Any]]]:
    """The row's prompt as the SDK's input: a text as is, chat messages as role/content items."""
    if isinstance(prompt, str):
        return prompt
    return [{"role": message["role"], "content": message["content"]} for message in prompt]
