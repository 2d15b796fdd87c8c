"""A tiny generic name → object registry.

Used wherever a config string selects an implementation (advantage estimators, policy losses, reward functions,
engines). A registry is a read-only ``Mapping[str, T]`` plus a ``register(name)`` decorator, so recipes can add
entries without editing library code::

    POLICY_LOSSES = Registry("policy loss")

    @POLICY_LOSSES.register("my_loss")
    def my_loss(...): ...

    POLICY_LOSSES["my_loss"]        # the function
    POLICY_LOSSES["typo"]           # UnknownNameError: unknown policy loss 'typo'; valid names: ...
    POLICY_LOSSES.names()           # ('my_loss',) — for config validation

Looking up an unknown name raises :class:`UnknownNameError`, which is both a ``KeyError`` (so ``in``, ``.get`` and
every other ``Mapping`` idiom keep working) and a ``ValueError`` (so config validation can catch user mistakes
uniformly), with a message that lists the valid names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Generic, Optional, TypeVar

__all__ = ["Registry", "UnknownNameError"]

T = TypeVar("T")


class UnknownNameError(KeyError, ValueError):
    """An unknown registry name: a ``KeyError`` for ``Mapping`` semantics and a ``ValueError`` for config errors."""

    def __str__(self) -> str:
        # KeyError.__str__ would repr() the message (adding quotes); show it as written.
        return str(self.args[0]) if self.args else ""


class Registry(Mapping[str, T], Generic[T]):
    """An insertion-ordered mapping from names to objects, filled through :meth:`register`.

    Args:
        kind: what the entries are, in words (``"advantage estimator"``); used in error messages.
        check: called as ``check(name, obj)`` on every registration; raises (``TypeError``) for an object that cannot
            serve as an entry, so a wrong plugin fails where it registers, not mid-run.
    """

    def __init__(self, kind: str, check: Optional[Callable[[str, T], None]] = None) -> None:
        self.kind = kind
        self.check = check
        self._entries: dict[str, T] = {}

    def register(self, name: str, *, override: bool = False) -> Callable[[T], T]:
        """Return a decorator that registers its argument under ``name`` and returns it unchanged.

        Registering a different object under a taken name raises ``ValueError`` unless ``override=True``.
        Re-registering the very same object is a no-op, and a new definition of the same module-level name
        (``module.Name``) replaces the old one: a module run again — an edited plugin file, ``importlib.reload`` —
        registers its new objects without an error.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} name must be a non-empty string, got {name!r}")

        def decorator(obj: T) -> T:
            if self.check is not None:
                self.check(name, obj)
            existing = self._entries.get(name, obj)
            if existing is not obj and not override and not _redefinition(existing, obj):
                raise ValueError(
                    f"{self.kind} {name!r} is already registered ({existing!r}); pass override=True to replace it"
                )
            self._entries[name] = obj
            return obj

        return decorator

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order (for config validation and help texts)."""
        return tuple(self._entries)

    def __getitem__(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownNameError(f"unknown {self.kind} {name!r}; valid names: {', '.join(self._entries)}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={list(self._entries)})"


def _redefinition(existing: object, new: object) -> bool:
    """Whether ``new`` is the same module-level definition as ``existing`` made again (its module re-run): the same
    ``__module__`` and ``__qualname__``, and not an object local to a function (a lambda, a nested class)."""
    module, qualname = getattr(new, "__module__", None), getattr(new, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
        return False
    return getattr(existing, "__module__", None) == module and getattr(existing, "__qualname__", None) == qualname
