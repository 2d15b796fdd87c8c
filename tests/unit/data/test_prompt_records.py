"""Row validation: missing columns, empty or malformed prompts and bad text are refused, naming file, row and key."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from data_helpers import make_row

from hybridrl.data import PromptDataset, PromptOptions, record_from_row
from hybridrl.data.io import write_rows


def _load(tmp_path, rows, tokenizer, suffix=".jsonl", **options):
    path = write_rows(rows, tmp_path / f"rows{suffix}")
    return PromptDataset.from_files([path], tokenizer, PromptOptions(**options))


def test_valid_row_becomes_a_typed_record():
    record = record_from_row(make_row("12+30=", "42", extra_info={"split": "train"}), "memory: row 0")
    assert record.data_source == "arithmetic"
    assert record.prompt == [{"role": "user", "content": "12+30="}]
    assert record.ground_truth == "42"
    assert record.extra_info == {"split": "train"}


def test_parquet_missing_column_is_a_file_level_error(tmp_path, char_tokenizer):
    path = tmp_path / "no_reward.parquet"
    pq.write_table(pa.Table.from_pylist([{"data_source": "arithmetic", "prompt": "1+1="}]), path)
    with pytest.raises(ValueError, match=r"no_reward.parquet.*missing column\(s\) \['reward_model'\]"):
        PromptDataset.from_files([path], char_tokenizer)


def test_jsonl_row_missing_a_key_names_file_and_row(tmp_path, char_tokenizer):
    rows = [make_row(), make_row()]
    del rows[1]["data_source"]
    with pytest.raises(ValueError, match=r"rows.jsonl: row 1 \(line 2\): missing column\(s\) \['data_source'\]"):
        _load(tmp_path, rows, char_tokenizer)


def test_custom_prompt_key_is_required_and_used(tmp_path, char_tokenizer):
    row = make_row()
    row["question"] = row.pop("prompt")
    dataset = _load(tmp_path, [row], char_tokenizer, prompt_key="question")
    assert dataset[0].raw_prompt == "<|user|>2+3=<|assistant|>"
    with pytest.raises(ValueError, match=r"row 0.*missing column\(s\) \['prompt'\]"):
        _load(tmp_path, [row], char_tokenizer)


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ("   ", r"'prompt' is empty$"),
        ([], r"'prompt' is an empty list of messages"),
        ([{"role": "user", "content": ""}, {"role": "system", "content": " "}], r"'prompt' is empty \(every message"),
        ([{"role": "user"}], r"'prompt\[0\]\.content' must be a string"),
        ([{"content": "hi"}], r"'prompt\[0\]\.role' must be a non-empty string"),
        (["hello"], r"'prompt\[0\]' must be a dict"),
        (17, r"'prompt' must be chat messages or text, got int"),
    ],
)
def test_bad_prompts_name_the_row_and_key(tmp_path, char_tokenizer, prompt, message):
    rows = [make_row(), make_row()]
    rows[1]["prompt"] = prompt
    with pytest.raises(ValueError, match=r"rows.jsonl: row 1 \(line 2\): " + message):
        _load(tmp_path, rows, char_tokenizer)


def test_missing_ground_truth_names_the_row(tmp_path, char_tokenizer):
    rows = [make_row(), make_row(), make_row(reward_model={"style": "rule"})]
    with pytest.raises(ValueError, match=r"rows.parquet: row 2: 'reward_model' must be a dict with a 'ground_truth'"):
        _load(tmp_path, rows, char_tokenizer, suffix=".parquet")


def test_lone_surrogate_escape_is_not_utf8(tmp_path, char_tokenizer):
    path = tmp_path / "surrogate.jsonl"
    row = json.dumps(make_row("abc")).replace("abc", "a\\ud800c")
    path.write_text(row + "\n")
    message = r"surrogate.jsonl: row 0 \(line 1\): 'prompt\[0\]\.content' is not valid UTF-8"
    with pytest.raises(ValueError, match=message):
        PromptDataset.from_files([path], char_tokenizer)


def test_parquet_binary_prompt_with_bad_bytes_names_the_row(tmp_path, char_tokenizer):
    path = tmp_path / "binary.parquet"
    table = pa.table({
        "data_source": ["arithmetic", "arithmetic"],
        "prompt": pa.array([b"1+1=", b"\xff\xfe"], pa.binary()),
        "reward_model": [{"ground_truth": "2"}, {"ground_truth": "3"}],
    })
    pq.write_table(table, path)
    with pytest.raises(ValueError, match=r"binary.parquet: row 1: 'prompt' holds bytes that are not valid UTF-8"):
        PromptDataset.from_files([path], char_tokenizer)


def test_extra_info_must_be_a_dict(tmp_path, char_tokenizer):
    with pytest.raises(ValueError, match=r"row 0 \(line 1\): 'extra_info' must be a dict, got list"):
        _load(tmp_path, [make_row(extra_info=[1, 2])], char_tokenizer)


def test_data_source_must_be_a_non_empty_string(tmp_path, char_tokenizer):
    with pytest.raises(ValueError, match=r"row 0 \(line 1\): 'data_source' must be a non-empty string"):
        _load(tmp_path, [make_row(data_source="")], char_tokenizer)


def test_rows_of_several_files_keep_order_and_locations(tmp_path, char_tokenizer):
    first = write_rows([make_row("1+1=", "2")], tmp_path / "a.jsonl")
    second = write_rows([make_row("2+2=", "4"), make_row("3+3=", "6")], tmp_path / "b.parquet")
    dataset = PromptDataset.from_files([first, second], char_tokenizer)
    assert [prompt.ground_truth for prompt in dataset] == ["2", "4", "6"]
    assert [prompt.row_id for prompt in dataset] == [0, 1, 2]


def verl_tool_agent_row(index: int, answer: str, agent_name: str = "tool_agent") -> dict:
    """A row as verl's examples/data_preprocess/gsm8k_tool_agent_loop.py writes it."""
    return {"data_source": "openai/gsm8k", "agent_name": agent_name,
            "prompt": [{"role": "system", "content": "1+1="}, {"role": "user", "content": f"{answer}+0="}],
            "ability": "math", "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"split": "train", "index": index, "need_tools_kwargs": True,
                           "tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": answer}}},
                           "interaction_kwargs": {"query": f"{answer}+0=", "ground_truth": answer}}}


def test_verls_multi_turn_rows_keep_their_agent_name_and_tool_arguments(tmp_path, char_tokenizer):
    from hybridrl.agents.environment import row_tool_arguments
    from hybridrl.config import load_config
    from hybridrl.workers.agent_rollout import check_agent_names

    rows = [verl_tool_agent_row(0, "72"), verl_tool_agent_row(1, "5", agent_name="single_turn_agent")]
    dataset = _load(tmp_path, rows, char_tokenizer, suffix=".parquet")
    assert [prompt.extra_info["agent_name"] for prompt in dataset] == ["tool_agent", "single_turn_agent"]
    assert row_tool_arguments({"extra_info": dataset[0].extra_info}, "calc_gsm8k_reward") == {"ground_truth": "72"}
    config = load_config(["rollout.name=vllm", "rollout.multi_turn.enable=true"], check_paths=False)
    check_agent_names(config, dataset)
    unknown = _load(tmp_path, [verl_tool_agent_row(0, "1", agent_name="react_agent")], char_tokenizer)
    with pytest.raises(ValueError, match=r"rows.jsonl: row 0 \(line 1\): agent_name 'react_agent' names no "
                                         "environment; "
                                         "registered: tool, single_turn, tool_agent, single_turn_agent"):
        check_agent_names(config, unknown)
    with pytest.raises(ValueError, match=r"row 0 \(line 1\): 'agent_name' must be a non-empty string, got 3"):
        _load(tmp_path, [{**make_row(), "agent_name": 3}], char_tokenizer)


def test_an_rl_prompt_with_a_role_the_chat_template_does_not_know_names_file_row_and_role(tmp_path, char_tokenizer):
    """ShareGPT-style roles in RL prompts are refused like SFT's (``data/chat_roles.py``), not rendered as some
    other role; without the chat template roles are not rendered, so nothing is refused."""
    rows = [make_row(), make_row()]
    rows[1]["prompt"] = [{"role": "human", "content": "1+1="}]
    with pytest.raises(ValueError, match=r"rows.jsonl: row 1 \(line 2\): prompt\[0\].role='human' is not a role "
                                         r"the chat template knows .*'human' as 'user'"):
        _load(tmp_path, rows, char_tokenizer)
    assert len(_load(tmp_path, rows, char_tokenizer, apply_chat_template=False)) == 2
