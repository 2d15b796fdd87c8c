"""``trainer.plugins``: the user's files and modules that register components, run before validation.

Each entry is a ``.py`` file (run once per process, :func:`hybridrl.utils.user_files.import_user_file`) or the name of
an importable module. They run in the controller before the config is validated — so the names they register are
accepted — and again in every worker process before it builds anything, so the workers find them too. Validation makes
the file paths absolute; the files must exist on every node a worker runs on.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Sequence

from hybridrl.config.errors import PREFORMATTED, ConfigError
from hybridrl.utils.user_files import import_user_file


def is_file_entry(plugin: str) -> bool:
    """A ``trainer.plugins`` entry naming a file (else an importable module)."""
    return plugin.endswith(".py") or "/" in plugin


def resolved_plugins(plugins: Sequence[str]) -> list[str]:
    """The entries with every file path made absolute (against this process's directory), so the worker processes,
    which may start elsewhere, find the same files."""
    return [str(Path(plugin).resolve()) if is_file_entry(plugin) else plugin for plugin in plugins]


def load_plugins(plugins: Sequence[str]) -> None:
    """Run every entry of ``trainer.plugins``; a ``ConfigError`` naming the key and the entry when one fails."""
    error = ConfigError()
    for plugin in plugins:
        try:
            if is_file_entry(plugin):
                import_user_file(plugin, "trainer.plugins")
            else:
                importlib.import_module(plugin)
        except ValueError as failure:
            error.add("trainer.plugins", PREFORMATTED, str(failure))
        except Exception as failure:  # an importable module that raises while importing
            error.add("trainer.plugins", plugin, f"importing it failed: {type(failure).__name__}: {failure}")
    error.raise_if_any()
