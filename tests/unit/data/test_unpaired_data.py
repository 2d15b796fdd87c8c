"""KTO's rows: TRL's unpaired layout (plain and conversational) and paired rows → labelled completions (errors name
file and row), and the mismatched KL completion each KTO row carries."""

from __future__ import annotations

import json

import pytest

from hybridrl.data.unpaired import KTOPair, kto_pairs, label_counts, read_labelled_completions

CHAT = [{"role": "user", "content": "2+2="}]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_unpaired_conversational_and_paired_rows_become_labelled_completions(tmp_path):
    path = write_jsonl(tmp_path / "kto.jsonl", [
        {"prompt": "1+1=", "completion": "2", "label": True},
        {"prompt": CHAT, "completion": [{"role": "assistant", "content": "5"}], "label": False},
        {"prompt": "3+3=", "chosen": "6", "rejected": "7"},      # a pair: its chosen desirable, its rejected not
        {"prompt": "4+4=", "completion": "8", "label": 1},
    ])
    items = read_labelled_completions([path])
    assert [(item.prompt, item.completion, item.desirable) for item in items] == [
        ("1+1=", "2", True), (CHAT, "5", False), ("3+3=", "6", True), ("3+3=", "7", False), ("4+4=", "8", True)]
    rows = kto_pairs(items)
    assert all(isinstance(row, KTOPair) for row in rows) and label_counts(rows) == (3, 2)
    # each row's KL completion: the nearest earlier row's (cyclically) with another prompt
    assert [(row.chosen, row.rejected) for row in rows] == [("2", "8"), ("5", "2"), ("6", "5"), ("7", "5"), ("8", "7")]
    assert "kto.jsonl: row 1 (line 2)" in rows[1].where


@pytest.mark.parametrize(("row", "phrase"), [
    ({"prompt": "p", "completion": "a"}, r"missing column\(s\) \['label'\]: a KTO row needs 'prompt', 'completion' "
                                         r"and 'label'"),
    ({"prompt": "p", "completion": "a", "label": "yes"}, "'label' must be true"),
    ({"prompt": "p", "completion": "a", "label": 2}, "'label' must be true"),
    ({"prompt": "p", "completion": " ", "label": True}, "'completion' is empty"),
    ({"prompt": "p", "completion": [{"role": "user", "content": "a"}], "label": True}, "one assistant message"),
    ({"prompt": "p", "chosen": "a", "rejected": "a"}, "identical"),
    ({"completion": "a", "label": False}, r"missing column\(s\) \['prompt'\]"),
])
def test_bad_kto_rows_name_file_and_row(tmp_path, row, phrase):
    good = {"prompt": "p", "completion": "a", "label": True}
    path = write_jsonl(tmp_path / "kto.jsonl", [good, row])
    with pytest.raises(ValueError, match=phrase) as error:
        read_labelled_completions([path])
    assert "kto.jsonl: row 1 (line 2)" in str(error.value)


def test_rows_of_one_prompt_only_have_no_mismatched_completion(tmp_path):
    path = write_jsonl(tmp_path / "one.jsonl", [{"prompt": "p", "completion": c, "label": c == "a"} for c in "abc"])
    with pytest.raises(ValueError, match="at least two different prompts"):
        kto_pairs(read_labelled_completions([path]), "data.train_files")


def test_a_seeded_kl_pairing_mixes_the_kinds_of_completion_and_never_the_same_prompt():
    """Paired rows unpair as (chosen, rejected) neighbours: rotating by one in data order would give every row the
    previous pair's rejected completion; a seeded order lends both kinds, always from another prompt."""
    from hybridrl.data.unpaired import LabelledCompletion

    items = [LabelledCompletion(f"{n}+1=", answer, desirable) for n in range(40)
             for answer, desirable in ((f"right {n}", True), (f"wrong {n}", False))]
    in_order = kto_pairs(items)
    assert all(row.rejected == items[(2 * (index // 2) - 1) % len(items)].completion
               for index, row in enumerate(in_order))  # always the previous pair's rejected completion
    seeded = kto_pairs(items, seed=1)
    assert seeded == kto_pairs(items, seed=1) and seeded != kto_pairs(items, seed=2)
    desirability = {item.completion: item.desirable for item in items}
    assert {desirability[row.rejected] for row in seeded} == {True, False}  # both kinds of completion lent
    by_completion = {item.completion: item.prompt for item in items}
    assert all(by_completion[row.rejected] != row.prompt for row in seeded)
