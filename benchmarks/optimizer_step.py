"""AdamW's step on CPU: torch's multi-tensor (``foreach``) kernels against its fused kernel, on a real model's shapes.

The update of a GRPO step ends in one AdamW step over every trainable parameter. ``foreach`` launches one kernel per
operation over all tensors (about ten passes over parameters, gradients and both moments); ``fused`` does the whole
update in one pass per tensor. Same arithmetic up to rounding: the script reports the largest difference of the
parameters after the measured steps next to the time ratio. Sides alternate, best-of and median are printed.

    PYTHONPATH=. python benchmarks/optimizer_step.py [--model models/smollm2-135m-instruct] [--steps 10]

Without ``--model`` the shapes are SmolLM2-135M's (a config built in memory, nothing read or downloaded).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.common import machine_info, write_json


def parameter_shapes(model_path: str | None) -> list[torch.Size]:
    """Every parameter shape of the model at ``model_path`` (or of SmolLM2-135M's config), built on the meta device."""
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

    config = AutoConfig.from_pretrained(model_path) if model_path else LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, tie_word_embeddings=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return [param.shape for param in model.parameters()]


def make_side(shapes: list[torch.Size], kind: str, seed: int) -> tuple[list[torch.Tensor], torch.optim.Optimizer]:
    generator = torch.Generator().manual_seed(seed)
    params = [torch.randn(shape, generator=generator).requires_grad_() for shape in shapes]
    for param in params:
        param.grad = torch.randn(param.shape, generator=generator) * 1e-2
    options = {"foreach": True} if kind == "foreach" else {"fused": True}
    return params, torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, **options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    shapes = parameter_shapes(args.model)
    count = sum(shape.numel() for shape in shapes)
    sides = {kind: make_side(shapes, kind, seed=0) for kind in ("foreach", "fused")}
    times: dict[str, list[float]] = {kind: [] for kind in sides}
    for kind, (_, optimizer) in sides.items():
        optimizer.step()  # warm-up: the moments are allocated in the first step
    for _ in range(args.steps):
        for kind, (_, optimizer) in sides.items():  # alternate the sides step by step
            started = time.perf_counter()
            optimizer.step()
            times[kind].append(time.perf_counter() - started)
    difference = max((a - b).abs().max().item() for a, b in zip(sides["foreach"][0], sides["fused"][0]))
    result = {"machine": machine_info(), "parameters": count, "steps": args.steps,
              "seconds": {kind: {"best": min(values), "median": statistics.median(values)}
                          for kind, values in times.items()},
              "max_parameter_difference": difference}
    foreach, fused = (result["seconds"][kind]["median"] for kind in ("foreach", "fused"))
    result["foreach_over_fused_median"] = foreach / fused
    print(f"AdamW step over {count / 1e6:.1f} M parameters (fp32, {torch.get_num_threads()} threads), {args.steps} "
          f"steps each, alternating")
    for kind, values in result["seconds"].items():
        print(f"  {kind:8s} best {values['best']:.3f} s   median {values['median']:.3f} s")
    print(f"  foreach / fused (medians): {result['foreach_over_fused_median']:.2f}x; largest parameter difference "
          f"after {args.steps + 1} steps: {difference:.2e}")
    print(f"  results: {write_json('optimizer_step', result)}")


if __name__ == "__main__":
    main()
