"""Which model architectures the installed vLLM serves, and how — answered before any worker starts, without
importing vLLM (about 10 s in a controller that never generates).

vLLM lists its models in ``vllm/model_executor/models/registry.py`` as dict literals from architecture name (a
``config.json`` ``architectures`` entry) to the module that implements it. Two kinds matter here:

- **native**: vLLM's own implementation (``_TEXT_GENERATION_MODELS``, ``_MULTIMODAL_MODELS``);
- **transformers backend** (``_TRANSFORMERS_SUPPORTED_MODELS``, ``_TRANSFORMERS_BACKEND_MODELS``): vLLM wraps
  transformers' own model class and decorates that class for its compiler, in the process the engine runs in. A
  trainer's model of the same class in that process breaks (``'Olmo2Model' object has no attribute
  'do_not_compile'``), so such an architecture can only be served by an engine in a process of its own.

The file is read with ``ast`` (literal dict keys only). When it is missing or its layout changed, the answer is
``None`` — unknown — and nothing is refused on its account.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path
from typing import Literal, Optional

Support = Literal["native", "transformers_backend", "unsupported"]

NATIVE_TABLES = ("_TEXT_GENERATION_MODELS", "_MULTIMODAL_MODELS")
BACKEND_TABLES = ("_TRANSFORMERS_SUPPORTED_MODELS", "_TRANSFORMERS_BACKEND_MODELS")


@functools.lru_cache(maxsize=1)
def _registry_tables() -> Optional[dict[str, frozenset[str]]]:
    """``{table name: architecture names}`` of the installed vLLM's registry, or ``None`` when it cannot be read."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "model_executor" / "models" / "registry.py"
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    tables: dict[str, frozenset[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and isinstance(node.value, ast.Dict):
            keys = [key.value for key in node.value.keys if isinstance(key, ast.Constant) and isinstance(key.value, str)]
            tables[node.targets[0].id] = frozenset(keys)
    if not all(name in tables for name in (*NATIVE_TABLES, BACKEND_TABLES[0])):
        return None
    return tables


def vllm_support(architecture: str) -> Optional[Support]:
    """How the installed vLLM serves ``architecture`` (``"LlamaForCausalLM"``); ``None`` when unknown (no vLLM, or
    a registry this reader does not recognise)."""
    tables = _registry_tables()
    if tables is None:
        return None
    if any(architecture in tables[name] for name in NATIVE_TABLES):
        return "native"
    if any(architecture in tables.get(name, frozenset()) for name in BACKEND_TABLES):
        return "transformers_backend"
    return "unsupported"
