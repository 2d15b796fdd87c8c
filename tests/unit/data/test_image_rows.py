"""Rows with images in verl's layout, as its Geometry3K preprocessing writes them (a parquet file: ``data_source``
``hiyouga/geometry3k``, an ``<image>`` then the problem in the user message, ``images`` a list of ``{"bytes", "path"}``
structs, ``reward_model.ground_truth``), load for a vision-language policy: prompts with one image token per merged
patch, and batches with each row's image inputs; an image given by file path (JSONL) too. The ``shapes`` synthetic
task writes the same layout, and its answers are only in the pixels."""

from __future__ import annotations

import io

import pytest
from PIL import Image, ImageDraw

from hybridrl.data.dataset import PromptDataset, PromptOptions
from hybridrl.data.images import ImagePrompts
from hybridrl.data.io import write_rows
from hybridrl.data.loader import PromptLoader
from hybridrl.data.shapes import ShapesTask
from hybridrl.protocol import Fields
from hybridrl.rewards.registry import default_compute_score
from hybridrl.utils.tiny_vlm import save_tiny_vlm

INSTRUCTION = " Answer with a number."  # the char tokenizer has no backslash or braces


def diagram(width=84, height=56) -> bytes:
    image = Image.new("RGB", (width, height), "white")
    ImageDraw.Draw(image).polygon([(4, 50), (40, 6), (80, 50)], outline="black")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def geometry3k_row(index: int, image: dict) -> dict:
    problem = "Find x in the triangle."
    return {"data_source": "hiyouga/geometry3k", "ability": "math",
            "prompt": [{"role": "user", "content": "<image>" + problem + INSTRUCTION}], "images": [image],
            "reward_model": {"style": "rule", "ground_truth": "3"},
            "extra_info": {"split": "train", "index": index, "answer": "3", "question": problem}}


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    from transformers import AutoTokenizer

    path = save_tiny_vlm(tmp_path_factory.mktemp("vlm") / "model")
    return AutoTokenizer.from_pretrained(path), ImagePrompts(str(path))


def test_a_geometry3k_parquet_loads_for_a_vision_language_policy(vlm, tmp_path):
    tokenizer, images = vlm
    path = write_rows([geometry3k_row(index, {"bytes": diagram(), "path": None}) for index in range(4)],
                      tmp_path / "geo3k_train.parquet")
    dataset = PromptDataset.from_files([path], tokenizer, PromptOptions(max_prompt_length=96, images=images))
    image_token = images.token_ids[1]
    assert all(prompt.input_ids.count(image_token) == 6 for prompt in dataset)  # 84×56 → 3×2 merged patches
    batch = next(iter(PromptLoader(dataset, 2, pad_token_id=tokenizer.pad_token_id, shuffle=False)))
    vision = batch[Fields.MULTI_MODAL_INPUTS]
    assert [row["image_grid_thw"].tolist() for row in vision] == [[[1, 4, 6]]] * 2
    assert vision[0]["pixel_values"].shape == (24, 3 * 2 * 14 * 14)
    score = default_compute_score("hiyouga/geometry3k", "so x = \\boxed{3}", "3")
    assert (score["score"] if isinstance(score, dict) else score) == 1.0


def test_an_image_given_by_path(vlm, tmp_path):
    tokenizer, images = vlm
    (tmp_path / "d.png").write_bytes(diagram())
    path = write_rows([geometry3k_row(0, {"bytes": None, "path": str(tmp_path / "d.png")})], tmp_path / "t.jsonl")
    dataset = PromptDataset.from_files([path], tokenizer, PromptOptions(max_prompt_length=96, images=images))
    assert dataset[0].input_ids.count(images.token_ids[1]) == 6


def test_the_shapes_task_answers_are_in_the_pixels():
    task = ShapesTask(num_train=32, num_val=16)
    train, val = task.train_rows(), task.validation_rows()
    assert {row["reward_model"]["ground_truth"] for row in train} == {"red", "green", "blue"}
    assert len({row["images"][0]["bytes"] for row in val}) == 16  # every held-out drawing differs
    assert not {row["images"][0]["bytes"] for row in train} & {row["images"][0]["bytes"] for row in val}
    assert task.train_row(5) == task.train_row(5)  # a pure function of (seed, index)
    count = ShapesTask(question="count", max_count=3, num_val=24).validation_rows()
    assert {row["reward_model"]["ground_truth"] for row in count} == {"1", "2", "3"}
    lesson = task.sft_examples(4)
    assert all("<image>" not in str(example.prompt) for example in lesson)  # the format lesson has no images


@pytest.mark.parametrize("size", [(56, 56), (84, 56), (300, 120), (20, 400), (1000, 900)])
def test_token_counts_from_the_image_size_match_the_processor(vlm, size):
    """Start-up counts each image's tokens from its header size alone; they must be what the processor gives when
    the batch is formed (a mismatch would misplace every image token)."""
    _, images = vlm
    image = {"bytes": diagram(*size), "path": None}
    processed = images.vision_inputs([image], "row")
    assert images.image_tokens([image], "row") == [int(processed["image_grid_thw"][0].prod()) // images.merge]
