"""The config reference, generated from the schema's attribute docstrings (the string right under each field).

``python -m hybridrl.config.docs`` prints it as Markdown; ``docs/config.md`` is that output, and a test keeps the two
in sync and fails if any field lacks a docstring. ``python -m hybridrl.config.docs verl`` prints ``docs/verl.md``,
the verl → hybridrl key table.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import sys
import typing
from typing import Any, Iterator

from hybridrl.config.schema import TrainConfig
from hybridrl.config.dpo_schema import DPOConfig
from hybridrl.config.rm_schema import RMConfig
from hybridrl.config.sft_schema import SFTConfig


def field_docs(config_class: type) -> dict[str, str]:
    """Map field name → attribute docstring for one dataclass, its dataclass bases' included (a subclass's docstring
    wins); fields without one are absent."""
    docs: dict[str, str] = {}
    for klass in reversed(config_class.__mro__):
        if "__dataclass_fields__" in vars(klass):
            docs.update(_own_field_docs(klass))
    return docs


def _own_field_docs(config_class: type) -> dict[str, str]:
    tree = ast.parse(inspect.getsource(config_class))
    class_node = tree.body[0]
    assert isinstance(class_node, ast.ClassDef)
    docs: dict[str, str] = {}
    body = class_node.body
    for statement, following in zip(body, body[1:]):
        if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)):
            docs[statement.target.id] = " ".join(following.value.value.split())
    return docs


def iter_fields(config_class: type, prefix: str = "") -> Iterator[tuple[str, Any, str, type]]:
    """Yield ``(dotted_key, default, doc, owner_class)`` for every leaf field, depth first."""
    docs = field_docs(config_class)
    hints = typing.get_type_hints(config_class)
    defaults = config_class()
    for config_field in dataclasses.fields(config_class):
        key = f"{prefix}{config_field.name}"
        field_type = hints[config_field.name]
        if dataclasses.is_dataclass(field_type):
            yield from iter_fields(field_type, prefix=f"{key}.")
        else:
            yield key, getattr(defaults, config_field.name), docs.get(config_field.name, ""), config_class


def render_markdown(roots: tuple[tuple[str, type], ...] = (("ppo_trainer", TrainConfig),
                                                            ("sft_trainer", SFTConfig),
                                                            ("rm_trainer", RMConfig),
                                                            ("dpo_trainer", DPOConfig))) -> str:
    """The whole reference as Markdown: per trainer, one table per top-level section."""
    lines = ["# Config reference", "",
             "Generated from `hybridrl/config/*schema.py` by `python -m hybridrl.config.docs`; do not edit by hand.",
             "Override any key on the command line (`hybridrl train actor.optim.lr=1e-6`)."]
    for config_name, root in roots:
        lines += ["", f"# `{config_name}` ({root.__name__})"]
        section = None
        for key, default, doc, _ in iter_fields(root):
            top = key.split(".")[0]
            if top != section:
                section = top
                lines += ["", f"## `{config_name}`: `{section}`", "", "| key | default | meaning |", "|---|---|---|"]
            shown = "null" if default is None else repr(default) if isinstance(default, str) else default
            lines.append(f"| `{key}` | `{shown}` | {doc.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # `verl`: the verl key table (docs/verl.md) instead
    from hybridrl.config.verl_layout import verl_table_markdown

    sys.stdout.write(verl_table_markdown() if sys.argv[1:] == ["verl"] else render_markdown())
