"""Running a user's Python file as a module: a reward function file, a plugin that registers components.

The file runs as a fresh module named after the hash of its resolved path (two files with the same name do not
collide), registered in ``sys.modules`` (dataclasses and pickling inside it need that). A file already run in this
process is not run again while its text is unchanged, but an edited file (a reward function changed in a notebook) is
run afresh; the components it registers replace the ones its earlier text registered
(:class:`hybridrl.utils.registry.Registry`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def import_user_file(path: str | Path, key: str) -> ModuleType:
    """The module of the ``.py`` file at ``path`` (run once per process); ``key`` names the config key that gave
    the path in every error (``ValueError``: missing file, not ``.py``, or the import raised)."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"{key}={str(path)!r} does not exist or is not a file")
    if file.suffix != ".py":
        raise ValueError(f"{key}={str(path)!r} must be a .py file")
    resolved = file.resolve()
    module_name = "hybridrl_user_" + hashlib.sha1(str(resolved).encode()).hexdigest()[:12]
    try:
        version = hashlib.sha1(resolved.read_bytes()).hexdigest()  # not the mtime: two writes in a clock tick share it
    except OSError as error:
        raise ValueError(f"{key}={str(path)!r} cannot be read: {error.strerror or error}") from None
    cached = sys.modules.get(module_name)
    if cached is not None and getattr(cached, "__hybridrl_source_sha1__", None) == version:
        return cached
    spec = importlib.util.spec_from_file_location(module_name, resolved)
    if spec is None or spec.loader is None:  # pragma: no cover - only for non-source files, excluded above
        raise ValueError(f"{key}={str(path)!r} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    module.__hybridrl_source_sha1__ = version
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as error:  # a SystemExit in a user file must not end the trainer either
        sys.modules.pop(module_name, None)
        raise ValueError(f"{key}={str(path)!r}: importing it failed: {type(error).__name__}: {error}") from error
    return module


def import_named(name: str, where: str, base: Path | None = None) -> object:
    """The callable ``name`` names — ``module.Name``, ``module:Name`` or ``path/to/file.py:Name`` (a relative path
    from ``base``, default the working directory); ``where`` names the config key or file entry in every error
    (``ValueError``: a malformed name, an import that fails, no such callable)."""
    import importlib

    module_part, separator, attribute = name.rpartition(":")
    if not separator:
        module_part, _, attribute = name.rpartition(".")
    if not module_part or not attribute:
        raise ValueError(f"{where}: {name!r} must be module.Name, module:Name or file.py:Name")
    if module_part.endswith(".py"):
        file = Path(module_part)
        module = import_user_file(file if file.is_absolute() else (base or Path.cwd()) / file, where)
    else:
        try:
            module = importlib.import_module(module_part)
        except Exception as error:  # noqa: BLE001 - a module that is missing or raises while importing
            raise ValueError(f"{where}: importing {module_part!r} failed: {type(error).__name__}: {error}") from None
    target = getattr(module, attribute, None)
    if not callable(target):
        raise ValueError(f"{where}: {module_part!r} has no function or class {attribute!r}")
    return target
