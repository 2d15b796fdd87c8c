"""The images of a chunk of prompts in the HF engine's generation (:mod:`hybridrl.modeling.multimodal`): their vision
inputs for the forward that runs the prompts, and the mRoPE positions — the prompts' ``[3, b, P]``, from which each
decode step continues one text position at a time on all three axes (a prompt ends in text)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from hybridrl.modeling.multimodal import base_model, mrope_positions, stacked_vision_inputs, takes_images
from hybridrl.protocol import Batch, Fields


@dataclass(frozen=True)
class PromptImages:
    """``inputs``: ``pixel_values`` and ``image_grid_thw`` of the prompts' images, in row order;
    ``prompt_positions [3, b, P]``: the prompts' mRoPE positions."""

    inputs: dict[str, torch.Tensor]
    prompt_positions: torch.Tensor

    @classmethod
    def of(cls, model: nn.Module, prompts: Batch) -> Optional["PromptImages"]:
        """The prompts' images for ``model``; ``None`` when none has an image. Image rows for a text-only model
        are refused."""
        vision = stacked_vision_inputs(prompts.non_tensors.get(Fields.MULTI_MODAL_INPUTS))
        if vision is None:
            return None
        if not takes_images(model):
            raise ValueError(f"prompts with images reached a text-only model ({type(model).__name__})")
        positions, _ = mrope_positions(model, prompts[Fields.INPUT_IDS], prompts[Fields.ATTENTION_MASK],
                                       vision["image_grid_thw"])
        return cls(vision, positions)

    def positions(self, n: int) -> torch.Tensor:
        """The prompts' positions for their ``n`` samples each: ``[3, b·n, P]``."""
        return self.prompt_positions.repeat_interleave(n, dim=1)


VISION_TOKEN_KEYS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")


def vision_token_ids(model: nn.Module) -> list[int]:
    """A vision-language model's image and video placeholder ids (its config's ``*_token_id``); none for text."""
    if not takes_images(model):
        return []
    config = base_model(model).config
    return sorted({value for key in VISION_TOKEN_KEYS if isinstance(value := getattr(config, key, None), int)})
