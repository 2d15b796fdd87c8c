"""Prompt batching: layout, epochs, shuffling, drop_last, exact resume (mid-epoch and at an epoch boundary)."""

from __future__ import annotations

import pytest
import torch
from data_helpers import make_row
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hybridrl.config.schema import DataConfig
from hybridrl.data import (
    DataFields,
    PromptDataset,
    PromptLoader,
    PromptOptions,
    TokenizedPrompt,
    build_prompt_loaders,
)
from hybridrl.data.io import write_rows
from hybridrl.protocol import Fields


def _rows(count: int) -> list[dict]:
    """Rows whose prompts have different lengths (``i+i=`` with i of 1–3 digits) and ground truth ``2i``."""
    return [make_row(f"{i}+{i}=", str(2 * i), extra_info={"index": i}) for i in range(count)]


@pytest.fixture(scope="module")
def dataset(char_tokenizer) -> PromptDataset:
    return PromptDataset.from_rows(_rows(23), char_tokenizer, PromptOptions(), name="train")


def _loader(dataset, batch_size=4, **kwargs) -> PromptLoader:
    return PromptLoader(dataset, batch_size, pad_token_id=0, seed=kwargs.pop("seed", 7), **kwargs)


def _signature(batch) -> tuple:
    """What identifies a batch: its uids and token ids."""
    return tuple(batch[Fields.UID]), batch[Fields.INPUT_IDS].tolist()


def _take(loader: PromptLoader, count: int) -> list[tuple]:
    """The next ``count`` batches, crossing epochs like a trainer loop does."""
    taken = []
    while len(taken) < count:
        for batch in loader:
            taken.append(_signature(batch))
            if len(taken) == count:
                break
    return taken


def test_batch_layout_is_left_padded_with_all_fields(char_tokenizer):
    dataset = PromptDataset.from_rows(_rows(3)[::-1][:1] + _rows(200)[150:151] + _rows(1), char_tokenizer, name="train")
    batch = next(iter(_loader(dataset, batch_size=3, shuffle=False)))
    ids, mask = batch[Fields.INPUT_IDS], batch[Fields.ATTENTION_MASK]
    lengths = [len(prompt.input_ids) for prompt in dataset]
    assert ids.shape == (3, max(lengths)) and ids.dtype == mask.dtype == torch.long
    assert mask.sum(dim=1).tolist() == lengths
    for row, prompt in enumerate(dataset):
        assert ids[row, ids.shape[1] - lengths[row]:].tolist() == list(prompt.input_ids)
        assert ids[row, : ids.shape[1] - lengths[row]].eq(0).all() and mask[row, -1] == 1
    assert list(batch[DataFields.GROUND_TRUTH]) == ["4", "300", "0"]
    assert list(batch[DataFields.DATA_SOURCE]) == ["arithmetic"] * 3
    assert batch[DataFields.EXTRA_INFO][1] == {"index": 150}
    assert batch[DataFields.RAW_PROMPT][0] == "<|user|>2+2=<|assistant|>"
    assert list(batch[Fields.UID]) == ["train-0-e0", "train-1-e0", "train-2-e0"]


def test_drop_last_steps_and_epoch_coverage(dataset):
    loader = _loader(dataset, batch_size=4)
    assert loader.steps_per_epoch == len(loader) == 5  # 23 // 4; 3 prompts sit out each epoch
    seen_per_epoch = []
    for _ in range(3):
        batches = list(loader)
        assert len(batches) == 5 and all(len(batch) == 4 for batch in batches)
        seen = [int(uid.split("-")[1]) for batch in batches for uid in batch[Fields.UID]]
        assert len(set(seen)) == 20
        seen_per_epoch.append(frozenset(seen))
    assert len(set(seen_per_epoch)) > 1  # a different remainder sits out in different shuffled epochs


def test_without_drop_last_the_last_batch_is_short(dataset):
    loader = _loader(dataset, batch_size=4, shuffle=False, drop_last=False)
    sizes = [len(batch) for batch in loader]
    assert sizes == [4, 4, 4, 4, 4, 3] and loader.steps_per_epoch == 6
    assert [uid for batch in loader for uid in batch[Fields.UID]][:2] == ["train-0-e1", "train-1-e1"]


def test_shuffle_is_seeded_and_differs_per_epoch(dataset):
    first, again, other_seed = _loader(dataset), _loader(dataset), _loader(dataset, seed=8)
    assert first.epoch_order(0) == again.epoch_order(0)
    assert first.epoch_order(0) != first.epoch_order(1)
    assert first.epoch_order(0) != other_seed.epoch_order(0)
    assert sorted(first.epoch_order(3)) == list(range(23))
    assert _loader(dataset, shuffle=False).epoch_order(5) == list(range(23))
    assert _take(first, 12) == _take(again, 12)


@pytest.mark.parametrize("consumed", [1, 3, 7, 11])
def test_resume_sees_exactly_the_remaining_batches(dataset, consumed):
    uninterrupted = _take(_loader(dataset), 15)
    interrupted = _loader(dataset)
    before = _take(interrupted, consumed)
    state = interrupted.state_dict()
    resumed = _loader(dataset)
    resumed.load_state_dict(state)
    assert before + _take(resumed, 15 - consumed) == uninterrupted


def test_resume_exactly_at_an_epoch_boundary_trains_the_next_epoch(dataset):
    uninterrupted = _take(_loader(dataset), 10)
    loader = _loader(dataset)
    first_epoch = [_signature(batch) for batch in loader]
    state = loader.state_dict()
    assert (state["epoch"], state["position"]) == (1, 0)
    resumed = _loader(dataset)
    resumed.load_state_dict(state)
    next_epoch = [_signature(batch) for batch in resumed]
    assert len(next_epoch) == resumed.steps_per_epoch == 5  # not an empty epoch
    assert first_epoch + next_epoch == uninterrupted
    assert all(uid.endswith("-e1") for uid in next_epoch[0][0])


def test_a_state_saved_at_the_end_of_an_epoch_resumes_with_the_next(dataset):
    loader = _loader(dataset)
    state = dict(loader.state_dict(), epoch=2, position=loader.steps_per_epoch)  # as another trainer might store it
    loader.load_state_dict(state)
    assert (loader.epoch, loader.position) == (3, 0)
    assert len(list(loader)) == 5


def test_breaking_out_and_iterating_again_continues(dataset):
    uninterrupted = _take(_loader(dataset), 6)
    loader = _loader(dataset)
    head = []
    for batch in loader:
        head.append(_signature(batch))
        if len(head) == 2:
            break
    assert (loader.epoch, loader.position) == (0, 2)
    assert head + _take(loader, 4) == uninterrupted


@pytest.mark.parametrize(("key", "value"), [("num_prompts", 24), ("batch_size", 8), ("seed", 3), ("shuffle", False)])
def test_resuming_with_a_different_setup_is_refused(dataset, key, value):
    loader = _loader(dataset)
    with pytest.raises(ValueError, match=f"prompt loader state: {key}={value!r} when saved"):
        loader.load_state_dict(dict(loader.state_dict(), **{key: value}))


def test_incomplete_or_out_of_range_state_is_refused(dataset):
    loader = _loader(dataset)
    state = loader.state_dict()
    with pytest.raises(ValueError, match=r"missing key\(s\) \['position'\]"):
        loader.load_state_dict({k: v for k, v in state.items() if k != "position"})
    with pytest.raises(ValueError, match="position=6 out of range"):
        loader.load_state_dict(dict(state, position=6))


def test_dataset_smaller_than_one_batch_is_refused(dataset):
    with pytest.raises(ValueError, match=r"23 prompts .* fewer than one batch of 32 \(data.train_batch_size\)"):
        _loader(dataset, batch_size=32)
    assert _loader(dataset, batch_size=32, drop_last=False).steps_per_epoch == 1


def test_build_prompt_loaders_from_files(tmp_path, char_tokenizer):
    train = write_rows(_rows(10), tmp_path / "train.parquet")
    val = write_rows(_rows(5), tmp_path / "val.jsonl")
    config = DataConfig(train_files=[str(train)], val_files=[str(val)], train_batch_size=4, shuffle=False).freeze()
    loaders = build_prompt_loaders(config, char_tokenizer)
    assert loaders.train.steps_per_epoch == 2 and len(next(iter(loaders.train))) == 4
    val_batches = list(loaders.val)
    # val_batch_size=null: batches of train_batch_size, the last one partial (nothing dropped)
    assert [len(batch) for batch in val_batches] == [4, 1]
    assert list(val_batches[0][Fields.UID])[0] == "val-0-e0"
    assert build_prompt_loaders(DataConfig(train_files=[str(train)], train_batch_size=4), char_tokenizer).val is None


def test_build_prompt_loaders_synthetic(char_tokenizer):
    config = DataConfig(synthetic_task="arithmetic", train_batch_size=16, val_batch_size=64, seed=3)
    loaders = build_prompt_loaders(config, char_tokenizer)
    batch = next(iter(loaders.train))
    assert set(batch[DataFields.DATA_SOURCE]) == {"arithmetic"}
    assert batch[Fields.INPUT_IDS].shape[0] == 16
    assert len(loaders.val.dataset) == 256 and loaders.val.steps_per_epoch == 4
    train_prompts = {prompt.raw_prompt for prompt in loaders.train.dataset}
    assert not train_prompts & {prompt.raw_prompt for prompt in loaders.val.dataset}


def test_build_prompt_loaders_refuses_conflicting_or_missing_sources(tmp_path, char_tokenizer):
    train = write_rows(_rows(4), tmp_path / "train.jsonl")
    with pytest.raises(ValueError, match="data.synthetic_task='arithmetic' and data.train_files are both set"):
        build_prompt_loaders(DataConfig(synthetic_task="arithmetic", train_files=[str(train)]), char_tokenizer)
    with pytest.raises(ValueError, match="data.train_files is empty and data.synthetic_task is not set"):
        build_prompt_loaders(DataConfig(), char_tokenizer)
    with pytest.raises(ValueError, match="data.synthetic_task='sudoku' is unknown; valid names: arithmetic"):
        build_prompt_loaders(DataConfig(synthetic_task="sudoku"), char_tokenizer)


def test_next_iter_per_step_walks_the_same_sequence_across_epochs(dataset):
    uninterrupted = _take(_loader(dataset), 12)
    loader = _loader(dataset)
    assert [_signature(next(iter(loader))) for _ in range(12)] == uninterrupted
    assert (loader.epoch, loader.position) == (2, 2)


@settings(max_examples=40, deadline=None)
@given(num_prompts=st.integers(1, 30), batch_size=st.integers(1, 8), drop_last=st.booleans(),
       seed=st.integers(0, 3), consumed_fraction=st.floats(0, 1))
def test_resume_property(num_prompts, batch_size, drop_last, seed, consumed_fraction):
    """For any dataset/batch size and any interruption point (epoch boundaries included), resume is exact."""
    assume(num_prompts >= batch_size or not drop_last)
    prompts = [TokenizedPrompt(i, tuple(range(1, 2 + i % 5)), f"p{i}", "arithmetic", str(i))
               for i in range(num_prompts)]
    dataset = PromptDataset(prompts, name="train")

    def make() -> PromptLoader:
        return PromptLoader(dataset, batch_size, pad_token_id=0, seed=seed, drop_last=drop_last)

    total = 3 * make().steps_per_epoch
    consumed = round(consumed_fraction * total)
    uninterrupted = _take(make(), total)
    first = make()
    head = _take(first, consumed)
    resumed = make()
    resumed.load_state_dict(first.state_dict())
    assert head + _take(resumed, total - consumed) == uninterrupted
