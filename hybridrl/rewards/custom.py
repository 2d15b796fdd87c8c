"""Loading a user's reward function from a Python file (``custom_reward_function.path`` / ``.name``).

Only the configured file is executed (:func:`hybridrl.utils.user_files.import_user_file`). The function is called
positionally as ``fn(data_source, solution_str, ground_truth, extra_info)``, so any parameter names work, and may
return a number or a dict with a ``"score"`` key plus extras.

:class:`RewardFunctionSource` describes *where* a function comes from rather than holding it, so reward worker
processes can load it themselves: a function defined in a file loaded this way cannot be pickled by reference.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path

from hybridrl.rewards.registry import RewardFn, default_compute_score
from hybridrl.utils.user_files import import_user_file

__all__ = ["RewardFunctionSource", "load_custom_reward_fn"]


def load_custom_reward_fn(path: str | Path, name: str = "compute_score") -> RewardFn:
    """Execute the Python file at ``path`` and return its callable ``name``.

    Raises:
        ValueError: naming ``custom_reward_function.path`` or ``.name`` when the file is missing or not ``.py``,
            importing it fails, ``name`` is not defined there, is not callable, or cannot take the four positional
            arguments ``(data_source, solution_str, ground_truth, extra_info)``.
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
    _check_signature(function, path, name)
    return function


def _check_signature(function: RewardFn, path: str | Path, name: str) -> None:
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


@dataclass(frozen=True)
class RewardFunctionSource:
    """Where to find a reward function: the built-in registry (``path=None``) or ``name`` in the file ``path``.

    Cheap to pickle: reward worker processes receive this and call :meth:`load` themselves.
    """

    path: str | None = None
    name: str = "compute_score"

    def load(self) -> RewardFn:
        """The function: :func:`~hybridrl.rewards.registry.default_compute_score` or the file's ``name``."""
        if self.path is None:
            return default_compute_score
        return load_custom_reward_fn(self.path, self.name)

    @property
    def is_builtin(self) -> bool:
        """True for the built-in ``data_source`` router."""
        return self.path is None

    def describe(self) -> str:
        """A short human-readable label for logs and errors."""
        return "built-in reward functions" if self.path is None else f"{self.name} from {self.path}"
