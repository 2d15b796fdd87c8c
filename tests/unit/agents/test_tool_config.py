"""Tools from a tool config file in verl's format (``agents/tool_config.py``): user functions and per-episode
classes with the row's ``create_kwargs``, per-turn tool rewards, verl's GSM8K and SandboxFusion classes through
their equivalents, and every malformed file refused with the file, entry and field named."""

from __future__ import annotations

import sys
import textwrap

import pytest

from hybridrl.agents.environment import ToolEnvironment, row_tool_arguments
from hybridrl.agents.tool_config import EpisodeTool, ToolConfigError, load_tool_config
from hybridrl.agents.tools import ToolResult, format_tool_call, tool_from_function
from hybridrl.agents.verl_tools import NO_PROGRESS_PENALTY

# verl's examples/sglang_multiturn/config/tool_config/gsm8k_tool_config.yaml, in its layout
VERL_GSM8K = """
tools:
  - class_name: "verl.tools.gsm8k_tool.Gsm8kTool"
    config:
      type: native
    tool_schema:
      type: "function"
      function:
        name: "calc_gsm8k_reward"
        description: "Checks an answer to the GSM8K question (1.0 when right, 0.0 otherwise)"
        parameters:
          type: "object"
          properties:
            answer:
              type: "string"
              description: "The answer, digits only"
          required: ["answer"]
"""

USER_TOOLS = '''
from hybridrl.agents.tools import ToolResult

OPENED = []
CLOSED = []


def price(item: str, table: dict = None) -> str:
    return str((table or {}).get(item, "unknown"))


class Counter:
    def __init__(self, config, start=0):
        self.value, self.step = start, config.get("step", 1)
        OPENED.append(self)

    def __call__(self, times):
        self.value += self.step * times
        return ToolResult(f"now {self.value}", reward=0.5)

    def close(self):
        CLOSED.append(self.value)
'''


def write(tmp_path, text: str, name: str = "tools.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def schema_entry(class_name: str, name: str, properties: dict, extra: str = "") -> str:
    lines = [f'  - class_name: "{class_name}"', extra, "    tool_schema:", "      type: function", "      function:",
             f"        name: {name}", "        description: a tool", "        parameters:", "          type: object",
             f"          properties: {properties}"]
    return "\n".join(line for line in lines if line)


@pytest.fixture
def user_tools(tmp_path):
    (tmp_path / "my_tools.py").write_text(USER_TOOLS)
    body = "\n".join([schema_entry("my_tools.py:price", "price", {"item": {"type": "string"}}),
                      schema_entry("my_tools.py:Counter", "counter", {"times": {"type": "integer"}},
                                   "    config: {step: 10, timeout_s: 2}")])
    return write(tmp_path, "tools:\n" + body)


def test_verls_gsm8k_tool_file_loads_and_checks_answers_with_verls_step_rewards(tmp_path):
    [tool] = load_tool_config(write(tmp_path, VERL_GSM8K))
    assert isinstance(tool, EpisodeTool) and tool.name == "calc_gsm8k_reward"
    assert tool.schema()["function"]["parameters"]["required"] == ["answer"]
    episode = tool.for_episode({"ground_truth": "72"})
    wrong, right, again = (episode.call({"answer": answer}) for answer in ("70", "72", "#### 72"))
    assert "reward=0" in wrong.content and wrong.reward == NO_PROGRESS_PENALTY  # no better than nothing
    assert "reward=1" in right.content and right.reward == 0.0                 # the score rose
    assert again.reward == NO_PROGRESS_PENALTY                                   # resubmitted: no progress
    fresh = tool.for_episode({"ground_truth": "5"})                              # one instance per episode
    assert fresh.call({"answer": "5"}).reward == 0.0
    with pytest.raises(ValueError, match="ground_truth"):
        tool.for_episode({})


def test_verls_sandbox_fusion_tool_runs_in_the_local_sandbox(tmp_path):
    text = """
    tools:
      - class_name: "verl.tools.sandbox_fusion_tools.SandboxFusionTool"
        config: {sandbox_fusion_url: "https://unreachable.example/run_code", default_timeout: 8}
        tool_schema:
          type: function
          function:
            name: code_interpreter
            description: "Runs code."
            parameters: {type: object, properties: {code: {type: string}}, required: [code]}
    """
    [tool] = load_tool_config(write(tmp_path, text))
    assert tool.template.timeout_s == 8.0
    assert tool.for_episode({}).call({"code": "print(6 * 7)"}).content == "42"


def test_user_functions_get_the_rows_arguments_and_classes_live_one_episode(user_tools):
    price, counter = load_tool_config(user_tools)
    assert price.schema()["function"]["parameters"]["properties"] == {"item": {"type": "string"}}
    row = {"prompt": "q", "extra_info": {"tools_kwargs": {"price": {"create_kwargs": {"table": {"tea": 3}}},
                                                          "counter": {"create_kwargs": {"start": 1, "gone": None}}}}}
    environment = ToolEnvironment([price, counter], lambda text, row: 0.0)
    environment.reset(row)
    result = environment.step(format_tool_call("price", {"item": "tea"}) + format_tool_call("counter", {"times": 2}))
    assert [message["content"] for message in result.observations] == ["3", "now 21"]
    assert result.reward == 0.5 and result.info["tool_calls"] == 2          # the class's ToolResult reward
    assert environment.step(format_tool_call("counter", {"times": 1})).observations[0]["content"] == "now 31"
    environment.close()
    assert sys.modules[counter.template.function.__module__].CLOSED == [31]
    assert counter.template.timeout_s == 2.0


def test_a_rows_tool_arguments_follow_verls_layout():
    row = {"extra_info": {"tools_kwargs": {"t": {"create_kwargs": {"a": 1, "b": None}}, "u": None}}}
    assert row_tool_arguments(row, "t") == {"a": 1}        # parquet fills other rows' keys with None
    assert row_tool_arguments(row, "u") == {} == row_tool_arguments({}, "t") == row_tool_arguments(row, "v")


def test_a_tool_reward_that_is_not_a_finite_number_is_an_error_outcome():
    def bad(x: int) -> ToolResult:
        """Bad reward."""
        return ToolResult("ok", reward=float("nan"))

    outcome = tool_from_function(bad).call({"x": 1})
    assert outcome.error and "finite number" in outcome.content and outcome.reward == 0.0


@pytest.mark.parametrize("text, phrase", [
    ("tools: [", "not valid YAML"),
    ("other: 1", "top-level `tools:` list"),
    ("tools:\n  - tool_schema: {}", "tools[0].class_name: missing"),
    ("tools:\n" + schema_entry("verl.tools.search_tool.SearchTool", "search", {}), "verl's own tool classes"),
    ("tools:\n" + schema_entry("no_such_module_xyz.tool", "t", {}), "importing 'no_such_module_xyz' failed"),
    ("tools:\n" + schema_entry("hybridrl.agents.builtin_tools.nothing", "t", {}), "no function or class 'nothing'"),
    ("tools:\n" + schema_entry("hybridrl.agents.builtin_tools:calculator", "calc", {"code": {"type": "string"}}),
     "takes no parameter(s) ['code']"),
    ("tools:\n  - class_name: a.b\n    tool_schema: {type: function, function: {name: 'get weather'}}",
     "not a function name a model can call"),
    ("tools:\n" + schema_entry("hybridrl.agents.builtin_tools:calculator", "c", {}, "    config: {timeout_s: 0}"),
     "timeout_s: 0 must be a number of seconds"),
    ("tools:\n" + "\n".join([schema_entry("hybridrl.agents.builtin_tools:calculator", "c", {})] * 2),
     "appear more than once"),
])
def test_a_malformed_tool_file_names_the_entry_and_field(tmp_path, text, phrase):
    path = write(tmp_path, text)
    with pytest.raises(ToolConfigError) as caught:
        load_tool_config(path)
    assert phrase in str(caught.value) and str(path) in str(caught.value)


def test_a_required_argument_must_be_a_property(tmp_path):
    text = """
    tools:
      - class_name: hybridrl.agents.builtin_tools:calculator
        tool_schema:
          function: {name: calc, parameters: {properties: {expression: {type: string}}, required: [expr]}}
    """
    with pytest.raises(ToolConfigError, match=r"required: \['expr'\] are not among the properties"):
        load_tool_config(write(tmp_path, text))
    with pytest.raises(ToolConfigError, match="no such file"):
        load_tool_config(tmp_path / "missing.yaml")
