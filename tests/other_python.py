"""Another Python interpreter for the tests of ``rollout.multi_turn.agent_python``: a virtual environment made
without pip (≈ 1 s, nothing downloaded), bare or seeing this environment's packages and this checkout."""

from __future__ import annotations

import site
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def make_venv(directory: Path, *, sees_this_environment: bool) -> Path:
    """A venv at ``directory``; its ``bin/python``. ``sees_this_environment``: a ``.pth`` file puts this
    environment's site-packages and the checkout on its path (as if hybridrl and its dependencies were installed
    there); otherwise it has the standard library only."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(directory)], check=True)
    python = directory / "bin" / "python"
    if sees_this_environment:
        target = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                check=True, capture_output=True, text=True).stdout.strip()
        (Path(target) / "this_environment.pth").write_text("\n".join([*site.getsitepackages(), str(REPO)]) + "\n")
    return python
