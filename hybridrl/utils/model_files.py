"""What a local Hugging Face model directory says about itself, read from its ``config.json`` without building it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional


def read_model_config(model_path: str) -> Optional[dict]:
    """The directory's ``config.json`` as a dict; ``None`` when it is missing or not JSON (a model path that is not a
    local directory is reported where the model is loaded)."""
    try:
        return json.loads((Path(model_path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def is_vision_language(model_path: str) -> bool:
    """Whether the model at ``model_path`` takes images: its ``config.json`` has a ``vision_config`` (Qwen2-VL,
    Qwen2.5-VL, …)."""
    config = read_model_config(model_path)
    return isinstance(config, dict) and isinstance(config.get("vision_config"), dict)
