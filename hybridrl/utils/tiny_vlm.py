"""A tiny random Qwen2-VL-class vision-language model with its tokenizer and image processor, built from configs and
saved like a Hugging Face checkpoint — for CPU tests and the VLM demo (nothing downloaded).

The tokenizer is :func:`~hybridrl.utils.tiny_model.build_char_tokenizer`'s with Qwen2-VL's vision tokens added
(``<|vision_start|>``, ``<|image_pad|>``, ``<|vision_end|>``, ``<|video_pad|>``); the image processor is Qwen2-VL's
(14-pixel patches, 2 × 2 merged into one token), sized so that a 56 × 56 image is 4 image tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hybridrl.utils.tiny_model import DEFAULT_CHARACTERS, build_char_tokenizer

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
"""What a prompt's ``<image>`` becomes in Qwen2-VL's chat format (the processor repeats ``<|image_pad|>``)."""


@dataclass(frozen=True)
class TinyVLMSpec:
    """Shape of a tiny Qwen2-VL (``architecture="qwen2_vl"``) or Qwen2.5-VL (``"qwen2_5_vl"``, windowed vision
    attention, a gated MLP in the tower): a text decoder and a vision tower of ``vision_depth`` blocks."""

    architecture: str = "qwen2_vl"
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 1
    intermediate_size: int = 128
    vision_depth: int = 1
    vision_embed_dim: int = 32
    image_pixels: tuple[int, int] = (56 * 56, 112 * 112)
    """The image processor's ``min_pixels`` and ``max_pixels``: images are resized into this range."""


def build_tiny_vlm(spec: TinyVLMSpec, tokenizer, *, seed: int = 0):
    """A randomly initialised ``Qwen2VLForConditionalGeneration`` / ``Qwen2_5_VLForConditionalGeneration`` (fp32)
    for ``tokenizer``'s vocabulary."""
    import torch
    from transformers import (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2VLConfig,
                              Qwen2VLForConditionalGeneration)

    if spec.architecture not in ("qwen2_vl", "qwen2_5_vl"):
        raise ValueError(f"TinyVLMSpec.architecture={spec.architecture!r}: expected qwen2_vl or qwen2_5_vl")
    head_dim = spec.hidden_size // spec.num_heads
    section = [head_dim // 8, 3 * head_dim // 16, 3 * head_dim // 16]  # t, h, w halves of the rotary dims
    token = tokenizer.convert_tokens_to_ids
    tower = dict(depth=spec.vision_depth, num_heads=2, patch_size=14, spatial_merge_size=2, temporal_patch_size=2)
    if spec.architecture == "qwen2_vl":
        config_class, model_class = Qwen2VLConfig, Qwen2VLForConditionalGeneration
        tower.update(embed_dim=spec.vision_embed_dim, hidden_size=spec.hidden_size, mlp_ratio=2)
    else:
        config_class, model_class = Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
        tower.update(hidden_size=spec.vision_embed_dim, intermediate_size=2 * spec.vision_embed_dim,
                     out_hidden_size=spec.hidden_size, window_size=56, fullatt_block_indexes=[spec.vision_depth - 1])
    config = config_class(
        text_config=dict(vocab_size=len(tokenizer), hidden_size=spec.hidden_size, num_hidden_layers=spec.num_layers,
                         num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_kv_heads,
                         intermediate_size=spec.intermediate_size, max_position_embeddings=512,
                         rope_scaling={"type": "mrope", "mrope_section": section},
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None),
        vision_config=tower,
        image_token_id=token("<|image_pad|>"), video_token_id=token("<|video_pad|>"),
        vision_start_token_id=token("<|vision_start|>"), vision_end_token_id=token("<|vision_end|>"),
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
        tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return model_class(config).float()


def build_tiny_image_processor(spec: TinyVLMSpec):
    """Qwen2-VL's image processor (its PIL backend: no torchvision needed) at ``spec``'s image sizes."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    low, high = spec.image_pixels
    return Qwen2VLImageProcessorPil(min_pixels=low, max_pixels=high, patch_size=14, merge_size=2,
                                    temporal_patch_size=2)


def save_tiny_vlm(directory: str | Path, spec: TinyVLMSpec = TinyVLMSpec(), *, seed: int = 0,
                  characters: str = DEFAULT_CHARACTERS) -> Path:
    """Build the tiny VLM, its tokenizer and image processor and save all three into ``directory``."""
    directory = Path(directory)
    tokenizer = build_char_tokenizer(characters, extra_specials=VISION_TOKENS)
    model = build_tiny_vlm(spec, tokenizer, seed=seed)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    build_tiny_image_processor(spec).save_pretrained(directory)
    return directory
