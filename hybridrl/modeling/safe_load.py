"""Loading checkpoint files without running code from them.

A pickle can call any importable function while it loads, so a checkpoint directory someone else wrote (or tampered
with) must never reach plain ``pickle.load``. Everything hybridrl reads back goes through this module:

- ``.pt`` files (trainer state, LR scheduler, RNG states): :func:`load_tensors` — ``torch.load(weights_only=True)``,
  which only rebuilds tensors and plain containers; a file that needs anything else is refused with the file named.
- ``dcp/.metadata``, the one file ``torch.distributed.checkpoint`` still reads with plain ``pickle``:
  :class:`SafeFileSystemReader` first unpickles it with an allow-list of the metadata classes torch writes there, and
  refuses any other global (e.g. ``os.system``) before torch's own reader sees the file.
- Model weights are safetensors (written by ``export_hf``; ``transformers`` loads ``.bin`` files weights-only).
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader

__all__ = ["UnsafeCheckpointError", "SafeFileSystemReader", "load_tensors", "check_dcp_metadata"]

# Globals a torch.distributed.checkpoint ``.metadata`` pickle refers to (torch 2.6 – 2.13): its own dataclasses, the
# storage index, paths, and torch's size/dtype/layout values.
_ALLOWED_MODULES = ("torch.distributed.checkpoint.metadata",)
_ALLOWED_GLOBALS = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
    ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PureWindowsPath"),
}


class UnsafeCheckpointError(ValueError):
    """A checkpoint file holds something other than tensors and plain data (a pickle payload): it is not loaded."""


def load_tensors(path: str | Path) -> Any:
    """``torch.load(path, weights_only=True)``; a file that needs arbitrary unpickling is refused, naming ``path``."""
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as error:
        first_line = (str(error).strip().splitlines() or [""])[0]
        raise UnsafeCheckpointError(f"{path}: refused to load: it holds more than tensors and plain data, and "
                                    f"loading it could run code ({first_line})") from None


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file: Any, path: str) -> None:
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        allowed = (module in _ALLOWED_MODULES and isinstance(getattr(__import__(module, fromlist=[name]), name, None), type)) \
            or (module, name) in _ALLOWED_GLOBALS \
            or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype))
        if not allowed:
            raise UnsafeCheckpointError(f"{self.path}: refused to load: it refers to {module}.{name}, which a "
                                        "torch.distributed checkpoint's metadata never holds (a pickle payload?)")
        return super().find_class(module, name)


def check_dcp_metadata(path: str | Path) -> None:
    """Unpickle a ``.metadata`` file with the allow-list; raises :class:`UnsafeCheckpointError` on any other global."""
    with open(path, "rb") as file:
        try:
            _MetadataUnpickler(file, str(path)).load()
        except (pickle.UnpicklingError, EOFError) as error:
            raise UnsafeCheckpointError(f"{path}: not a torch.distributed checkpoint metadata file ({error})") from None


class SafeFileSystemReader(FileSystemReader):
    """``FileSystemReader`` that checks ``.metadata`` with :func:`check_dcp_metadata` before torch unpickles it."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        check_dcp_metadata(self._get_metadata_path(kwargs.get("rank")))
        return super().read_metadata(*args, **kwargs)
