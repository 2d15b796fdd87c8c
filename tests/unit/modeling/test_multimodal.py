"""Images end to end on a tiny random Qwen2-VL and Qwen2.5-VL: verl-layout rows (``images`` column, ``<image>`` placeholders) become
prompts with image tokens and batches with their vision inputs; the HF engine generates from them; and the trainer's
forwards score the generated tokens with the log-probs the engine sampled them at — padded and packed rows, shared
prompt prefill or not — so what is trained is what was generated."""

from __future__ import annotations

import io

import pytest
import torch
from PIL import Image, ImageDraw

from hybridrl.data.dataset import PromptDataset, PromptOptions
from hybridrl.data.images import ImagePrompts
from hybridrl.data.loader import collate_prompts
from hybridrl.modeling.sequences import response_log_probs
from hybridrl.protocol import Fields
from hybridrl.rollout.base import SamplingParams
from hybridrl.rollout.hf import HFRollout
from hybridrl.utils.tiny_vlm import TinyVLMSpec, save_tiny_vlm


def png(size=(56, 56), shapes=1) -> bytes:
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    for index in range(shapes):
        draw.ellipse((4 + 16 * index, 8, 16 + 16 * index, 20), fill="red")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def rows():
    """verl's layout: two rows with one image each (different sizes), one with two, one text-only."""
    row = lambda text, images: {"data_source": "shapes", "prompt": [{"role": "user", "content": text}],
                                "images": images, "reward_model": {"ground_truth": "1"}}
    return [row("<image>how many?", [{"bytes": png(), "path": None}]),
            row("count: <image>", [{"bytes": png((84, 56), 2), "path": None}]),
            row("<image> and <image>?", [{"bytes": png(), "path": None}, {"bytes": png(shapes=3), "path": None}]),
            row("just text", [])]


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl"])
def vlm(request, tmp_path_factory):
    from transformers import AutoTokenizer

    from hybridrl.config.schema import ModelConfig
    from hybridrl.modeling.model_builder import build_model

    path = save_tiny_vlm(tmp_path_factory.mktemp("vlm") / "model", TinyVLMSpec(architecture=request.param))
    model = build_model(ModelConfig(path=str(path), dtype="float32"), "actor").eval()
    return model, AutoTokenizer.from_pretrained(path), ImagePrompts(str(path))


def prompt_batch(vlm):
    _, tokenizer, images = vlm
    dataset = PromptDataset.from_rows(rows(), tokenizer, PromptOptions(max_prompt_length=64, images=images))
    return dataset, collate_prompts(list(dataset), [f"u{i}" for i in range(len(dataset))], tokenizer.pad_token_id,
                                    dataset.images)


def test_rows_become_prompts_with_one_image_token_per_merged_patch(vlm):
    model, tokenizer, _ = vlm
    dataset, batch = prompt_batch(vlm)
    pad = model.config.image_token_id
    counts = [sum(1 for token in prompt.input_ids if token == pad) for prompt in dataset]
    assert counts == [4, 6, 8, 0]  # 56×56: 2×2 merged patches; 84×56: 3×2; two 56×56: 4 + 4
    vision = batch[Fields.MULTI_MODAL_INPUTS]
    assert [None if row is None else row["image_grid_thw"].tolist() for row in vision] == [
        [[1, 4, 4]], [[1, 4, 6]], [[1, 4, 4], [1, 4, 4]], None]


@pytest.mark.parametrize("n", [1, 3], ids=["whole_prompt", "shared_prefill"])
def test_the_trainer_scores_what_the_engine_sampled(vlm, n):
    model, tokenizer, _ = vlm
    _, prompts = prompt_batch(vlm)
    engine = HFRollout(model, pad_token_id=tokenizer.pad_token_id, eos_token_ids=[tokenizer.eos_token_id])
    rollout = engine.generate(prompts, SamplingParams(n=n, max_new_tokens=8, seed=5))
    assert len(rollout[Fields.MULTI_MODAL_INPUTS]) == 4 * n
    mask = rollout[Fields.RESPONSE_MASK].bool()
    for packed in (False, True):
        with torch.no_grad():
            log_probs, _ = response_log_probs(model, rollout[Fields.INPUT_IDS], rollout[Fields.ATTENTION_MASK], 8,
                                              packed=packed, multi_modal=rollout[Fields.MULTI_MODAL_INPUTS])
        gap = (log_probs - rollout[Fields.ROLLOUT_LOG_PROBS]).abs()[mask]
        assert gap.max() < 1e-4, (packed, gap.max())
    # the images matter: without them the same tokens score differently
    with torch.no_grad():
        blind, _ = response_log_probs(model, rollout[Fields.INPUT_IDS], rollout[Fields.ATTENTION_MASK], 8)
    assert (blind - rollout[Fields.ROLLOUT_LOG_PROBS]).abs()[mask].max() > 1e-3


def test_bad_images_are_named(vlm, tmp_path):
    _, tokenizer, images = vlm
    options = PromptOptions(max_prompt_length=64, images=images)
    broken = rows()[:1]
    broken[0]["images"] = [{"bytes": b"not a png", "path": None}]
    with pytest.raises(ValueError, match=r"rows: row 0: image 0: the image cannot be decoded"):
        PromptDataset.from_rows(broken, tokenizer, options)
    missing = rows()[:1]
    missing[0]["images"] = [{"bytes": None, "path": str(tmp_path / "nope.png")}]
    with pytest.raises(ValueError, match=r"rows: row 0: image 0: image file .*nope.png' does not exist"):
        PromptDataset.from_rows(missing, tokenizer, options)
    too_few = rows()[2:3]
    too_few[0]["images"] = too_few[0]["images"][:1]
    with pytest.raises(ValueError, match=r"rows: row 0: the prompt has 2 '<image>' placeholder\(s\) but 'images' "
                                         r"holds 1 image"):
        PromptDataset.from_rows(too_few, tokenizer, options)
    with pytest.raises(ValueError, match=r"rows: row 0: the row has 1 image\(s\).*text-only model"):
        PromptDataset.from_rows(rows()[:1], tokenizer, PromptOptions(max_prompt_length=64))


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_micro_batches_with_images_accumulate_the_whole_batchs_gradients(vlm, packed, mode):
    """Rows with images (and one without) split into micro-batches of one row: the gradients of one pass over the
    whole batch, the loss normalised by the global token count (image tokens are prompt tokens: they count nowhere,
    here as in the reference)."""
    from hybridrl.config.schema import ActorConfig
    from hybridrl.engines.base import TrainingEngine
    from hybridrl.engines.losses import PolicyLoss, SequenceForward
    from hybridrl.engines.micro_batches import DataParallelGroup, MicroBatching

    model, tokenizer, _ = vlm
    _, prompts = prompt_batch(vlm)
    rollout = HFRollout(model, pad_token_id=tokenizer.pad_token_id, eos_token_ids=[tokenizer.eos_token_id]).generate(
        prompts, SamplingParams(n=2, max_new_tokens=6, seed=1))
    rollout[Fields.ADVANTAGES] = torch.linspace(-1, 1, len(rollout)).unsqueeze(1).expand_as(
        rollout[Fields.RESPONSE_MASK]).contiguous()
    rollout[Fields.OLD_LOG_PROBS] = rollout[Fields.ROLLOUT_LOG_PROBS] - 0.05
    loss = PolicyLoss(forward=SequenceForward(packed=packed), temperature=1.0, actor=ActorConfig(loss_agg_mode=mode))
    gradients = []
    for micro_batch_size in (len(rollout), 1):
        model.zero_grad()
        engine = TrainingEngine(model, dp=DataParallelGroup(), micro_batching=MicroBatching(micro_batch_size=micro_batch_size))
        model.train()
        engine.accumulate_gradients(rollout, loss)
        model.eval()
        gradients.append({name: param.grad.clone() for name, param in model.named_parameters() if param.grad is not None})
    whole, split = gradients
    assert whole.keys() == split.keys() and any(name.startswith("model.visual") for name in whole)
    for name, grad in whole.items():
        assert torch.allclose(split[name], grad, rtol=1e-4, atol=1e-7), name


def test_packed_text_rows_of_a_vision_model_stay_apart(vlm):
    """Text-only rows packed into one row on a vision-language model: each sequence attends to itself only, so the
    packed log-probs are the padded ones (given [1, N] positions a Qwen2-VL would build no per-sequence mask)."""
    model, tokenizer, _ = vlm
    _, prompts = prompt_batch(vlm)
    text_rows = prompts.index(torch.tensor([3, 3]))  # the text-only row, twice: a packed leak would change the second
    rollout = HFRollout(model, pad_token_id=tokenizer.pad_token_id, eos_token_ids=[tokenizer.eos_token_id]).generate(
        text_rows, SamplingParams(n=2, max_new_tokens=6, seed=2))
    with torch.no_grad():
        padded, _ = response_log_probs(model, rollout[Fields.INPUT_IDS], rollout[Fields.ATTENTION_MASK], 6,
                                       multi_modal=rollout[Fields.MULTI_MODAL_INPUTS])
        packed, _ = response_log_probs(model, rollout[Fields.INPUT_IDS], rollout[Fields.ATTENTION_MASK], 6,
                                       packed=True, multi_modal=rollout[Fields.MULTI_MODAL_INPUTS])
    mask = rollout[Fields.RESPONSE_MASK].bool()
    assert (packed - padded).abs()[mask].max() < 1e-5
    assert (packed - rollout[Fields.ROLLOUT_LOG_PROBS]).abs()[mask].max() < 1e-4
