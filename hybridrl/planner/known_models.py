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

def _qwen3(layers: int, hidden: int, intermediate: int, heads: int, tied: bool) -> DecoderShape:
    return DecoderShape(layers, hidden, intermediate, heads, 8, 128, 151936, tie_word_embeddings=tied, qk_norm=True)


KNOWN_SHAPES: dict[str, DecoderShape] = {
    "qwen2.5-0.5b": DecoderShape(24, 896, 4864, 14, 2, 64, 151936, tie_word_embeddings=True, qkv_bias=True),
    "qwen2.5-1.5b": DecoderShape(28, 1536, 8960, 12, 2, 128, 151936, tie_word_embeddings=True, qkv_bias=True),
    "qwen2.5-3b": DecoderShape(36, 2048, 11008, 16, 2, 128, 151936, tie_word_embeddings=True, qkv_bias=True),
    "qwen2.5-7b": DecoderShape(28, 3584, 18944, 28, 4, 128, 152064, qkv_bias=True),
    "qwen2.5-14b": DecoderShape(48, 5120, 13824, 40, 8, 128, 152064, qkv_bias=True),
    "qwen2.5-32b": DecoderShape(64, 5120, 27648, 40, 8, 128, 152064, qkv_bias=True),
    "qwen2.5-72b": DecoderShape(80, 8192, 29568, 64, 8, 128, 152064, qkv_bias=True),
    "qwen3-0.6b": _qwen3(28, 1024, 3072, 16, tied=True),
    "qwen3-1.7b": _qwen3(28, 2048, 6144, 16, tied=True),
    "qwen3-4b": _qwen3(36, 2560, 9728, 32, tied=True),
    "qwen3-8b": _qwen3(36, 4096, 12288, 32, tied=False),
    "qwen3-14b": _qwen3(40, 5120, 17408, 40, tied=False),
    "qwen3-32b": _qwen3(64, 5120, 25600, 64, tied=False),
    "smollm2-135m": DecoderShape(30, 576, 1536, 9, 3, 64, 49152, tie_word_embeddings=True),
    "llama-2-7b": DecoderShape(32, 4096, 11008, 32, 32, 128, 32000),
    "llama-2-13b": DecoderShape(40, 5120, 13824, 40, 40, 128, 32000),
    "llama-3-8b": DecoderShape(32, 4096, 14336, 32, 8, 128, 128256),
    "llama-3.1-8b": DecoderShape(32, 4096, 14336, 32, 8, 128, 128256),
    "llama-3.1-70b": DecoderShape(80, 8192, 28672, 64, 8, 128, 128256),
    "llama-3.2-1b": DecoderShape(16, 2048, 8192, 32, 8, 64, 128256, tie_word_embeddings=True),
    "llama-3.2-3b": DecoderShape(28, 3072, 8192, 24, 8, 128, 128256, tie_word_embeddings=True),
    "mistral-7b-v0.1": DecoderShape(32, 4096, 14336, 32, 8, 128, 32000),
    "mistral-7b-v0.3": DecoderShape(32, 4096, 14336, 32, 8, 128, 32768),
    # An encoder reward model, counted as a decoder of its sizes (its MLP has 2 matrices, not 3: 533 M counted for
    # its 435 M parameters, so its memory is planned on the safe side).
    "deberta-v3-large": DecoderShape(24, 1024, 4096, 16, 16, 64, 128100, tie_word_embeddings=True),
}
SUFFIXES = ("-hf", "-instruct", "-chat", "-it", "-base")
"""Endings a published name carries that do not change the shape (``meta-llama/Llama-2-7b-chat-hf`` → llama-2-7b)."""


def _known_name(path: str) -> Optional[str]:
    name = Path(path).name.lower()
    stripped = None
    while stripped != name:
        stripped = name
        for suffix in SUFFIXES:
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
                             f"({', '.join(sorted(KNOWN_SHAPES))}); point it at a local model directory, or give "
                             "its shape to hybridrl plan (--layers, --hidden, --params, ...)")
        raise error
    return KNOWN_SHAPES[known]
