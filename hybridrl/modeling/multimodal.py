"""Images through the policy's forwards (Qwen2-VL-class models): each row's vision inputs and the multimodal rotary
positions (mRoPE) of a micro-batch, in the padded and packed layouts of :mod:`hybridrl.modeling.sequences` and in the
HF engine's generation.

A row with images carries ``Fields.MULTI_MODAL_INPUTS``, a dict of its image processor's outputs:
``pixel_values [patches, C·T·P·P]`` and ``image_grid_thw [images, 3]`` (the temporal, height and width patch counts
of each image); its ``input_ids`` hold ``image_grid_thw.prod() / merge²`` image tokens per image where the image goes.
A micro-batch's rows are concatenated in row order — the order their image tokens appear in, padded or packed.

Positions are the model's own ``get_rope_index`` (``[3, B, L]``: text tokens count up on all three axes; an image's
tokens take its temporal, row and column indices, and the text after it resumes past the largest), computed here and
passed explicitly, so no forward depends on the ``rope_deltas`` a model caches between calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import torch
from torch import nn

from hybridrl.modeling.positions import position_ids_from_mask

VISION_KEYS = ("pixel_values", "image_grid_thw")


def base_model(model: nn.Module) -> nn.Module:
    """``model`` with a PEFT wrapper looked through."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def takes_images(model: nn.Module) -> bool:
    """Whether ``model`` is a vision-language model whose positions this module computes (it has a ``vision_config``
    and its inner model a ``get_rope_index``)."""
    base = base_model(model)
    return getattr(base.config, "vision_config", None) is not None and hasattr(getattr(base, "model", None),
                                                                             "get_rope_index")


def stacked_vision_inputs(rows: Optional[Sequence[Optional[dict]]]) -> Optional[dict[str, torch.Tensor]]:
    """The rows' ``pixel_values`` and ``image_grid_thw`` concatenated in row order (rows without images skipped);
    ``None`` when no row has an image."""
    if rows is None:
        return None
    present = [row for row in rows if row and row.get("image_grid_thw") is not None]
    if not present:
        return None
    return {key: torch.cat([torch.as_tensor(row[key]) for row in present]) for key in VISION_KEYS}


def mrope_positions(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    image_grid_thw: torch.Tensor, response_length: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(positions [3, B, L], deltas [B, 1])`` of left- or right-padded rows: the model's mRoPE indices, and per row
    how far its next text position is from its token count (what a decode step adds to the text position). Image
    tokens are the prompt's: the last ``response_length`` columns are text whatever they hold."""
    base = base_model(model)
    image_tokens = (input_ids == base.config.image_token_id).int()
    if response_length:
        image_tokens[:, -response_length:] = 0
    positions, deltas = base.model.get_rope_index(input_ids, image_tokens, image_grid_thw=image_grid_thw.to(input_ids.device),
                                                  attention_mask=attention_mask)
    return positions.to(input_ids.device), deltas.to(input_ids.device)


def padded_vision_call(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       vision: dict[str, torch.Tensor], response_length: int) -> dict[str, torch.Tensor]:
    """The extra forward keywords of padded rows with images (their last ``response_length`` columns responses):
    the vision inputs and ``position_ids [3, B, L]``."""
    positions, _ = mrope_positions(model, input_ids, attention_mask, vision["image_grid_thw"], response_length)
    return {**vision, "position_ids": positions}


def packed_vision_call(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       vision: Optional[dict[str, torch.Tensor]], response_length: int) -> dict[str, torch.Tensor]:
    """The same for the rows' real tokens packed into one ``[1, N]`` row: ``position_ids [4, 1, N]``, the text
    positions (restarting at each sequence: what the model builds its block-diagonal mask from) before the three
    mRoPE axes. Text-only rows (``vision`` ``None``) need it too: given ``[1, N]`` positions a Qwen2-VL builds no
    per-sequence mask, and packed sequences would attend to each other."""
    real = attention_mask.bool()
    text = position_ids_from_mask(attention_mask)[real]
    if vision is None:
        return {"position_ids": text.view(1, 1, -1).expand(4, 1, -1)}
    positions, _ = mrope_positions(model, input_ids, attention_mask, vision["image_grid_thw"], response_length)
    packed = torch.cat([text.unsqueeze(0), positions[:, real]]).unsqueeze(1)
    return {**vision, "position_ids": packed}


def freeze_vision_tower(model: nn.Module) -> int:
    """Stop the vision tower of a vision-language ``model`` from training (``actor.freeze_vision_tower``); returns
    how many parameters it froze. A model without one is refused."""
    tower = getattr(getattr(base_model(model), "model", None), "visual", None)
    if tower is None:
        raise ValueError(f"actor.freeze_vision_tower: {type(base_model(model)).__name__} has no vision tower")
    tower.requires_grad_(False)
    return sum(parameter.numel() for parameter in tower.parameters())
