"""Shapes of well-known models, so ``hybridrl plan`` works before the weights are on the machine.

A ``model.path`` that is a local directory is read from its ``config.json`` (never downloaded). Otherwise the last
component of the path is matched against the names below (case-insensitive, an ``-Instruct`` suffix ignored), e.g.
``models/Qwen2.5-7B-Instruct`` plans with the Qwen2.5-7B shape. Figures are the models' published configs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from hybridrl.config import ConfigError
from hybridrl.autotune.memory_sizing import DecoderShape

KNOWN_SHAPES: dict[str, DecoderShape] = {
    "qwen2.5-0.5b": DecoderShape(24, 896, 4864, 14, 2, 64, 151936, tie_word_embeddings=True, qkv_bias=True),
    "qwen2.5-1.5b": DecoderShape(28, 1536, 8960, 12, 2, 128, 151936, tie_word_embeddings=True, qkv_bias=True),
    "qwen2.5-3b": DecoderShape(36, 2048, 11008, 16, 2, 128, 151936, tie_word_embeddings=True, qkv_bias=True),
    "qwen2.5-7b": DecoderShape(28, 3584, 18944, 28, 4, 128, 152064, qkv_bias=True),
    "smollm2-135m": DecoderShape(30, 576, 1536, 9, 3, 64, 49152, tie_word_embeddings=True),
    "llama-3.1-8b": DecoderShape(32, 4096, 14336, 32, 8, 128, 128256),
}


def _known_name(path: str) -> Optional[str]:
    name = Path(path).name.lower()
    for suffix in ("-instruct", "-chat"):
        name = name.removesuffix(suffix)
    return name if name in KNOWN_SHAPES else None


def model_shape(path: Optional[str], key: str, trust_remote_code: bool = False) -> Optional[DecoderShape]:
    """The decoder shape of the model at ``path`` (config key ``key``): its local ``config.json``, else a known
    model's published shape; ``None`` when ``path`` is empty.

    Raises:
        ConfigError: naming ``key`` when ``path`` is neither a local model directory nor a known model name.
    """
    if not path:
        return None
    if (Path(path) / "config.json").is_file():
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code, local_files_only=True)
        try:
            return DecoderShape.from_hf_config(config)
        except ValueError as problem:  # a decoder the planner cannot count: say so, naming the key
            error = ConfigError()
            error.add(key, path, str(problem))
            raise error from None
    known = _known_name(path)
    if known is None:
        error = ConfigError()
        error.add(key, path, "has no config.json here and is not a model the planner knows by name "
                             f"({', '.join(sorted(KNOWN_SHAPES))}); point it at a local model directory")
        raise error
    return KNOWN_SHAPES[known]
