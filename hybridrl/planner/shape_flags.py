"""A model's shape from ``hybridrl plan`` flags, for a model that is not at hand (no ``config.json``, not a known
name): ``--layers 32 --hidden 4096`` at least; ``--params 7b`` solves the MLP width; everything not given is
assumed Llama-style and said so.

Assumptions (each printed): 128-wide heads (``--heads`` = hidden ÷ 128), as many KV heads as heads (``--kv-heads``),
a 32,000-token vocabulary (``--vocab``), untied embeddings (``--tie-embeddings``), and an MLP width of 8/3 × hidden
rounded up to a multiple of 256 (``--intermediate``) — or, with ``--params``, the width that makes the model that
large.
"""

from __future__ import annotations

import argparse
import re
from typing import Optional

from hybridrl.autotune.decoder_shape import DecoderShape

SHAPE_FLAGS = ("params", "layers", "hidden", "intermediate", "heads", "kv_heads", "vocab")
UNITS = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}


def add_shape_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model shape (a model not at hand; overrides model.path's shape)")
    group.add_argument("--params", default=None, help="parameter count, e.g. 7b or 6.7e9 (solves --intermediate)")
    for flag in ("layers", "hidden", "intermediate", "heads", "kv-heads", "vocab"):
        group.add_argument(f"--{flag}", type=int, default=None)
    group.add_argument("--tie-embeddings", action="store_true", help="the LM head shares the embedding's weights")


def parse_count(text: str) -> int:
    """``7b`` / ``135M`` / ``6.7e9`` → an integer; ``ValueError`` naming the flag otherwise."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmbt]?)\s*", text.lower())
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"--params={text!r}: expected a positive count such as 7b, 135m or 6.7e9")
    return int(float(match.group(1)) * UNITS[match.group(2)])


def shape_from_flags(args: argparse.Namespace) -> Optional[tuple[DecoderShape, list[str]]]:
    """The shape the flags describe and what was assumed; ``None`` when no shape flag was given."""
    given = {name: getattr(args, name, None) for name in SHAPE_FLAGS}
    if all(value is None for value in given.values()) and not getattr(args, "tie_embeddings", False):
        return None
    if given["layers"] is None or given["hidden"] is None:
        raise ValueError("a model shape by flags needs at least --layers and --hidden")
    for name, value in given.items():
        if name != "params" and value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')}={value}: must be a positive integer")
    layers, hidden = given["layers"], given["hidden"]
    assumed = []
    heads = given["heads"] or _assume(assumed, "heads", max(1, hidden // 128), "128-wide heads")
    if hidden % heads:
        raise ValueError(f"--hidden={hidden} is not a multiple of --heads={heads}")
    kv_heads = given["kv_heads"] or _assume(assumed, "kv-heads", heads, "no grouped-query attention")
    if heads % kv_heads:
        raise ValueError(f"--kv-heads={kv_heads} must divide --heads={heads}")
    if given["params"] is not None and given["intermediate"] is not None:
        raise ValueError("give --params or --intermediate, not both (--params solves the MLP width)")
    vocab = given["vocab"] or _assume(assumed, "vocab", 32000, "Llama 2's vocabulary")
    tie = bool(getattr(args, "tie_embeddings", False))
    if not tie:
        assumed.append("untied embeddings (--tie-embeddings to share them)")
    base = DecoderShape(layers, hidden, 1, heads, kv_heads, hidden // heads, vocab, tie_word_embeddings=tie)
    intermediate = given["intermediate"]
    if intermediate is None and given["params"] is not None:
        intermediate = _width_for(base, parse_count(given["params"]))
        assumed.append(f"intermediate={intermediate:,}: the MLP width that makes {given['params']} parameters")
    elif intermediate is None:
        intermediate = _assume(assumed, "intermediate", -(-8 * hidden // 3 // 256) * 256, "8/3 x hidden")
    shape = DecoderShape(layers, hidden, intermediate, heads, kv_heads, hidden // heads, vocab,
                         tie_word_embeddings=tie)
    return shape, assumed


def _assume(assumed: list[str], name: str, value: int, why: str) -> int:
    assumed.append(f"{name}={value:,} ({why})")
    return value


def _width_for(base: DecoderShape, params: int) -> int:
    """The gated MLP width (a multiple of 256) whose model is closest to ``params`` parameters."""
    without_mlp = base.num_parameters() - base.num_layers * 3 * base.hidden_size  # base has width 1
    per_unit = base.num_layers * 3 * base.hidden_size
    if params <= without_mlp:
        raise ValueError(f"--params={params:,} is less than the {without_mlp:,} parameters of the attention and "
                         "embeddings alone at these --layers/--hidden/--vocab")
    return max(256, round((params - without_mlp) / per_unit / 256) * 256)

