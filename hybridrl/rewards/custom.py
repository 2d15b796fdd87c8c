"""Loading a user's reward function from a Python file (``custom_reward_function.path`` / ``.name``).

Only the configured file is executed (as a fresh module named after the file's hash, so two files with the same name
do not collide). The function is called positionally as ``fn(data_source, solution_str, ground_truth, extra_info)``,
so any parameter names work, and may return a number or a dict with a ``"score"`` key plus extras.

:class:`RewardFunctionSource` describes *where* a function comes from rather than holding it, so reward worker
processes can load it themselves: a function defined in a file loaded this way cannot be pickled by reference.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path

from hybridrl.rewards.registry import RewardFn, default_compute_score

__all__ = ["RewardFunctionSource", "load_custom_reward_fn"]


def load_custom_reward_fn(path: str | Path, name: str = "compute_score") -> RewardFn:
    """Execute the Python file at ``path`` and return its callable ``name``.

    Raises:
        ValueError: naming ``custom_reward_function.path`` or ``.name`` when the file is missing or not ``.py``,
            importing it fails, ``name`` is not defined there, is not callable, or cannot take the four positional
            arguments ``(data_source, solution_str, ground_truth, extra_info)``.
    """
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"custom_reward_function.path={str(path)!r} does not exist or is not a file")
    if file.suffix != ".py":
        raise ValueError(f"custom_reward_function.path={str(path)!r} must be a .py file")
    module = _execute_file(file.resolve())
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


def _execute_file(file: Path):
    """Run ``file`` as a new module registered in ``sys.modules`` (dataclasses and pickling inside it need that)."""
    module_name = "hybridrl_custom_reward_" + hashlib.sha1(str(file).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:  # pragma: no cover - only for non-source files, excluded above
        raise ValueError(f"custom_reward_function.path={str(file)!r} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as error:  # a SystemExit in a user file must not end the trainer either
        sys.modules.pop(module_name, None)
        raise ValueError(
            f"custom_reward_function.path={str(file)!r}: importing it failed: {type(error).__name__}: {error}"
        ) from error
    return module


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
