"""Configs are validated once at start and then frozen: no stage can quietly change a setting another stage relies on."""

from __future__ import annotations

import dataclasses
from typing import Any


class FrozenConfigError(AttributeError):
    """Raised on an attempt to change a frozen config; derive a new one with ``dataclasses.replace`` instead."""


class FreezableConfig:
    """Mixin for config dataclasses: mutable while being built (Python API, notebooks), immutable after ``freeze()``.

    Plain ``frozen=True`` dataclasses cannot be used: OmegaConf marks their nodes read-only, which blocks YAML merging.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_frozen", False):
            raise FrozenConfigError(
                f"cannot set {type(self).__name__}.{name}: the config is frozen after validation; "
                "build a changed copy with dataclasses.replace(...) and validate it again"
            )
        object.__setattr__(self, name, value)

    def freeze(self) -> "FreezableConfig":
        """Freeze this node and every nested config node (lists and dicts become tuples / read-only views)."""
        for config_field in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, config_field.name)
            if isinstance(value, FreezableConfig):
                value.freeze()
            elif isinstance(value, list):
                object.__setattr__(self, config_field.name, tuple(value))
        object.__setattr__(self, "_frozen", True)
        return self

    @property
    def is_frozen(self) -> bool:
        return self.__dict__.get("_frozen", False)
