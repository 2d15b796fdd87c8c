"""Loading a user's reward function from a Python file (``custom_reward_function.path`` / ``.name``).

Only the configured file is executed (:func:`hybridrl.utils.user_files.import_user_file`). The function is called
positionally as ``fn(data_source, solution_str, ground_truth, extra_info)``, so any parameter names work, and may
return a number or a dict with a ``"score"`` key plus extras.

:class:`RewardFunctionSource` describes *where* a function comes from rather than holding it, so reward worker
processes can load it themselves: a function defined in a file loaded this way cannot be pickled by reference.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hybridrl.rewards.registry import RewardFn, check_reward_kwargs, default_compute_score
from hybridrl.utils.user_files import import_user_file

__all__ = ["RewardFunctionSource", "load_custom_reward_fn"]


def load_custom_reward_fn(path: str | Path, name: str = "compute_score",
                          reward_kwargs: Mapping[str, Any] | None = None) -> RewardFn:
    """Execute the Python file at ``path`` and return its callable ``name``.

    Raises:
        ValueError: naming ``custom_reward_function.path`` or ``.name`` when the file is missing or not ``.py``,
            importing it fails, ``name`` is not defined there, is not callable, or cannot take the four positional
            arguments ``(data_source, solution_str, ground_truth, extra_info)`` and the keyword arguments
            ``reward_kwargs``.
    """
    module = import_user_file(path, "custom_reward_function.path")
    if not hasattr(module, name):
        defined = sorted(key for key, value in vars(module).items() if callable(value) and not key.startswith("_"))
        raise ValueError(
            f"custom_reward_function.name={name!r} is not defined in {str(path)!r}; callables defined there: {defined}"
        )
    function = getattr(module, name)
    if not callable(function):
        raise ValueError(
            f"custom_reward_function.name={name!r} in {str(path)!r} is a {type(function).__name__}, not callable"
        )
    _check_signature(function, path, name, dict(reward_kwargs or {}))
    return function


def _check_signature(function: RewardFn, path: str | Path, name: str, reward_kwargs: dict[str, Any]) -> None:
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # builtins without a signature: trust them
        return
    try:
        signature.bind("data_source", "solution_str", "ground_truth", {})
    except TypeError as error:
        raise ValueError(
            f"custom_reward_function.name={name!r} in {str(path)!r} must accept 4 positional arguments "
            f"(data_source, solution_str, ground_truth, extra_info); its signature is {signature}: {error}"
        ) from None
    try:
        signature.bind("data_source", "solution_str", "ground_truth", {}, **reward_kwargs)
    except TypeError as error:
        raise ValueError(
            f"custom_reward_function.reward_kwargs={reward_kwargs!r}: {name!r} in {str(path)!r} does not take them "
            f"(its signature is {signature}): {error}"
        ) from None


@dataclass(frozen=True)
class RewardFunctionSource:
    """Where to find a reward function: the built-in registry (``path=None``) or ``name`` in the file ``path``, and
    the keyword arguments it is called with (``custom_reward_function.reward_kwargs``).

    Cheap to pickle: reward worker processes receive this and call :meth:`load` themselves.
    """

    path: str | None = None
    name: str = "compute_score"
    reward_kwargs: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_config(cls, custom_reward_function: Any) -> RewardFunctionSource:
        """From a :class:`~hybridrl.config.reward_schema.CustomRewardConfig` (``path``, ``name``, ``reward_kwargs``)."""
        return cls(custom_reward_function.path or None, custom_reward_function.name,
                   dict(getattr(custom_reward_function, "reward_kwargs", None) or {}))

    def load(self) -> RewardFn:
        """The function, with ``reward_kwargs`` bound: :func:`~hybridrl.rewards.registry.default_compute_score` or
        the file's ``name``.

        Raises:
            ValueError: naming the key, for a bad file or name, or keyword arguments the function does not take.
        """
        keywords = dict(self.reward_kwargs)
        if self.path is None:
            check_reward_kwargs(keywords)
            function = default_compute_score
        else:
            function = load_custom_reward_fn(self.path, self.name, keywords)
        return functools.partial(function, **keywords) if keywords else function

    @property
    def is_builtin(self) -> bool:
        """True for the built-in ``data_source`` router."""
        return self.path is None

    def describe(self) -> str:
        """A short human-readable label for logs and errors."""
        return "built-in reward functions" if self.path is None else f"{self.name} from {self.path}"
