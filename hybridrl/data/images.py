"""Prompts with images (verl's layout, as in its Geometry3K preprocessing): an ``images`` column (``data.image_key``)
holding a list per row of images — each raw bytes, a file path, or a dict ``{"bytes": …, "path": …}`` — and one
``<image>`` in the prompt's text where each goes, in order.

:class:`ImagePrompts` turns them into what a Qwen2-VL-class policy reads: ``<image>`` becomes the model's vision tokens
(``<|vision_start|><|image_pad|><|vision_end|>``, the names read from the model's config), the model's image processor
(saved beside it) gives each image's patches, and ``<|image_pad|>`` is repeated once per merged patch. A dataset keeps
each row's images as given: building it reads each image's header for its size (how many tokens it becomes, by the
processor's resize rule), and its pixels are decoded when its batch is formed (:meth:`ImagePrompts.vision_inputs`),
so a large image set is neither decoded at start-up nor held decoded. An image that is missing or whose header is not
an image's is refused with its row at start-up; one whose pixels are corrupt, with its row when its batch is formed.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from hybridrl.utils.model_files import is_vision_language, read_model_config

PLACEHOLDER = "<image>"


def image_reader(model_path: str) -> Optional["ImagePrompts"]:
    """The image reader of the policy at ``model_path``: an :class:`ImagePrompts` for a vision-language model (its
    ``config.json`` has a ``vision_config``), ``None`` for a text-only one."""
    return ImagePrompts(model_path) if is_vision_language(model_path) else None


def load_image(value: Any, where: str):
    """``value`` (bytes, a path, ``{"bytes", "path"}``, or a PIL image) as an RGB PIL image; ``ValueError`` naming
    ``where`` when it is missing or cannot be decoded."""
    return _decoded(lambda: opened_image(value, where).convert("RGB"), where)


def opened_image(value: Any, where: str):
    """``value`` opened as a PIL image without decoding its pixels (its size is known); ``ValueError`` naming
    ``where`` when it is missing or its header is not an image's."""
    from PIL import Image

    if isinstance(value, Image.Image):
        return value
    if isinstance(value, dict):
        value = value.get("bytes") or value.get("path")
    if isinstance(value, (bytes, bytearray)):
        return _decoded(lambda: Image.open(io.BytesIO(value)), where)
    if isinstance(value, (str, Path)) and str(value):
        if not Path(value).is_file():
            raise ValueError(f"{where}: image file {str(value)!r} does not exist")
        return _decoded(lambda: Image.open(value), where)
    raise ValueError(f"{where}: an image must be bytes, a file path or a dict with 'bytes' or 'path'; got "
                     f"{type(value).__name__}")


def _decoded(read, where: str):
    from PIL import UnidentifiedImageError

    try:
        return read()
    except (UnidentifiedImageError, OSError) as error:
        raise ValueError(f"{where}: the image cannot be decoded ({type(error).__name__}: {error})") from None


def row_images(row: dict, key: str, where: str) -> tuple:
    """The row's images as given (column ``key``; none when it is absent or empty), checked to be a list."""
    value = row.get(key)
    if value is None:
        return ()
    if hasattr(value, "tolist") and not isinstance(value, (bytes, str)):
        value = value.tolist()  # parquet list columns come back as numpy arrays
    if isinstance(value, (dict, bytes, str)):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{where}: {key!r} must be a list of images, got {type(value).__name__}")
    return tuple(value)


def placeholder_count(prompt: Any) -> int:
    """How many ``<image>`` the prompt's text holds (chat messages or plain text)."""
    texts = [prompt] if isinstance(prompt, str) else [message.get("content", "") for message in prompt]
    return sum(text.count(PLACEHOLDER) for text in texts if isinstance(text, str))


class ImagePrompts:
    """A vision-language model's way of reading images: its image processor and its vision token names."""

    def __init__(self, model_path: str) -> None:
        from transformers import AutoImageProcessor

        config = read_model_config(model_path)
        self.processor = AutoImageProcessor.from_pretrained(model_path)
        self.merge = int(getattr(self.processor, "merge_size", 2)) ** 2
        self.token_ids = (config["vision_start_token_id"], config["image_token_id"], config["vision_end_token_id"])

    def with_placeholders(self, prompt: Any, tokenizer: Any) -> Any:
        """``prompt`` with every ``<image>`` replaced by the model's vision tokens (one image pad each)."""
        start, pad, end = tokenizer.convert_ids_to_tokens(list(self.token_ids))
        tokens = start + pad + end
        if isinstance(prompt, str):
            return prompt.replace(PLACEHOLDER, tokens)
        return [{**message, "content": message["content"].replace(PLACEHOLDER, tokens)} for message in prompt]

    def image_tokens(self, images: Sequence[Any], where: str) -> list[int]:
        """How many image tokens each of a row's images becomes, from its size alone (the image's header: its pixels
        are not decoded) by the processor's own resize rule; a missing or unreadable image is refused, named."""
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

        size, patch = self.processor.size, int(self.processor.patch_size)
        counts = []
        for index, image in enumerate(images):
            width, height = opened_image(image, f"{where}: image {index}").size
            rows, columns = smart_resize(height, width, factor=patch * int(self.processor.merge_size),
                                         min_pixels=size.shortest_edge, max_pixels=size.longest_edge)
            counts.append((rows // patch) * (columns // patch) // self.merge)
        return counts

    def vision_inputs(self, images: Sequence[Any], where: str) -> Optional[dict]:
        """``{"pixel_values": [patches, D], "image_grid_thw": [images, 3]}`` of a row's images (``None``: none)."""
        if not images:
            return None
        decoded = [load_image(image, f"{where}: image {index}") for index, image in enumerate(images)]
        processed = self.processor(images=decoded, return_tensors="pt")
        return {"pixel_values": processed["pixel_values"], "image_grid_thw": processed["image_grid_thw"]}

    def expanded(self, ids: Sequence[int], counts: Sequence[int], where: str) -> list[int]:
        """``ids`` with the ``i``-th image pad repeated ``counts[i]`` times (:meth:`image_tokens`); a prompt whose
        text holds the image pad itself (one per image is what ``<image>`` gives) is refused, named by ``where``."""
        pad, out, image = self.token_ids[1], [], 0
        if sum(1 for token in ids if token == pad) != len(counts):
            raise ValueError(f"{where}: the prompt's text holds the model's image pad token itself; write '<image>' "
                             "where an image goes, with the image in the images column")
        for token in ids:
            if token == pad:
                out.extend([pad] * counts[image])
                image += 1
            else:
                out.append(token)
        return out
