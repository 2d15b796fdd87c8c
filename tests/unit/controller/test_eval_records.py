"""``hybridrl eval``'s records and figures: resume keeps whole batches only, other settings are refused, the figures
per data source equal a brute-force count, and the sources and settings a user can get wrong are named."""

from __future__ import annotations

import itertools
import json

import pytest

from hybridrl.trainers.eval_records import EvalRecords, format_table, judged_row, summarise
from hybridrl.trainers.eval_source import resolve_eval_source
from hybridrl.trainers.evaluator import EvalSettings

SETTINGS = {"model": "m", "batch_sizes": [2, 1], "n": 3}


def record(batch: int, source: str, val_right: bool, samples: list[tuple[str, bool]]) -> dict:
    return {"batch": batch, "row_id": 0, "data_source": source, "prompt": "p", "ground_truth": "1",
            "val": [judged_row("a", float(val_right), val_right, "a", 2)],
            "samples": [judged_row(answer, float(right), right, answer, 3) for answer, right in samples]}


def test_resume_keeps_whole_batches_and_drops_a_torn_write(tmp_path):
    records = EvalRecords(tmp_path, SETTINGS)
    records.append(0, [record(0, "x", True, []), record(0, "x", False, [])])
    with records.samples_path.open("a") as file:       # batch 1 cut short by a crash, mid-line
        file.write(json.dumps(record(1, "x", True, []))[:20])
    resumed = EvalRecords(tmp_path, SETTINGS)
    assert sorted(resumed.batches) == [0] and len(resumed.rows()) == 2
    assert len(resumed.samples_path.read_text().splitlines()) == 2      # the torn line is gone from the file too


def test_records_of_other_settings_are_refused_unless_overwritten(tmp_path):
    EvalRecords(tmp_path, SETTINGS).append(0, [record(0, "x", True, [])] * 2)
    with pytest.raises(ValueError, match=r"other settings \(n: 3 then, 4 now\).*--overwrite"):
        EvalRecords(tmp_path, {**SETTINGS, "n": 4})
    assert EvalRecords(tmp_path, {**SETTINGS, "n": 4}, overwrite=True).batches == {}


def brute_pass_at_k(flags: list[bool], k: int) -> float:
    subsets = list(itertools.combinations(flags, k))
    return sum(any(subset) for subset in subsets) / len(subsets)


def test_figures_per_source_equal_a_brute_force_count():
    rows = [record(0, "gsm8k", True, [("7", True), ("3", False), ("3", False)]),
            record(0, "gsm8k", False, [("1", False), ("2", False), ("9", True)]),
            record(1, "math", False, [("5", True), ("5", True), ("4", False)])]
    figures = summarise(rows, [1, 2, 3])
    assert list(figures) == ["gsm8k", "math", "all"]
    gsm8k = figures["gsm8k"]
    assert gsm8k["prompts"] == 2 and gsm8k["accuracy"] == 0.5 and gsm8k["sampled_accuracy"] == pytest.approx(2 / 6)
    for k in (1, 2, 3):
        expected = (brute_pass_at_k([True, False, False], k) + brute_pass_at_k([False, False, True], k)) / 2
        assert gsm8k[f"pass@{k}"] == pytest.approx(expected)
    assert gsm8k["maj@3"] == 0.0 and gsm8k["maj@1"] == 0.5 and figures["math"]["maj@3"] == 1.0
    assert figures["all"]["maj@3"] == pytest.approx(1 / 3)
    table = format_table(figures, val_is_greedy=True)
    assert "pass@1 (greedy)" in table and table.splitlines()[-1].startswith("all")


def test_settings_mistakes_are_named():
    with pytest.raises(ValueError, match=r"--k \[8\].*--n=4"):
        EvalSettings(n=4, ks=(1, 8)).checked()
    with pytest.raises(ValueError, match="--n=0"):
        EvalSettings(n=0).checked()
    with pytest.raises(ValueError, match="--k .*--n samples"):
        EvalSettings(n=1, ks=(4,)).checked()
    with pytest.raises(ValueError, match="--temperature=0"):
        EvalSettings(n=4, temperature=0.0).checked()
    assert EvalSettings(n=8).checked().ks == (1, 8) and EvalSettings().checked().ks == ()


def test_sources_are_resolved_or_named(tmp_path):
    with pytest.raises(ValueError, match="no such checkpoint, run directory or model directory"):
        resolve_eval_source(tmp_path / "missing")
    with pytest.raises(ValueError, match="not a checkpoint .* a run directory .* a Hugging Face model directory"):
        resolve_eval_source(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("actor: {}\nrollout: {}\ndata: {}\n")
    with pytest.raises(ValueError, match="neither an hf/ export nor a complete checkpoint"):
        resolve_eval_source(run)
    (run / "hf").mkdir()
    (run / "hf" / "config.json").write_text("{}")
    for given in (run, run / "hf"):
        source = resolve_eval_source(given)
        assert source.model_dir == run / "hf" and source.run_dir == run and source.run_config == run / "config.yaml"


def test_an_sft_run_on_a_synthetic_task_is_evaluated_on_that_task(tmp_path):
    """``hybridrl eval`` of an SFT run: its synthetic task, options and lengths carry over (an SFT config is no RL
    config to evaluate with, so before they did not, and the default task was scored instead)."""
    from hybridrl.config import load_config
    from hybridrl.config.loader import dump_config
    from hybridrl.trainers.eval_source import eval_config
    from hybridrl.utils.tiny_model import save_tiny_model

    model = save_tiny_model(tmp_path / "run" / "hf")
    sft = load_config([f"model.path={model}", "data.synthetic_task=arithmetic_judge", "data.max_response_length=8",
                       "data.synthetic_task_kwargs={operators: '+', max_first_operand: 99, num_val: 20}"],
                      "demo_sft", check_paths=False)
    dump_config(sft, tmp_path / "run")
    source = resolve_eval_source(tmp_path / "run")
    config = eval_config(source, model, ["data.max_prompt_length=20"], None, check_paths=False)
    assert config.data.synthetic_task == "arithmetic_judge" and config.data.max_response_length == 8
    assert dict(config.data.synthetic_task_kwargs) == dict(sft.data.synthetic_task_kwargs)
    assert sft.data.synthetic_task_kwargs["max_first_operand"] == 99
    assert config.data.max_prompt_length == 20  # the user's overrides come last
    assert eval_config(source, model, [], "ppo_trainer", check_paths=False).data.synthetic_task != "arithmetic_judge"
