"""The prompt-row schema (verl's) and its validation into a typed :class:`PromptRecord`.

A row, from a file or a synthetic task, looks like::

    {"data_source": "openai/gsm8k",                              # routes the reward function
     "prompt": [{"role": "user", "content": "..."}],             # chat messages, or plain text
     "ability": "math",                                          # optional, free text
     "reward_model": {"style": "rule", "ground_truth": "72"},    # ground_truth is required
     "extra_info": {"split": "train", "index": 0, ...},          # optional, passed to the reward function
     "agent_name": "tool_agent"}                                  # optional (multi-turn): the row's environment

The prompt column is ``data.prompt_key`` (default ``prompt``). Validation errors are ``ValueError``\\ s that start
with the row's location (file and row) and name the offending key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

from hybridrl.data.images import placeholder_count, row_images
from hybridrl.data.chat_roles import sharegpt_hint

__all__ = ["REQUIRED_COLUMNS", "ChatMessages", "PromptRecord", "check_columns", "parse_tools_kwargs", "record_from_row"]

ChatMessages = list[dict[str, str]]
REQUIRED_COLUMNS = ("data_source", "reward_model")
"""Columns every row needs besides the prompt column (``data.prompt_key``)."""


@dataclass(frozen=True)
class PromptRecord:
    """One validated prompt row.

    Attributes:
        data_source: which reward function scores it (``openai/gsm8k``, ``arithmetic``, …).
        prompt: chat messages (``[{"role": ..., "content": ...}, ...]``) or plain text.
        ground_truth: the reference answer handed to the reward function (any JSON value).
        ability: free-text category (may be empty).
        extra_info: row metadata handed to the reward function (may be empty).
        where: the row's location, for error messages (``"train.parquet: row 3"``).
        images: the row's images as given (``data.image_key``; :mod:`hybridrl.data.images`), one per ``<image>``.
    """

    data_source: str
    prompt: Union[ChatMessages, str]
    ground_truth: Any
    ability: str = ""
    extra_info: dict[str, Any] = field(default_factory=dict)
    where: str = "<memory>"
    images: tuple = ()


def check_columns(columns: Sequence[str], prompt_key: str, source: str) -> None:
    """Raise ``ValueError`` naming ``source`` if any required column (or ``prompt_key``) is missing."""
    missing = [name for name in (*REQUIRED_COLUMNS, prompt_key) if name not in columns]
    if missing:
        raise ValueError(f"{source}: missing column(s) {missing}; columns present: {list(columns)}")


def record_from_row(row: Mapping[str, Any], where: str, prompt_key: str = "prompt",
                    image_key: str = "images") -> PromptRecord:
    """Validate one row and return it typed.

    Raises:
        ValueError: starting with ``where``, naming the key, for a missing column, an empty or malformed prompt,
            a missing ``reward_model.ground_truth``, or text that cannot be encoded as UTF-8.
    """
    check_columns(list(row), prompt_key, where)
    data_source = row["data_source"]
    if not isinstance(data_source, str) or not data_source:
        raise ValueError(f"{where}: 'data_source' must be a non-empty string, got {data_source!r}")
    prompt = check_prompt(row[prompt_key], where, prompt_key)
    reward_model = row["reward_model"]
    if not isinstance(reward_model, Mapping) or reward_model.get("ground_truth") is None:
        raise ValueError(f"{where}: 'reward_model' must be a dict with a 'ground_truth', got {reward_model!r}")
    ability = row.get("ability") or ""
    if not isinstance(ability, str):
        raise ValueError(f"{where}: 'ability' must be a string, got {type(ability).__name__}")
    extra_info = row.get("extra_info") or {}
    if not isinstance(extra_info, Mapping):
        raise ValueError(f"{where}: 'extra_info' must be a dict, got {type(extra_info).__name__}")
    extra_info = dict(extra_info)
    if "tools_kwargs" in extra_info:
        extra_info["tools_kwargs"] = parse_tools_kwargs(extra_info["tools_kwargs"], where)
    agent_name = row.get("agent_name")  # verl's multi-turn datasets choose the row's agent loop in this column
    if agent_name is not None:
        if not isinstance(agent_name, str) or not agent_name:
            raise ValueError(f"{where}: 'agent_name' must be a non-empty string, got {agent_name!r}")
        extra_info.setdefault("agent_name", agent_name)
    images = row_images(row, image_key, where)
    if placeholder_count(prompt) != len(images):
        raise ValueError(f"{where}: the prompt has {placeholder_count(prompt)} '<image>' placeholder(s) but "
                         f"{image_key!r} holds {len(images)} image(s); give one image per placeholder, in order")
    return PromptRecord(data_source, prompt, reward_model["ground_truth"], ability, extra_info, where, images)


def parse_tools_kwargs(value: Any, where: str) -> Any:
    """``extra_info.tools_kwargs`` as a mapping ``{tool: {"create_kwargs": {...}}}``: verl's parquet files sometimes
    store it as a JSON string, which is parsed here (else every tool would silently get no row arguments)."""
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else None
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: 'extra_info.tools_kwargs' is a string that is not valid JSON ({error.msg}, "
                             f"char {error.pos}); write it as "
                             '{"<tool name>": {"create_kwargs": {...}}}') from None
    if value is None or isinstance(value, Mapping):
        return value
    raise ValueError(f"{where}: 'extra_info.tools_kwargs' must map tool names to {{'create_kwargs': {{...}}}}, got "
                     f"{type(value).__name__}")


def check_prompt(prompt: Any, where: str, key: str = "prompt") -> ChatMessages | str:
    if isinstance(prompt, str):
        _check_text(prompt, where, key)
        if not prompt.strip():
            raise ValueError(f"{where}: '{key}' is empty")
        return prompt
    if isinstance(prompt, (bytes, bytearray)):
        try:
            return check_prompt(bytes(prompt).decode("utf-8"), where, key)
        except UnicodeDecodeError as error:
            raise ValueError(f"{where}: '{key}' holds bytes that are not valid UTF-8 (offset {error.start})") from None
    if not isinstance(prompt, Sequence) or isinstance(prompt, Mapping):
        raise ValueError(f"{where}: '{key}' must be chat messages or text, got {type(prompt).__name__}")
    if len(prompt) == 0:
        raise ValueError(f"{where}: '{key}' is an empty list of messages")
    messages = [_check_message(message, where, f"{key}[{index}]") for index, message in enumerate(prompt)]
    if not any(message["content"].strip() for message in messages):
        raise ValueError(f"{where}: '{key}' is empty (every message has empty content)")
    return messages


def _check_message(message: Any, where: str, key: str) -> dict[str, str]:
    if not isinstance(message, Mapping):
        raise ValueError(f"{where}: '{key}' must be a dict with 'role' and 'content', got {type(message).__name__}")
    role, content = message.get("role"), message.get("content")
    if role is None and content is None and "from" in message and "value" in message:
        raise ValueError(f"{where}: '{key}' is a ShareGPT-style message ({{'from', 'value'}}): write it as "
                         f"{{'role', 'content'}} with chat roles ({sharegpt_hint()})")
    if not isinstance(role, str) or not role:
        raise ValueError(f"{where}: '{key}.role' must be a non-empty string, got {role!r}")
    if not isinstance(content, str):
        raise ValueError(f"{where}: '{key}.content' must be a string, got {type(content).__name__}")
    _check_text(content, where, f"{key}.content")
    return {"role": role, "content": content}


def _check_text(text: str, where: str, key: str) -> None:
    """Lone surrogates (e.g. a JSON ``"\\ud800"`` escape) are valid ``str`` but not UTF-8; tokenizers choke on them."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        message = f"{where}: '{key}' is not valid UTF-8 text (character {error.start}: {error.reason})"
        raise ValueError(message) from None
