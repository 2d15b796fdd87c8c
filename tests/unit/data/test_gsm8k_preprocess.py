"""GSM8K preprocessing on real rows (a copy of a few lines in tmp): schema, answers without commas, CLI, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from data_helpers import build_bpe_tokenizer

from hybridrl.data import PromptDataset, PromptLoader, PromptOptions, read_rows, record_from_row
from hybridrl.data.preprocess import GSM8K_DATA_SOURCE, gsm8k_rows, main, preprocess_gsm8k
from hybridrl.rewards import default_compute_score

REPO_ROOT = Path(__file__).resolve().parents[3]


def _final_answer(answer: str) -> str:
    """The README's rule, written independently: text after the last '#### ', commas removed."""
    return answer.split("#### ")[-1].strip().replace(",", "")


@pytest.fixture(scope="module")
def gsm8k_copy(gsm8k_dir, tmp_path_factory) -> Path:
    """The first 12 train lines plus the first answer with a thousands separator, and the first 6 test lines."""
    folder = tmp_path_factory.mktemp("gsm8k_in")
    train_lines = (gsm8k_dir / "train.jsonl").read_text().splitlines(keepends=True)
    with_comma = next(line for line in train_lines if "," in json.loads(line)["answer"].split("#### ")[-1])
    (folder / "train.jsonl").write_text("".join(train_lines[:12]) + with_comma)
    test_lines = (gsm8k_dir / "test.jsonl").read_text().splitlines(keepends=True)
    (folder / "test.jsonl").write_text("".join(test_lines[:6]))
    return folder


def test_rows_follow_the_schema_with_clean_answers(gsm8k_copy):
    source_rows = [item.row for item in read_rows(gsm8k_copy / "train.jsonl").rows]
    rows = gsm8k_rows(gsm8k_copy / "train.jsonl", "train")
    assert len(rows) == 13
    for index, (row, source) in enumerate(zip(rows, source_rows)):
        record = record_from_row(row, f"row {index}")
        assert record.data_source == GSM8K_DATA_SOURCE and record.ability == "math"
        assert row["reward_model"] == {"style": "rule", "ground_truth": _final_answer(source["answer"])}
        assert record.ground_truth.lstrip("-").isdigit()  # whole numbers, thousands separators removed
        content = record.prompt[0]["content"]
        assert record.prompt[0]["role"] == "user" and content.startswith(source["question"].strip())
        assert "####" in content
        assert row["extra_info"] == {"split": "train", "index": index, "question": source["question"],
                                     "answer": source["answer"]}
    assert "," in source_rows[-1]["answer"].split("#### ")[-1] and rows[-1]["reward_model"]["ground_truth"].isdigit()


def test_reference_solutions_score_full_marks(gsm8k_copy):
    for row in gsm8k_rows(gsm8k_copy / "train.jsonl", "train"):
        solution = row["extra_info"]["answer"]  # the worked solution, ending in "#### N" (commas kept)
        result = default_compute_score(row["data_source"], solution, row["reward_model"]["ground_truth"], None)
        assert result["score"] == 1.0 and result["format_ok"] == 1.0


def test_preprocess_writes_parquet_that_loads_and_batches(gsm8k_copy, tmp_path):
    outputs = preprocess_gsm8k(gsm8k_copy, tmp_path / "out")
    assert outputs == {"train": tmp_path / "out/train.parquet", "test": tmp_path / "out/test.parquet"}
    test_rows = read_rows(outputs["test"])
    assert len(test_rows.rows) == 6 and test_rows.rows[0].row["extra_info"]["split"] == "test"
    corpus = [row.row["prompt"][0]["content"] for row in read_rows(outputs["train"]).rows]
    tokenizer = build_bpe_tokenizer(corpus, vocab_size=400)
    dataset = PromptDataset.from_files([outputs["train"]], tokenizer, PromptOptions(max_prompt_length=1024))
    batch = next(iter(PromptLoader(dataset, 4, pad_token_id=tokenizer.pad_token_id, seed=1)))
    assert batch["input_ids"].shape[0] == 4 and set(batch["data_source"]) == {GSM8K_DATA_SOURCE}
    assert all(text.startswith("<s>[user] ") for text in batch["raw_prompt"])


def test_cli_writes_both_splits(gsm8k_copy, tmp_path, capsys):
    assert main(["gsm8k", "--input", str(gsm8k_copy), "--output", str(tmp_path / "cli"), "--limit", "3"]) == 0
    assert len(read_rows(tmp_path / "cli/train.parquet").rows) == 3
    assert "test: " in capsys.readouterr().out


def test_cli_reports_bad_input_with_file_and_row(tmp_path, capsys):
    (tmp_path / "train.jsonl").write_text(
        json.dumps({"question": "q1", "answer": "a\n#### 1"}) + "\n"
        + json.dumps({"question": "q2", "answer": "2"}) + "\n"
    )
    assert main(["gsm8k", "--input", str(tmp_path), "--output", str(tmp_path / "out")]) == 2
    assert "train.jsonl: row 1 (line 2): the answer has no '####' line" in capsys.readouterr().err
    (tmp_path / "train.jsonl").write_text(json.dumps({"question": "", "answer": "#### 1"}) + "\n")
    with pytest.raises(ValueError, match=r"row 0 \(line 1\): 'question' must be a non-empty string"):
        gsm8k_rows(tmp_path / "train.jsonl", "train")


def test_module_entry_point_runs(gsm8k_copy, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "hybridrl.data.preprocess", "gsm8k", "--input", str(gsm8k_copy), "--output",
         str(tmp_path / "m"), "--limit", "2"],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "m/train.parquet").is_file() and (tmp_path / "m/test.parquet").is_file()


def test_tool_agent_rows_take_verls_layout_and_the_recipes_tool_checks_them(tmp_path):
    """``--tool-agent``: verl's multi-turn rows (system message, agent_name, tools_kwargs); with the recipe's tool
    config file (verl's Gsm8kTool class) the row's own tool accepts the row's answer and refuses another."""
    from hybridrl.agents.environment import ToolEnvironment
    from hybridrl.agents.tool_config import load_tool_config
    from hybridrl.agents.tools import format_tool_call

    problems = [{"question": "Ann has 3 bags of 4 apples. How many apples?", "answer": "3*4=12\n#### 12"},
                {"question": "A crate holds 1,000 nails; two crates?", "answer": "2*1000\n#### 2,000"}]
    for split in ("train", "test"):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(problem) + "\n" for problem in problems))
    assert main(["gsm8k", "--input", str(tmp_path), "--output", str(tmp_path / "out"), "--tool-agent"]) == 0
    rows = [item.row for item in read_rows(tmp_path / "out" / "train.parquet").rows]   # through parquet and back
    tools = load_tool_config(REPO_ROOT / "conf" / "tool_configs" / "gsm8k_tool_config.yaml")
    for row, final in zip(rows, ("12", "2000")):
        assert row["agent_name"] == "tool_agent" and [m["role"] for m in row["prompt"]] == ["system", "user"]
        assert "calc_gsm8k_reward" in row["prompt"][0]["content"]
        assert row["extra_info"]["tools_kwargs"] == {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": final}}}
        record = record_from_row(row, "row")
        assert record.extra_info["agent_name"] == "tool_agent"
        environment = ToolEnvironment(tools, lambda text, row: 0.0)
        environment.reset({"prompt": row["prompt"], "extra_info": record.extra_info})
        right = environment.step(format_tool_call("calc_gsm8k_reward", {"answer": final}))
        wrong = environment.step(format_tool_call("calc_gsm8k_reward", {"answer": "7"}))
        assert "reward=1" in right.observations[0]["content"] and right.reward == 0.0
        assert "reward=0" in wrong.observations[0]["content"] and wrong.reward == -0.05
