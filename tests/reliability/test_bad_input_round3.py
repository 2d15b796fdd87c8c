"""Bad input, round 3: settings that were ignored without a word, tracebacks, wrong or stale messages, SFT rows with
roles the chat template does not know, tool classes written for verl's interface. Each case is refused before any
worker starts with one message naming the key, file, row or tool — or, where the input was right all along, now
accepted and taking effect. No case looks at a traceback; the command-line cases check there is none.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from bad_input_cases import encoded, good_rows, jsonl_lines, run_overrides, train_files

from hybridrl.agents.batch import EPISODE_FAILURE, check_episode_failures
from hybridrl.agents.environment import ToolEnvironment
from hybridrl.agents.loop import AgentLoop, LoopLimits
from hybridrl.agents.tool_config import load_tool_config
from hybridrl.agents.trajectory import ChatRenderer
from hybridrl.cli import main
from hybridrl.config import load_config
from hybridrl.data.dataset import PromptDataset, PromptOptions
from hybridrl.data.io import read_rows
from hybridrl.data.records import record_from_row
from hybridrl.protocol import Batch, Fields
from hybridrl.rollout.base import SamplingParams
from hybridrl.trainers.rl_steps import batch_metrics
from hybridrl.trainers.rl_trainer import RLTrainer
from hybridrl.trainers.sft_trainer import SFTTrainer
from hybridrl.workers.agent_rollout import check_agent_names


def refused_config(*overrides: str, config_name: str = "ppo_trainer") -> str:
    """The one message ``load_config`` refuses ``overrides`` with (no files are read: ``check_paths=False``)."""
    with pytest.raises(ValueError) as caught:
        load_config(list(overrides), config_name, check_paths=False)
    return str(caught.value)


def assert_names(message: str, *phrases: str) -> None:
    for phrase in phrases:
        assert phrase in message, message


# ---------------------------------------------------------------------------------------------- silently ignored
IGNORED_CASES = {  # overrides -> phrases of the one message
    "tool_file_with_multi_turn_off": (["rollout.multi_turn.tool_config_path=tools.yaml"],
                                      ["rollout.multi_turn.tool_config_path='", "tools.yaml'",
                                       "rollout.multi_turn.enable=false", "set rollout.multi_turn.enable=true"]),
    "builtin_tools_with_multi_turn_off": (["rollout.multi_turn.tools=[python]"],
                                          ["rollout.multi_turn.tools=['python']", "rollout.multi_turn.enable=false"]),
    "verl_data_tool_file_with_multi_turn_off": (["data.tool_config_path=tools.yaml"],
                                                ["rollout.multi_turn.tool_config_path='", "tools.yaml'",
                                                 "verl's data.tool_config_path", "rollout.multi_turn.enable=false"]),
    "staleness_bound_with_sync": (["async_training.max_staleness=3"],
                                  ["async_training.max_staleness=3", "async_training.mode=sync",
                                   "set async_training.mode=bounded"]),
    "verl_key_then_its_hybridrl_twin": (["actor_rollout_ref.actor.optim.lr=1e-5", "actor.optim.lr=2e-5"],
                                        ["actor_rollout_ref.actor.optim.lr=1e-5 (verl's spelling)",
                                         "actor.optim.lr=2e-5 (hybridrl's)", "keep one of the two"]),
    "hybridrl_key_then_its_verl_twin": (["rollout.n=8", "actor_rollout_ref.rollout.n=5"],
                                        ["actor_rollout_ref.rollout.n=5 (verl's spelling)", "rollout.n=8 (hybridrl's)",
                                         "hybridrl's rollout.n"]),
    "two_verl_tool_files": (["data.tool_config_path=a.yaml",
                             "actor_rollout_ref.rollout.multi_turn.tool_config_path=b.yaml"],
                            ["data.tool_config_path=a.yaml",
                             "both hybridrl's rollout.multi_turn.tool_config_path, one setting for both roles"]),
}


@pytest.mark.parametrize("name", sorted(IGNORED_CASES))
def test_a_setting_that_would_be_ignored_is_refused_by_name(name):
    overrides, phrases = IGNORED_CASES[name]
    message = refused_config(*overrides)
    assert_names(message, *phrases)
    assert "1 problem" in message  # one message, about this mistake only


def test_settings_that_agree_or_override_still_load():
    """The same value in both spellings, the same key given twice (Hydra's later-wins), η = 0 under sync."""
    config = load_config(["actor_rollout_ref.actor.optim.lr=1e-5", "actor.optim.lr=0.00001", "rollout.n=5",
                          "rollout.n=8", "async_training.max_staleness=0"], check_paths=False)
    assert config.actor.optim.lr == 1e-5 and config.rollout.n == 8 and config.async_training.staleness_bound == 0


# ---------------------------------------------------------------------------------------------- tracebacks
def sft_overrides(model_dir: Path, tmp_path: Path, *extra: str) -> list[str]:
    return [f"model.path={model_dir}", f"trainer.default_local_dir={tmp_path / 'run'}", "data.max_response_length=8",
            "data.micro_batch_size_per_gpu=2", "data.train_batch_size=4", *extra]


def test_an_unknown_sft_tool_is_named_not_a_key_error():
    message = refused_config("data.synthetic_task=arithmetic", "data.tools=[calculator,weather]",
                             config_name="sft_trainer")
    assert_names(message, "data.tools='weather'", "unknown", "calculator, python")


def test_hybridrl_sft_with_an_unknown_tool_exits_2_with_one_message(model_dir, tmp_path, capsys):
    code = main(["sft", *sft_overrides(model_dir, tmp_path, "data.synthetic_task=arithmetic", "data.tools=[weather]")])
    error = capsys.readouterr().err
    assert code == 2 and "Traceback" not in error and "data.tools='weather'" in error, error


@pytest.mark.parametrize("config_name, extra, unit", [
    ("sft_trainer", ["data.synthetic_task=arithmetic"], "4 sequences per optimizer step"),
    ("rm_trainer", ["data.synthetic_task=arithmetic", "data.micro_batch_size_per_gpu=2", "data.train_batch_size=4"],
     "4 pairs per optimizer step"),
], ids=["sft", "rm"])
def test_hybridrl_config_prints_an_sft_or_rm_config_and_its_plan(config_name, extra, unit, model_dir, tmp_path,
                                                                 capsys):
    overrides = sft_overrides(model_dir, tmp_path, *extra) if config_name == "sft_trainer" else [
        f"model.path={model_dir}", f"trainer.default_local_dir={tmp_path / 'run'}", *extra]
    code = main(["config", "--config-name", config_name, *overrides])
    output = capsys.readouterr()
    assert code == 0 and "Traceback" not in output.err, output.err
    assert "model:" in output.out and unit in output.out and "accumulation steps" in output.out, output.out


# ---------------------------------------------------------------------------------------------- names and messages
def tool_file(tmp: Path, class_name: str, function_name: str = "check", properties: str = "{x: {type: string}}",
              name: str = "tools.yaml") -> Path:
    path = tmp / name
    path.write_text(f"tools:\n  - class_name: \"{class_name}\"\n    tool_schema:\n      type: function\n"
                    f"      function: {{name: \"{function_name}\", description: d, parameters: {{type: object, "
                    f"properties: {properties}}}}}\n")
    return path


TOOLS_PY = '''
class VerlStyle:  # verl's BaseTool interface, no __call__
    def __init__(self, config, tool_schema=None):
        self.config = config
    async def create(self, instance_id=None, **kwargs):
        return "id", None
    async def execute(self, instance_id, parameters, **kwargs):
        return "text", 0.0, {}
    async def release(self, instance_id, **kwargs):
        pass

class NoCall:
    def __init__(self, config):
        self.config = config

class Answering:
    def __init__(self, config, **create_kwargs):
        self.config = config
    def __call__(self, x):
        return f"got {x}"

class Inherited(Answering):  # __call__ from its base
    pass

class BothInterfaces(VerlStyle):  # verl's methods, and the call hybridrl makes
    def __call__(self, x):
        return x

def weather(city):
    return f"sunny in {city}"
'''


def test_a_function_name_with_a_dash_is_callable(tmp_path):
    """``get-weather`` is a valid OpenAI function name: loaded, and a model's call to it is answered."""
    (tmp_path / "my_tools.py").write_text(TOOLS_PY)
    tools = load_tool_config(tool_file(tmp_path, "my_tools.py:weather", "get-weather", "{city: {type: string}}"))
    environment = ToolEnvironment(tools, lambda text, row: 0.0)
    environment.reset({"prompt": [{"role": "user", "content": "weather?"}]})
    step = environment.step('<tool_call>{"name": "get-weather", "arguments": {"city": "Paris"}}</tool_call>')
    assert [message["content"] for message in step.observations] == ["sunny in Paris"]


@pytest.mark.parametrize("function_name", ["get weather", "x" * 65, "wetter.morgen"],
                         ids=["space", "65_characters", "dot"])
def test_a_function_name_a_model_cannot_call_names_the_rule(function_name, tmp_path):
    (tmp_path / "my_tools.py").write_text(TOOLS_PY)
    with pytest.raises(ValueError) as caught:
        load_tool_config(tool_file(tmp_path, "my_tools.py:weather", function_name, "{city: {type: string}}"))
    assert_names(str(caught.value), "tools.yaml: tools[0].tool_schema.function.name", repr(function_name),
                 "1 to 64 letters, digits, '_' or '-'")


VERL_AGENT_CASES = {  # verl's agent keys: what replaces them, never "not implemented yet"
    "agent_loop_config_path": (["actor_rollout_ref.rollout.agent.agent_loop_config_path=loops.yaml"],
                               ["agent_loop_config_path='loops.yaml'", "rollout.multi_turn.tool_config_path",
                                "rollout.multi_turn.enable=true"]),
    "default_agent_loop_tool_agent": (["actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent"],
                                      ["default_agent_loop='tool_agent'", "follows rollout.multi_turn.enable"]),
    "custom_async_server": (["actor_rollout_ref.rollout.agent.custom_async_server.path=server.py"],
                            ["custom_async_server.path='server.py'", "hybridrl's agent loop (rollout.multi_turn.*)"]),
}


@pytest.mark.parametrize("name", sorted(VERL_AGENT_CASES))
def test_verl_agent_keys_point_at_what_replaces_them(name):
    overrides, phrases = VERL_AGENT_CASES[name]
    message = refused_config(*overrides)
    assert_names(message, *phrases)
    assert "not implemented yet" not in message


def test_verls_data_tool_config_path_takes_effect():
    config = load_config(["data.tool_config_path=tools.yaml", "rollout.name=vllm", "rollout.multi_turn.enable=true"],
                         check_paths=False)
    assert config.rollout.multi_turn.tool_config_path.endswith("tools.yaml")


# ---------------------------------------------------------------------------------------------- SFT roles
def sft_rows() -> list[dict]:
    return [{"prompt": [{"role": "user", "content": f"{i}+1="}], "reward_model": {"ground_truth": str(i + 1)}}
            for i in range(8)]


def with_messages(row: int, messages: list[dict]):
    def change(rows: list[dict]) -> None:
        rows[row]["prompt"] = messages
    return change


ROLE_CASES = {
    "sharegpt_gpt": (with_messages(3, [{"role": "human", "content": "1+1="}, {"role": "gpt", "content": "2"},
                                       {"role": "user", "content": "2+2="}]),
                     ["sft.jsonl: row 3", "prompt[0].role='human'", "not a role the chat template knows",
                      "'human' as 'user'", "'gpt' as 'assistant'"]),
    "sharegpt_gpt_after_a_user_turn": (with_messages(5, [{"role": "user", "content": "1+1="},
                                                         {"role": "gpt", "content": "2"},
                                                         {"role": "user", "content": "2+2="}]),
                                       ["sft.jsonl: row 5", "prompt[1].role='gpt'", "'gpt' as 'assistant'"]),
    "made_up_role": (with_messages(2, [{"role": "narrator", "content": "Once"}, {"role": "user", "content": "1+1="}]),
                     ["sft.jsonl: row 2", "prompt[0].role='narrator'", "system, user, assistant, tool"]),
    "sharegpt_from_value_keys": (with_messages(6, [{"from": "human", "value": "1+1="}]),
                                 ["sft.jsonl: row 6", "'prompt[0]' is a ShareGPT-style message",
                                  "{'role', 'content'}"]),
}


def sft_file(tmp: Path, change) -> str:
    rows = sft_rows()
    change(rows)
    return str(jsonl_lines(tmp / "sft.jsonl", [encoded(row) for row in rows]))


@pytest.mark.parametrize("name", sorted(ROLE_CASES))
def test_an_sft_row_with_a_role_the_template_does_not_know_is_named(name, model_dir, tmp_path):
    change, phrases = ROLE_CASES[name]
    config = load_config(sft_overrides(model_dir, tmp_path, f"data.train_files=[{sft_file(tmp_path, change)}]"),
                         "sft_trainer")
    with pytest.raises(ValueError) as caught:
        SFTTrainer(config)
    assert_names(str(caught.value), *phrases)


def test_roles_are_not_checked_without_the_chat_template(model_dir, tmp_path):
    """With ``data.apply_chat_template=false`` the messages' text is joined and no role is rendered."""
    change, _ = ROLE_CASES["sharegpt_gpt"]
    config = load_config(sft_overrides(model_dir, tmp_path, f"data.train_files=[{sft_file(tmp_path, change)}]",
                                       "data.apply_chat_template=false"), "sft_trainer")
    assert len(SFTTrainer(config).source.examples) == 8


def test_a_ptx_row_with_a_sharegpt_role_is_named_before_workers_start(model_dir, tmp_path):
    change, _ = ROLE_CASES["sharegpt_gpt_after_a_user_turn"]
    with pytest.raises(ValueError) as caught:
        RLTrainer(load_config(run_overrides(model_dir, tmp_path / "run", "actor.ptx.coef=0.1", "actor.ptx.batch_size=4",
                                            f"actor.ptx.train_files=[{sft_file(tmp_path, change)}]")))
    assert_names(str(caught.value), "sft.jsonl: row 5", "prompt[1].role='gpt'")


# ---------------------------------------------------------------------------------------------- tool classes
def multi_turn_overrides(model_dir: Path, tmp_path: Path, tools: Path) -> list[str]:
    return run_overrides(model_dir, tmp_path / "run", "rollout=vllm_cpu", "rollout.multi_turn.enable=true",
                         f"rollout.multi_turn.tool_config_path={tools}")


TOOL_CLASS_CASES = {
    "verl_interface": ("VerlStyle", ["tools.yaml: tools[0].class_name='my_tools.py:VerlStyle'",
                                     "verl's tool interface (async create/execute/release)",
                                     "__call__(self, **arguments)", "cls(config, **create_kwargs)"]),
    "no_interface": ("NoCall", ["tools.yaml: tools[0].class_name='my_tools.py:NoCall'", "defines no __call__",
                                "__call__(self, **arguments)"]),
}


@pytest.mark.parametrize("name", sorted(TOOL_CLASS_CASES))
def test_a_tool_class_hybridrl_cannot_call_is_refused_at_config_check(name, model_dir, tmp_path):
    class_name, phrases = TOOL_CLASS_CASES[name]
    (tmp_path / "my_tools.py").write_text(TOOLS_PY)
    with pytest.raises(ValueError) as caught:
        load_config(multi_turn_overrides(model_dir, tmp_path, tool_file(tmp_path, f"my_tools.py:{class_name}")))
    assert_names(str(caught.value), "rollout.multi_turn.tool_config_path", *phrases)


@pytest.mark.parametrize("class_name", ["Answering", "Inherited", "BothInterfaces"])
def test_a_tool_class_with_a_call_is_accepted(class_name, tmp_path):
    (tmp_path / "my_tools.py").write_text(TOOLS_PY)
    [tool] = load_tool_config(tool_file(tmp_path, f"my_tools.py:{class_name}"))
    assert tool.for_episode({}).call({"x": "1"}).error is None


# ---------------------------------------------------------------------------------------------- agent rows
def agent_rows(tmp: Path, change=None, name: str = "rows.jsonl") -> Path:
    """Eight good arithmetic rows as a JSONL file, ``change(rows)`` applied first."""
    rows = [dict(row) for row in good_rows()]
    if change is not None:
        change(rows)
    return jsonl_lines(tmp / name, [encoded(row) for row in rows])


def set_row(index: int, **columns):
    def change(rows: list[dict]) -> None:
        rows[index].update(columns)
    return change


def refused_trainer(overrides: list[str]) -> str:
    with pytest.raises(ValueError) as caught:
        RLTrainer(load_config(overrides))
    return str(caught.value)


@pytest.mark.parametrize("agent_name", ["tool_agent", "my_agent"])
def test_rows_that_name_an_agent_with_multi_turn_off_are_refused_naming_file_and_row(agent_name, model_dir,
                                                                                     tmp_path):
    data = agent_rows(tmp_path, set_row(2, agent_name=agent_name))
    message = refused_trainer(run_overrides(model_dir, tmp_path / "run", *train_files(data)))
    assert_names(message, "rows.jsonl: row 2", f"agent_name={agent_name!r}", "rollout.multi_turn.enable=false",
                 "set rollout.multi_turn.enable=true", "drop the agent_name column")


def test_every_agent_row_is_counted_in_the_one_message(model_dir, tmp_path):
    def change(rows):
        for row in rows:
            row["agent_name"] = "tool_agent"
    message = refused_trainer(run_overrides(model_dir, tmp_path / "run", *train_files(agent_rows(tmp_path, change))))
    assert_names(message, "rows.jsonl: row 0", "(7 more row(s) of the train data alike)")


def test_single_turn_agent_rows_with_multi_turn_off_are_accepted(model_dir, tmp_path):
    """verl's ``single_turn_agent`` asks for what single-turn generation does: accepted."""
    data = agent_rows(tmp_path, set_row(1, agent_name="single_turn_agent"))
    trainer = RLTrainer(load_config(run_overrides(model_dir, tmp_path / "run", *train_files(data))))
    assert trainer.loaders.train.dataset[1].extra_info["agent_name"] == "single_turn_agent"


# ---------------------------------------------------------------------------------------------- tools_kwargs
TOOLS_KWARGS_PY = '''
def check(x, expected="none"):
    return f"checked {x} against {expected}"
'''


def agent_run(model_dir: Path, tmp: Path, tools: Path, data: Path) -> list[str]:
    """A multi-turn run on ``data`` with ``tools`` (the tiny model's template cannot render tools: a system prompt)."""
    return [*multi_turn_overrides(model_dir, tmp, tools), "rollout.multi_turn.tool_prompt=system", *train_files(data)]


def checked_rows(model_dir: Path, tmp: Path, tools: Path, data: Path):
    """The start-up row check of a multi-turn run with ``tools`` (the tool file's names) on ``data``; the dataset.
    (The tiny model's word-level tokenizer cannot encode the tools' system prompt, so no whole trainer here.)"""
    config = load_config(agent_run(model_dir, tmp, tools, data))
    options = PromptOptions.from_data_config(config.data)
    dataset = PromptDataset.from_files([data], load_tokenizer_from(model_dir), options)
    check_agent_names(config, dataset, [tool.name for tool in load_tool_config(tools)])
    return dataset


def tools_and_rows(tmp: Path, tools_kwargs) -> tuple[Path, Path]:
    (tmp / "my_tools.py").write_text(TOOLS_KWARGS_PY)
    return tool_file(tmp, "my_tools.py:check"), agent_rows(tmp, set_row(4, extra_info={"tools_kwargs": tools_kwargs}))


def test_tools_kwargs_stored_as_a_json_string_is_parsed_and_reaches_the_tool(tmp_path):
    """verl's parquet files sometimes hold ``tools_kwargs`` as a JSON string: its create_kwargs take effect."""
    tools, data = tools_and_rows(tmp_path, json.dumps({"check": {"create_kwargs": {"expected": "42"}}}))
    [row] = [row for row in read_rows(data).rows if row.where.endswith("row 4 (line 5)")]
    record = record_from_row(row.row, row.where)
    assert record.extra_info["tools_kwargs"] == {"check": {"create_kwargs": {"expected": "42"}}}
    environment = ToolEnvironment(load_tool_config(tools), lambda text, row: 0.0)
    environment.reset({"prompt": "q", "extra_info": record.extra_info})
    step = environment.step('<tool_call>{"name": "check", "arguments": {"x": "41"}}</tool_call>')
    assert step.observations[0]["content"] == "checked 41 against 42"


def test_a_json_string_in_a_row_built_in_code_also_reaches_the_tool(tmp_path):
    (tmp_path / "my_tools.py").write_text(TOOLS_KWARGS_PY)
    environment = ToolEnvironment(load_tool_config(tool_file(tmp_path, "my_tools.py:check")), lambda t, r: 0.0)
    environment.reset({"prompt": "q", "extra_info": {"tools_kwargs": '{"check": {"create_kwargs": {"expected": 7}}}'}})
    step = environment.step('<tool_call>{"name": "check", "arguments": {"x": "7"}}</tool_call>')
    assert step.observations[0]["content"] == "checked 7 against 7"


@pytest.mark.parametrize("value, phrases", [
    ("{check: 1", ["'extra_info.tools_kwargs' is a string that is not valid JSON", "create_kwargs"]),
    ("[1, 2]", ["'extra_info.tools_kwargs' must map tool names to", "got list"]),
    (3, ["'extra_info.tools_kwargs' must map tool names to", "got int"]),
], ids=["broken_json", "json_list", "number"])
def test_tools_kwargs_that_is_no_mapping_is_refused_naming_the_row(value, phrases, model_dir, tmp_path):
    data = agent_rows(tmp_path, set_row(4, extra_info={"tools_kwargs": value}))
    message = refused_trainer(run_overrides(model_dir, tmp_path / "run", *train_files(data)))
    assert_names(message, "rows.jsonl: row 4", *phrases)


@pytest.mark.parametrize("tools_kwargs", [{"chek": {"create_kwargs": {"expected": "1"}}},
                                          json.dumps({"chek": {"create_kwargs": {"expected": "1"}}})],
                         ids=["mapping", "json_string"])
def test_tools_kwargs_naming_an_undefined_tool_is_refused_naming_file_row_and_tool(tools_kwargs, model_dir,
                                                                                   tmp_path):
    tools, data = tools_and_rows(tmp_path, tools_kwargs)
    with pytest.raises(ValueError) as caught:
        checked_rows(model_dir, tmp_path, tools, data)
    assert_names(str(caught.value), "rows.jsonl: row 4", "extra_info.tools_kwargs names the tool(s) ['chek']",
                 "its tools: check", "tools.yaml")


def test_tools_kwargs_with_another_rows_tool_left_none_is_accepted(model_dir, tmp_path):
    """A parquet struct column holds every row's tool keys; a None entry is another row's, not this row's."""
    tools, data = tools_and_rows(tmp_path, {"check": {"create_kwargs": {"expected": "1"}}, "other": None})
    dataset = checked_rows(model_dir, tmp_path, tools, data)
    assert dataset[4].extra_info["tools_kwargs"]["check"] == {"create_kwargs": {"expected": "1"}}


# ---------------------------------------------------------------------------------------------- tools that raise
RAISING_PY = '''
class NeedsKey:
    def __init__(self, config, **create_kwargs):
        raise RuntimeError("MY_API_KEY is not set")
    def __call__(self, x):
        return x

def flaky(x):
    raise ConnectionError(f"sandbox 10.0.0.1 refused {x}")
'''


def raising_tools(tmp: Path, class_name: str) -> list:
    (tmp / "my_tools.py").write_text(RAISING_PY)
    return load_tool_config(tool_file(tmp, f"my_tools.py:{class_name}"))


def load_tokenizer_from(model_dir: Path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(model_dir)


def failed_episodes(tools: list, count: int, tokenizer) -> list:
    """``count`` episodes whose environment fails at reset: the agent loop never needs the engine."""
    loop = AgentLoop(None, ChatRenderer(tokenizer), LoopLimits(max_assistant_turns=2, max_response_tokens=8), [])
    environments = [ToolEnvironment(tools, lambda text, row: 0.0) for _ in range(count)]
    rows = [{"prompt": "1+1=", "extra_info": {}} for _ in range(count)]
    return loop.run(environments, rows, [SamplingParams(max_new_tokens=8)] * count)


def test_a_tool_constructor_that_raises_ends_the_episode_quoting_the_users_exception(model_dir, tmp_path):
    [trajectory] = failed_episodes(raising_tools(tmp_path, "NeedsKey"), 1, load_tokenizer_from(model_dir))
    assert trajectory.end == "failed"
    assert_names(trajectory.failure, "tool 'check'", "NeedsKey(config) raised RuntimeError: MY_API_KEY is not set")


def test_a_batch_whose_every_episode_failed_alike_stops_with_the_users_exception(model_dir, tmp_path):
    trajectories = failed_episodes(raising_tools(tmp_path, "NeedsKey"), 4, load_tokenizer_from(model_dir))
    batch = Batch(tensors={"x": torch.zeros(4)}, non_tensors={EPISODE_FAILURE: [t.failure for t in trajectories]})
    with pytest.raises(ValueError) as caught:
        check_episode_failures(batch)
    assert_names(str(caught.value), "all 4 episodes of the batch failed with the same error",
                 "RuntimeError: MY_API_KEY is not set", "rollout.multi_turn.tool_config_path")


@pytest.mark.parametrize("failures", [["boom", "", "boom"], ["boom", "bang"]], ids=["some_failed", "different"])
def test_a_batch_with_some_or_different_failures_trains_on(failures):
    check_episode_failures(Batch(tensors={"x": torch.zeros(len(failures))},
                                 non_tensors={EPISODE_FAILURE: failures}))


def test_batch_metrics_of_a_batch_without_response_tokens_do_not_crash():
    """Every episode failed before the model's first turn: no response token, metrics still computed."""
    rows, width = 4, 3
    zeros = torch.zeros(rows, width)
    batch = Batch(tensors={Fields.RESPONSE_MASK: zeros.long(), Fields.ATTENTION_MASK: torch.ones(rows, 5).long(),
                           Fields.TOKEN_LEVEL_SCORES: zeros, Fields.TOKEN_LEVEL_REWARDS: zeros,
                           Fields.RESPONSES: zeros.long(), Fields.ADVANTAGES: zeros})
    metrics = batch_metrics(batch)
    assert metrics["critic/advantages/max"] == 0.0 and metrics["response_length/max"] == 0.0


def test_a_tool_that_raises_on_every_call_shows_its_exception_to_model_and_log(tmp_path, caplog):
    environment = ToolEnvironment(raising_tools(tmp_path, "flaky"), lambda text, row: 0.0)
    environment.reset({"prompt": "q"})
    with caplog.at_level(logging.WARNING, logger="hybridrl.agents.environment"):
        steps = [environment.step('<tool_call>{"name": "check", "arguments": {"x": "a"}}</tool_call>')
                 for _ in range(3)]
        environment.step('<tool_call>{"name": "check", "arguments": {"x": "b"}}</tool_call>')
    assert steps[0].observations[0]["content"] == "error: ConnectionError: sandbox 10.0.0.1 refused a"
    assert steps[0].info["tool_errors"] == 1.0
    logged = [record.getMessage() for record in caplog.records if "raised" in record.getMessage()]
    assert len(logged) == 2, logged  # once per distinct message, not once per call
    assert_names(logged[0], "tool 'check' raised: ConnectionError: sandbox 10.0.0.1 refused a")
    assert_names(logged[1], "refused b")
