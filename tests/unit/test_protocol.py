"""Tests of the Batch container: validation, field and row operations, round trips, pickling and Ray transfer."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridrl.protocol import Batch, Fields


def make_batch(size: int = 6, meta: dict | None = None) -> Batch:
    """A batch whose row ``i`` is recognisable in every field: ``row == i``, ``uid == f"s{i}"``."""
    rows = torch.arange(size)
    return Batch(
        tensors={
            "row": rows,
            Fields.RESPONSES: rows[:, None] * 10 + torch.arange(4),
            Fields.RESPONSE_MASK: (torch.arange(4) <= rows[:, None] % 4),
            "half": (rows[:, None] + torch.zeros(2)).bfloat16(),
        },
        non_tensors={"uid": [f"s{i}" for i in range(size)], "info": [{"i": i} for i in range(size)]},
        meta={"temperature": 0.7} if meta is None else meta,
    )


def assert_rows(batch: Batch, expected_rows: list[int], source: Batch | None = None) -> None:
    """``batch`` holds exactly rows ``expected_rows`` of ``source`` (default: ``make_batch``) in every field."""
    source = make_batch(max(expected_rows, default=0) + 1) if source is None else source
    assert len(batch) == len(expected_rows)
    assert batch["row"].tolist() == expected_rows
    index = torch.tensor(expected_rows, dtype=torch.int64)
    for key, tensor in source.tensors.items():
        assert batch[key].dtype == tensor.dtype
        assert torch.equal(batch[key], tensor[index]), key
    for key, values in source.non_tensors.items():
        assert batch[key].dtype == object
        assert list(batch[key]) == [values[i] for i in expected_rows], key


def assert_batches_equal(left: Batch, right: Batch) -> None:
    assert left.keys() == right.keys()
    assert_rows(left, right["row"].tolist(), right)
    assert left.meta == right.meta


# --------------------------------------------------------------------------------------------------------------------
# Construction and field access
# --------------------------------------------------------------------------------------------------------------------


def test_construction_validates_batch_size_and_names_the_key():
    with pytest.raises(ValueError, match=r"'b' has batch size 4.*'a' has 3"):
        Batch({"a": torch.zeros(3), "b": torch.zeros(4, 2)})
    with pytest.raises(ValueError, match=r"'uid' has batch size 2.*'a' has 3"):
        Batch({"a": torch.zeros(3)}, {"uid": ["x", "y"]})


@pytest.mark.parametrize(
    "kwargs, error, pattern",
    [
        ({"tensors": {"a": [1, 2]}}, TypeError, "tensors\\['a'\\] is a list"),
        ({"non_tensors": {"a": torch.zeros(2)}}, TypeError, "non_tensors\\['a'\\] is a torch.Tensor"),
        ({"non_tensors": {"a": "abc"}}, TypeError, "'a' must be a sequence"),
        ({"non_tensors": {"a": {"k": 1}}}, TypeError, "'a' must be a sequence"),
        ({"tensors": {"a": torch.tensor(1.0)}}, ValueError, "'a' is 0-dimensional"),
        ({"meta": [("a", 1)]}, TypeError, "meta must be a dict"),
        ({"tensors": {"a": torch.zeros(1)}, "non_tensors": {"a": [1]}}, ValueError, "'a' is given both"),
    ],
)
def test_construction_rejects_wrong_kinds(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        Batch(**kwargs)


def test_mapping_access():
    batch = make_batch(3)
    assert len(batch) == 3
    assert batch.keys() == ["row", Fields.RESPONSES, Fields.RESPONSE_MASK, "half", "uid", "info"]
    assert "uid" in batch and "row" in batch and "missing" not in batch
    assert batch["uid"].tolist() == ["s0", "s1", "s2"]
    with pytest.raises(KeyError, match=r"no field 'missing'.*'row'.*'uid'"):
        batch["missing"]
    with pytest.raises(TypeError, match="not iterable"):
        iter(batch)
    assert len(Batch()) == 0 and Batch().keys() == []


def test_setitem_is_checked_and_switches_kind():
    batch = make_batch(3)
    batch["score"] = torch.ones(3)
    assert torch.equal(batch["score"], torch.ones(3))
    with pytest.raises(ValueError, match=r"'bad' has batch size 2.*has 3"):
        batch["bad"] = torch.ones(2)
    with pytest.raises(ValueError, match=r"'bad' has batch size 4"):
        batch["bad"] = ["a", "b", "c", "d"]
    batch["uid"] = torch.arange(3)  # replacing a non-tensor with a tensor of the same name
    assert "uid" in batch.tensors and "uid" not in batch.non_tensors
    empty = Batch()
    empty["ids"] = np.arange(5)  # the first field sets the size; numeric arrays are stored as object arrays
    assert len(empty) == 5 and empty["ids"].dtype == object
    with pytest.raises(TypeError, match="field names are str"):
        batch[0] = torch.ones(3)


def test_typed_accessors_return_the_field_or_name_it():
    size = 2
    batch = Batch({name: torch.full((size, 3), float(i)) for i, name in enumerate(_tensor_field_names())})
    for i, name in enumerate(_tensor_field_names()):
        assert torch.equal(getattr(batch, name), torch.full((size, 3), float(i))), name
    with pytest.raises(KeyError, match=r"no field 'advantages'.*responses"):
        make_batch(2).advantages
    with pytest.raises(KeyError, match="'advantages' is a non-tensor"):
        Batch(non_tensors={Fields.ADVANTAGES: [1, 2]}).advantages


def _tensor_field_names() -> list[str]:
    names = [v for k, v in vars(Fields).items() if k.isupper() and v not in (Fields.UID, Fields.MULTI_MODAL_INPUTS)]
    assert len(names) == 21
    return names


# --------------------------------------------------------------------------------------------------------------------
# Field-wise operations
# --------------------------------------------------------------------------------------------------------------------


def test_select_keeps_meta_and_shares_storage():
    batch = make_batch(4)
    picked = batch.select("row", "uid")
    assert picked.keys() == ["row", "uid"]
    assert picked.meta == {"temperature": 0.7}
    assert picked["row"].data_ptr() == batch["row"].data_ptr()
    picked.meta["temperature"] = 1.0  # each Batch owns its meta dict
    assert batch.meta["temperature"] == 0.7
    assert batch.select(["row"]).keys() == ["row"]
    with pytest.raises(KeyError, match="select: no field 'nope'"):
        batch.select("row", "nope")
    with pytest.raises(ValueError, match="at least one field"):
        batch.select()


def test_pop_removes_from_self_atomically():
    batch = make_batch(4)
    popped = batch.pop("uid", Fields.RESPONSES)
    assert popped.keys() == [Fields.RESPONSES, "uid"]
    assert "uid" not in batch and Fields.RESPONSES not in batch and "row" in batch
    with pytest.raises(KeyError):
        batch.pop("row", "uid")  # 'uid' is gone: nothing may be removed
    assert "row" in batch


def test_union_merges_and_checks_overlap():
    batch = make_batch(4)
    extra = Batch({"adv": torch.ones(4), "row": torch.arange(4)}, {"uid": [f"s{i}" for i in range(4)]}, {"n": 3})
    merged = batch.union(extra)
    assert set(merged.keys()) == set(batch.keys()) | {"adv"}
    assert merged.meta == {"temperature": 0.7, "n": 3}
    assert "adv" not in batch  # union does not mutate
    nan = Batch({"x": torch.tensor([float("nan"), 1.0, 2.0, 3.0])})
    assert torch.equal(nan.union(nan.clone())["x"][1:], torch.tensor([1.0, 2.0, 3.0]))
    assert len(Batch(meta={"a": 1}).union(batch)) == 4  # a field-less batch contributes meta only


@pytest.mark.parametrize(
    "other, pattern",
    [
        (Batch({"row": torch.arange(4) + 1}), "field 'row' is present in both batches with different values"),
        (Batch({"row": torch.arange(4).int()}), "field 'row' is present in both"),  # dtype differs
        (Batch(non_tensors={"uid": list("abcd")}), "field 'uid' is present in both"),
        (Batch(non_tensors={"row": list(range(4))}), "'row' is a tensor in one batch and a non-tensor"),
        (Batch({"x": torch.zeros(5)}), "different sizes: 4 vs 5"),
        (Batch(meta={"temperature": 1.0}), r"meta\['temperature'\] disagrees"),
    ],
)
def test_union_conflicts_raise(other, pattern):
    with pytest.raises(ValueError, match=pattern):
        make_batch(4).union(other)


def test_with_meta_returns_new_batch_sharing_fields():
    batch = make_batch(2)
    updated = batch.with_meta(temperature=1.0, global_tokens=17)
    assert updated.meta == {"temperature": 1.0, "global_tokens": 17}
    assert batch.meta == {"temperature": 0.7}
    assert updated["row"] is batch["row"]


# --------------------------------------------------------------------------------------------------------------------
# Row operations
# --------------------------------------------------------------------------------------------------------------------

SOURCE_SIZE = 6


@pytest.mark.parametrize(
    "positions, expected",
    [
        (2, [2]),
        (-1, [5]),
        (np.int64(3), [3]),
        (torch.tensor(4), [4]),
        (slice(1, 4), [1, 2, 3]),
        (slice(None, None, 2), [0, 2, 4]),
        (slice(None, None, -2), [5, 3, 1]),
        (slice(10, 20), []),
        (range(3, 0, -1), [3, 2, 1]),
        ([4, 0, 0, -1], [4, 0, 0, 5]),
        ([], []),
        (np.array([1, 5]), [1, 5]),
        (np.array([3, 1], dtype=np.uint8), [3, 1]),
        (torch.tensor([5, 2]), [5, 2]),
        ([True, False, True, False, False, True], [0, 2, 5]),
        (np.array([False] * 5 + [True]), [5]),
        (torch.tensor([True] * 6), [0, 1, 2, 3, 4, 5]),
    ],
)
def test_index_kinds(positions, expected):
    source = make_batch(SOURCE_SIZE)
    for result in (source.index(positions), source[positions]):
        assert_rows(result, expected, source)
        assert result.meta == source.meta


@pytest.mark.parametrize(
    "positions, error, pattern",
    [
        (6, IndexError, "row 6 is out of range"),
        (-7, IndexError, "row -7 is out of range"),
        ([0, 9], IndexError, "row 9 is out of range"),
        ([True, False], ValueError, "mask has 2 entries but the batch has 6"),
        ([0.5, 1.0], TypeError, "integers or bools"),
        (True, TypeError, "bare bool"),
        (torch.zeros(2, 2, dtype=torch.long), ValueError, "must be 1-D"),
        (None, TypeError, "cannot index rows with NoneType"),
    ],
)
def test_index_errors(positions, error, pattern):
    with pytest.raises(error, match=pattern):
        make_batch(SOURCE_SIZE).index(positions)


def test_chunk_then_concat_is_identity_and_chunks_are_views():
    batch = make_batch(6)
    chunks = batch.chunk(3)
    assert [c["row"].tolist() for c in chunks] == [[0, 1], [2, 3], [4, 5]]
    assert chunks[1]["row"].data_ptr() == batch["row"][2:].data_ptr()
    assert_batches_equal(Batch.concat(chunks), batch)
    with pytest.raises(ValueError, match=r"6 rows into 4 .*pad_to_multiple\(4\)"):
        batch.chunk(4)
    with pytest.raises(ValueError, match="num_chunks must be >= 1"):
        batch.chunk(0)


@pytest.mark.parametrize("size, multiple", [(5, 4), (3, 8), (1, 2), (7, 7), (8, 4), (9, 4)])
def test_pad_chunk_concat_unpad_round_trip(size, multiple):
    batch = make_batch(size)
    padded, pad_count = batch.pad_to_multiple(multiple)
    assert pad_count == -size % multiple
    assert len(padded) % multiple == 0
    # padding repeats leading rows cyclically, so it works when size < multiple
    assert padded["row"].tolist() == [i % size for i in range(size + pad_count)]
    gathered = Batch.concat(padded.chunk(multiple))
    assert_batches_equal(gathered.unpad(pad_count), batch)


def test_unpad_validates():
    batch = make_batch(3)
    assert_rows(batch.unpad(0), [0, 1, 2], batch)
    assert len(batch.unpad(3)) == 0
    with pytest.raises(ValueError, match=r"pad_count must be in \[0, 3\], got 4"):
        batch.unpad(4)
    with pytest.raises(ValueError, match="got -1"):
        batch.unpad(-1)


def test_split_sizes():
    batch = make_batch(6)
    parts = batch.split([1, 0, 3, 2])
    assert [p["row"].tolist() for p in parts] == [[0], [], [1, 2, 3], [4, 5]]
    assert_batches_equal(Batch.concat(parts), batch)
    with pytest.raises(ValueError, match=r"sum to 5, but the batch has 6"):
        batch.split([2, 3])
    with pytest.raises(ValueError, match="ints >= 0"):
        batch.split([7, -1])


def test_concat_checks_fields_dtypes_and_meta():
    first, second = make_batch(2), make_batch(3)
    joined = Batch.concat([first, second.with_meta(extra=1)])
    assert joined["row"].tolist() == [0, 1, 0, 1, 2]
    assert joined["uid"].tolist() == ["s0", "s1", "s0", "s1", "s2"]
    assert joined.meta == {"temperature": 0.7, "extra": 1}
    with pytest.raises(ValueError, match=r"batch 1 non-tensor fields differ.*missing \['info'\]"):
        Batch.concat([first, second.select("row", Fields.RESPONSES, Fields.RESPONSE_MASK, "half", "uid")])
    mismatched = second.clone()
    mismatched["half"] = mismatched["half"].float()
    with pytest.raises(ValueError, match="field 'half' of batch 1 is"):
        Batch.concat([first, mismatched])
    with pytest.raises(ValueError, match=r"concat: meta\['temperature'\] disagrees"):
        Batch.concat([first, second.with_meta(temperature=1.0)])
    with pytest.raises(ValueError, match="at least one batch"):
        Batch.concat([])


def test_repeat_interleave_groups_each_row_consecutively():
    batch = make_batch(3)
    repeated = batch.repeat_interleave(2)
    assert_rows(repeated, [0, 0, 1, 1, 2, 2], batch)
    assert_batches_equal(batch.repeat_interleave(1), batch)
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        batch.repeat_interleave(0)


def test_reorder_and_permute():
    batch = make_batch(5)
    order = torch.tensor([3, 0, 4, 1, 2])
    shuffled = batch.reorder(order)
    assert_rows(shuffled, order.tolist(), batch)
    assert_batches_equal(shuffled.permute(torch.argsort(order)), batch)
    with pytest.raises(ValueError, match="permutation of range"):
        batch.reorder([0, 0, 1, 2, 3])
    with pytest.raises(ValueError, match="permutation of range"):
        batch.reorder([0, 1])


# --------------------------------------------------------------------------------------------------------------------
# Devices, copies, size, repr
# --------------------------------------------------------------------------------------------------------------------


def test_to_cpu_contiguous_clone():
    batch = make_batch(3)
    batch["wide"] = torch.arange(12).view(2, 6).t()[:3]  # [3, 2], not contiguous
    assert not batch["wide"].is_contiguous()
    assert batch.contiguous()["wide"].is_contiguous()
    assert torch.equal(batch.contiguous()["wide"], batch["wide"])
    assert batch.to("cpu")["row"].device.type == "cpu" and batch.cpu()["row"] is batch["row"]
    cloned = batch.clone()
    cloned["row"][0] = 100
    cloned["info"][1]["i"] = -1
    cloned.meta["temperature"] = 2.0
    assert batch["row"][0] == 0 and batch["info"][1] == {"i": 1} and batch.meta["temperature"] == 0.7
    assert copy.deepcopy(batch)["info"][1] is not batch["info"][1]
    assert copy.copy(batch)["row"] is batch["row"]


def test_nbytes_and_repr():
    batch = Batch({"ids": torch.zeros(4, 8, dtype=torch.int64), "lp": torch.zeros(4, 8, dtype=torch.bfloat16)})
    assert batch.nbytes == 4 * 8 * 8 + 4 * 8 * 2
    assert batch[:2].nbytes == batch.nbytes // 2
    text = repr(make_batch(2))
    assert text.startswith("Batch(len=2, tensors={row: [2] int64, responses: [2, 4] int64")
    assert "half: [2, 2] bfloat16" in text and "non_tensors=['uid', 'info']" in text and "meta=['temperature']" in text


# --------------------------------------------------------------------------------------------------------------------
# Pickling
# --------------------------------------------------------------------------------------------------------------------

ALL_DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
    torch.float32, torch.float64, torch.float8_e4m3fn, torch.complex64,
]  # fmt: skip


def dtype_batch(size: int = 16) -> Batch:
    generator = torch.Generator().manual_seed(0)
    tensors = {str(d): (torch.randn(size, 32, generator=generator) * 4).to(d) for d in ALL_DTYPES}
    return Batch(tensors, {"uid": [f"u{i}" for i in range(size)], "info": [{"i": i} for i in range(size)]}, {"t": 1})


def test_pickle_moves_tensors_out_of_band():
    batch = dtype_batch(size=64)
    buffers: list[pickle.PickleBuffer] = []
    stream = pickle.dumps(batch, protocol=5, buffer_callback=buffers.append)
    out_of_band = sum(buffer.raw().nbytes for buffer in buffers)
    assert len(buffers) == len(ALL_DTYPES)
    assert out_of_band == batch.nbytes
    in_band_budget = 4096 + 64 * 40  # field names, dtypes, 64 small non-tensor values
    assert len(stream) < in_band_budget < batch.nbytes
    restored = pickle.loads(stream, buffers=buffers)
    _assert_same_content(restored, batch)


def test_pickle_views_and_non_contiguous_tensors():
    batch = dtype_batch(size=64)
    view = batch[10:12]  # a view into a larger storage must only carry its own rows
    buffers: list[pickle.PickleBuffer] = []
    pickle.dumps(view, protocol=5, buffer_callback=buffers.append)
    assert sum(b.raw().nbytes for b in buffers) == view.nbytes == batch.nbytes // 32
    transposed = Batch({"t": torch.arange(12).view(3, 4).t()})
    _assert_same_content(pickle.loads(pickle.dumps(transposed, protocol=5)), transposed)
    _assert_same_content(pickle.loads(pickle.dumps(view)), view)  # default protocol, in band


def _assert_same_content(restored: Batch, original: Batch) -> None:
    assert restored.keys() == original.keys()
    for key, tensor in original.tensors.items():
        assert restored[key].dtype == tensor.dtype, key
        assert restored[key].shape == tensor.shape, key
        assert torch.equal(restored[key].view(torch.uint8), tensor.contiguous().view(torch.uint8)), key  # bitwise
    for key, values in original.non_tensors.items():
        assert restored[key].dtype == object and restored[key].tolist() == values.tolist(), key
    assert restored.meta == original.meta


# --------------------------------------------------------------------------------------------------------------------
# Property test
# --------------------------------------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(size=st.integers(min_value=1, max_value=40), multiple=st.integers(min_value=1, max_value=12))
def test_property_pad_chunk_concat_unpad_is_identity(size, multiple):
    batch = make_batch(size)
    padded, pad_count = batch.pad_to_multiple(multiple)
    chunks = padded.chunk(multiple)
    assert len({len(c) for c in chunks}) == 1
    assert_batches_equal(Batch.concat(chunks).unpad(pad_count), batch)


# --------------------------------------------------------------------------------------------------------------------
# Real Ray round trip
# --------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def local_ray():
    import ray
    from shared_ray import shared_ray_runtime

    shared_ray_runtime()  # the process's private instance (tests/shared_ray.py)
    yield ray


@pytest.mark.distributed
def test_ray_put_get_round_trip(local_ray):
    batch = dtype_batch(size=256)
    restored = local_ray.get(local_ray.put(batch))
    _assert_same_content(restored, batch)
    restored[str(torch.float32)] += 1  # tensors must be writable process memory, not the read-only object store
    assert torch.equal(restored[str(torch.float32)], batch[str(torch.float32)] + 1)  # and the original is untouched
    chunks = local_ray.get([local_ray.put(chunk) for chunk in batch.chunk(4)])
    _assert_same_content(Batch.concat(chunks), batch)


def test_split_every_leaves_a_shorter_last_piece():
    batch = Batch(tensors={"x": torch.arange(7)})
    pieces = batch.split_every(3)
    assert [len(piece) for piece in pieces] == [3, 3, 1]
    assert torch.equal(Batch.concat(pieces)["x"], torch.arange(7))
    with pytest.raises(ValueError):
        batch.split_every(0)


def test_a_batch_survives_a_weights_only_checkpoint(tmp_path):
    """``protocol.state``: the rows an async run queues are saved in its (weights-only) checkpoint; numpy values in
    non-tensor fields (parquet's ``extra_info``) come back as plain Python, tensors bit for bit."""
    import numpy as np

    from hybridrl.protocol.state import batch_from_state, batch_state
    from hybridrl.modeling.safe_load import load_tensors

    batch = Batch({"x": torch.randn(3, 2), Fields.POLICY_VERSION: torch.tensor([4, 4, 5])},
                  {Fields.UID: ["a", "b", "c"],
                   "extra_info": [{"index": np.int64(i), "tags": np.array(["p", "q"])} for i in range(3)]},
                  {"temperature": np.float32(0.5)})
    torch.save(batch_state(batch), tmp_path / "state.pt")
    restored = batch_from_state(load_tensors(tmp_path / "state.pt"))
    assert torch.equal(restored["x"], batch["x"]) and torch.equal(restored.policy_version, batch.policy_version)
    assert list(restored[Fields.UID]) == ["a", "b", "c"]
    assert list(restored["extra_info"]) == [{"index": i, "tags": ["p", "q"]} for i in range(3)]
    assert restored.meta == {"temperature": 0.5}
