"""The run directory's checkpoints: atomic writes, a ``latest`` pointer, keep-last-k, and resume lookup.

Layout::

    <run_dir>/checkpoints/global_step_<k>/actor/...        worker shards (torch.distributed.checkpoint)
                                         /critic/...
                                         /trainer_state.pt  step, data position, KL controller
                                         /manifest.json     every file's size and SHA-256, written last
    <run_dir>/checkpoints/latest                           text: "global_step_<k>", replaced last

A checkpoint is written into ``global_step_<k>.partial`` and renamed when complete; ``latest`` is then replaced
atomically. A crash mid-write leaves the previous checkpoint and pointer untouched, and a ``.partial`` directory is
never picked up. Damage after the write (a truncated or deleted shard, a disk that lost a file) is caught by the
manifest: :func:`verify_checkpoint` runs before every resume and export, and ``resume_mode=auto`` then falls back to
the newest intact checkpoint. A checkpoint written before manifests existed is loaded unverified.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, Optional

import torch

from hybridrl.modeling.safe_load import load_tensors

STEP_PATTERN = re.compile(r"^global_step_(\d+)$")
TRAINER_STATE = "trainer_state.pt"
MANIFEST = "manifest.json"

logger = logging.getLogger(__name__)


class CheckpointManager:
    """Checkpoint directories of one run. ``keep`` = how many complete checkpoints to keep (``None``: all)."""

    def __init__(self, run_dir: str | Path, keep: Optional[int] = None) -> None:
        self.root = Path(run_dir) / "checkpoints"
        self.keep = keep

    def partial_dir(self, step: int) -> Path:
        """Where workers write the checkpoint of ``step`` before it is committed."""
        path = self.root / f"global_step_{step}.partial"
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        return path

    def commit(self, step: int, trainer_state: dict[str, Any]) -> Path:
        """Write the trainer state, rename the partial directory into place, point ``latest`` at it, prune."""
        partial = self.root / f"global_step_{step}.partial"
        torch.save(trainer_state, partial / TRAINER_STATE)
        write_manifest(partial)
        final = self.root / f"global_step_{step}"
        if final.exists():
            shutil.rmtree(final)
        os.replace(partial, final)
        pointer = self.root / "latest.tmp"
        pointer.write_text(final.name)
        os.replace(pointer, self.root / "latest")
        self._prune()
        return final

    def abort(self, step: int, error: BaseException) -> "CheckpointWriteError":
        """Remove the half-written checkpoint of ``step`` after ``error``; returns the error to raise, which names the
        cause and the previous checkpoint (untouched: ``latest`` is only replaced after a complete write)."""
        shutil.rmtree(self.root / f"global_step_{step}.partial", ignore_errors=True)
        cause = "the disk is full (No space left on device)" if _is_disk_full(error) else f"{type(error).__name__}: {error}"
        previous = self.latest()
        kept = f"the previous checkpoint {previous} is intact" if previous else "no earlier checkpoint exists"
        return CheckpointWriteError(f"could not write checkpoint global_step_{step} under {self.root}: {cause}; the "
                                    f"partial write was removed and {kept}. Free space there (or set "
                                    "trainer.max_ckpt_to_keep / trainer.default_local_dir), then resume")

    def sweep_partials(self) -> list[Path]:
        """Delete checkpoints a crash left half-written (``*.partial``); returns what was removed."""
        stale = sorted(self.root.glob("global_step_*.partial")) if self.root.is_dir() else []
        for path in stale:
            shutil.rmtree(path, ignore_errors=True)
        return stale

    def steps(self) -> list[int]:
        """Steps of the complete checkpoints, ascending."""
        if not self.root.is_dir():
            return []
        found = (STEP_PATTERN.match(path.name) for path in self.root.iterdir() if path.is_dir())
        return sorted(int(match.group(1)) for match in found if match)

    def intact_latest(self) -> Optional[Path]:
        """The newest checkpoint that passes :func:`verify_checkpoint` and whose trainer state loads (``latest``
        first), warning about each damaged one skipped; ``None`` if there is none."""
        candidates = [self.latest()] + [self.root / f"global_step_{step}" for step in reversed(self.steps())]
        seen: set[Path] = set()
        for candidate in candidates:
            if candidate is None or candidate in seen or not (candidate / TRAINER_STATE).is_file():
                continue
            seen.add(candidate)
            try:
                verify_checkpoint(candidate)
                load_trainer_state(candidate)  # also catches a damaged state in a checkpoint without a manifest
                return candidate
            except DamagedCheckpointError as damage:
                logger.warning("skipping a damaged checkpoint: %s", damage)
        return None

    def latest(self) -> Optional[Path]:
        """The checkpoint ``latest`` points to, if it is complete; else the newest complete one; else ``None``."""
        pointer = self.root / "latest"
        if pointer.is_file():
            candidate = self.root / pointer.read_text().strip()
            if (candidate / TRAINER_STATE).is_file():
                return candidate
        steps = [step for step in self.steps() if (self.root / f"global_step_{step}" / TRAINER_STATE).is_file()]
        return self.root / f"global_step_{steps[-1]}" if steps else None

    def _prune(self) -> None:
        if self.keep is None:
            return
        for step in self.steps()[:-self.keep]:
            shutil.rmtree(self.root / f"global_step_{step}", ignore_errors=True)


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (disk full, permissions, a worker's write failed); nothing was committed."""


class DamagedCheckpointError(ValueError):
    """A checkpoint's files differ from its manifest (missing, truncated, changed); the message names the file."""


def _files(checkpoint: Path) -> list[Path]:
    return sorted(path for path in checkpoint.rglob("*") if path.is_file() and path.name != MANIFEST)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(checkpoint: Path) -> None:
    """Record every file of ``checkpoint`` (relative path, bytes, SHA-256) in ``manifest.json``, written last."""
    entries = {str(path.relative_to(checkpoint)): {"bytes": path.stat().st_size, "sha256": _sha256(path)}
               for path in _files(checkpoint)}
    temporary = checkpoint / (MANIFEST + ".tmp")
    temporary.write_text(json.dumps({"files": entries}, indent=1, sort_keys=True))
    os.replace(temporary, checkpoint / MANIFEST)


def verify_checkpoint(checkpoint: str | Path) -> bool:
    """Check ``checkpoint`` against its manifest: every listed file present with its size and SHA-256. Returns
    ``False`` (nothing to check) for a checkpoint written before manifests existed; raises
    ``DamagedCheckpointError`` naming the first file that is missing, truncated or changed."""
    checkpoint = Path(checkpoint)
    path = checkpoint / MANIFEST
    if not path.is_file():
        logger.info("checkpoint %s has no %s (written before integrity checks): loaded unverified", checkpoint, MANIFEST)
        return False
    try:
        entries = json.loads(path.read_text())["files"]
    except (ValueError, KeyError, TypeError):
        raise DamagedCheckpointError(f"{path} is not a readable manifest (truncated?)") from None
    for name, entry in sorted(entries.items()):
        file = checkpoint / name
        if not file.is_file():
            raise DamagedCheckpointError(f"checkpoint {checkpoint} is damaged: {name} is missing")
        size = file.stat().st_size
        if size != entry["bytes"]:
            raise DamagedCheckpointError(f"checkpoint {checkpoint} is damaged: {name} has {size} bytes, "
                                         f"{entry['bytes']} were written (truncated?)")
        if _sha256(file) != entry["sha256"]:
            raise DamagedCheckpointError(f"checkpoint {checkpoint} is damaged: {name} changed since it was written "
                                         "(its SHA-256 differs from the manifest's)")
    return True


def _is_disk_full(error: BaseException) -> bool:
    """Whether ``error`` (or what it wraps, e.g. a worker's error carrying the remote traceback) is ENOSPC/EDQUOT."""
    seen: Optional[BaseException] = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(seen) or "Disk quota exceeded" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def load_trainer_state(checkpoint: str | Path) -> dict[str, Any]:
    """The controller's state saved with a checkpoint; a clear error if ``checkpoint`` is not one."""
    path = Path(checkpoint) / TRAINER_STATE
    if not path.is_file():
        raise ValueError(f"{checkpoint} is not a hybridrl checkpoint (no {TRAINER_STATE}); point "
                         "trainer.resume_from_path at a checkpoints/global_step_<k> directory")
    try:
        return load_tensors(path)  # weights-only: a pickle payload is refused
    except (RuntimeError, EOFError) as error:  # torch's reader on a truncated, emptied or overwritten file
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise DamagedCheckpointError(f"checkpoint {checkpoint} is damaged: {TRAINER_STATE} cannot be read "
                                     f"(truncated?): {reason}") from None


def resume_checkpoint(resume_mode: str, run_dir: str | Path, resume_from_path: Optional[str]) -> Optional[Path]:
    """Which checkpoint to resume from: ``auto`` → the run's latest (or none), ``resume_path`` → the given one."""
    if resume_mode == "disable":
        return None
    if resume_mode == "resume_path":
        if not resume_from_path:
            raise ValueError("trainer.resume_mode=resume_path needs trainer.resume_from_path")
        verify_checkpoint(resume_from_path)  # the one asked for: damage is an error, not a fallback
        load_trainer_state(resume_from_path)  # validates
        return Path(resume_from_path)
    return CheckpointManager(run_dir).intact_latest()
