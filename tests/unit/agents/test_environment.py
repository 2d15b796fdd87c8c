"""The tool environment (``agents/environment.py``): tool calls answered, the model's mistakes told and counted, the
final answer scored; the step-result contract."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hybridrl.agents.environment import (ENVIRONMENTS, EnvironmentFailure, StepResult, ToolEnvironment, checked,
                                         resolve_tools)
from hybridrl.agents.tools import format_tool_call


def exact_answer(text, row):
    return float(text.strip() == str(row["ground_truth"]))


@pytest.fixture
def env():
    environment = ToolEnvironment(resolve_tools(["calculator"]), exact_answer, max_tool_calls=2)
    assert environment.reset({"prompt": "17*23=", "ground_truth": 391}) == [{"role": "user", "content": "17*23="}]
    return environment


def test_a_tool_call_is_answered_and_the_final_answer_scored(env):
    result = env.step(format_tool_call("calculator", {"expression": "17*23"}))
    assert result.observations == [{"role": "tool", "content": "391"}] and not result.done
    assert result.info["tool_calls"] == 1 and result.info["tool_errors"] == 0
    final = env.step("391")
    assert final.done and final.reward == 1.0 and not final.observations
    assert env.step("392").reward == 0.0


@pytest.mark.parametrize("text, told", [
    ('<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>', "not valid JSON"),
    (format_tool_call("search", {"q": "x"}), "unknown tool 'search'; the tools are calculator"),
    (format_tool_call("calculator", {"expr": "1+1"}), "expr"),
    (format_tool_call("calculator", {"expression": "import os"}), "error:"),
    (format_tool_call("calculator", {"expression": "1"}) * 3, "at most 2 tool calls per turn"),
])
def test_the_models_mistakes_are_told_to_it_and_counted(env, text, told):
    result = env.step(text)
    assert not result.done and result.info["tool_errors"] >= 1
    assert any(told in message["content"] for message in result.observations), result.observations
    assert all(message["content"].startswith("error:") for message in result.observations
               if told in message["content"])


def test_the_step_result_contract():
    assert checked(StepResult(observations=[{"role": "tool", "content": "ok"}], reward=1)).reward == 1
    for bad, phrase in ((None, "not a StepResult"), (StepResult(reward=True), "finite number"),
                        (StepResult(reward=float("nan")), "finite number"),
                        (StepResult(observations=["text"]), "chat message")):
        with pytest.raises(EnvironmentFailure, match=phrase):
            checked(bad)


def test_environments_and_tools_are_found_by_name():
    assert {"tool", "single_turn", "tool_agent", "single_turn_agent"} <= set(ENVIRONMENTS.names())
    assert ENVIRONMENTS["tool_agent"] is ENVIRONMENTS["tool"]          # verl's agent_name values
    single = ENVIRONMENTS["single_turn_agent"](resolve_tools(["calculator"]), exact_answer)
    single.reset({"prompt": "2*3=", "ground_truth": 6})
    result = single.step(format_tool_call("calculator", {"expression": "2*3"}))   # no tools: the turn is the answer
    assert result.done and result.reward == 0.0 and single.step("6").reward == 1.0
    with pytest.raises(KeyError, match="unknown tool"):
        resolve_tools(["calculator", "browser"])


def test_the_config_layers_lists_match_the_registries_they_name():
    """The config layer cannot import these packages, so it keeps their names; they must not drift."""
    from hybridrl.agents.builtin_tools import BUILTIN_TOOLS
    from hybridrl.config.multi_turn_checks import BUILTIN_TOOL_NAMES
    from hybridrl.config.pool_checks import reshard_method
    from hybridrl.config.rollout_schema import IN_PLACE_TRANSFERS
    from hybridrl.hybrid_engine.sync import METHODS

    assert set(BUILTIN_TOOL_NAMES) == set(BUILTIN_TOOLS)
    in_place = {reshard_method(SimpleNamespace(rollout=SimpleNamespace(weight_transfer=name)))
                for name in IN_PLACE_TRANSFERS}
    assert in_place == set(METHODS)  # every rollout.weight_transfer into the actor's engines is a resharder method
