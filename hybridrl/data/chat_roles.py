"""Roles a chat template renders: a message whose role the template does not know is refused before training.

A template renders an unknown role as whatever its ``else`` branch makes of it, or drops the message, without a word
— ShareGPT-style data's ``gpt`` would train as some other role. Known roles are :data:`CHAT_ROLES` and any role the
template's own source names in quotes (``'ipython'``). Used for SFT rows, PPO-ptx rows and RL prompts alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

CHAT_ROLES = ("system", "user", "assistant", "tool")
"""The roles every chat template is written for; a template may know more (it names them, e.g. ``'ipython'``)."""
SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "observation": "tool", "function_call": "assistant"}
"""ShareGPT-style data's roles (its ``from`` values) and the chat roles they stand for."""


def sharegpt_hint() -> str:
    """How ShareGPT-style roles are written as chat roles: ``'human' as 'user', 'gpt' as 'assistant', …``."""
    return ", ".join(f"{theirs!r} as {ours!r}" for theirs, ours in SHAREGPT_ROLES.items())


def template_source(tokenizer: Any) -> str:
    """The tokenizer's chat template text (every named template of a mapping, joined); empty when it has none."""
    template = getattr(tokenizer, "chat_template", None)
    return " ".join(template.values()) if isinstance(template, Mapping) else str(template or "")


def check_roles(template: str, messages: Sequence[Any], where: str, key: str) -> None:
    """``ValueError`` naming ``where``, ``key[index]`` and the role when a message of ``messages`` has a role the
    chat template (its source: :func:`template_source`) does not know."""
    for index, message in enumerate(messages):
        role = message.get("role") if isinstance(message, Mapping) else None
        if role in CHAT_ROLES or f"'{role}'" in template or f'"{role}"' in template:
            continue
        hint = f"; ShareGPT-style rows: write the roles as chat roles ({sharegpt_hint()})" \
            if role in SHAREGPT_ROLES else ""
        raise ValueError(f"{where}: {key}[{index}].role={role!r} is not a role the chat template knows "
                         f"({', '.join(CHAT_ROLES)}, or one it names){hint}")
