"""The documentation: the site builds in strict mode, the README stays short and its links resolve, and the prose
ties measured figures to dates and commits.

``mkdocs build --strict`` with ``mkdocs.yml``'s ``validation`` settings fails on a broken link, a link to a missing
anchor, or a page that is not in the nav (docs/architecture.md is cited by docstrings: its section anchors must hold).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README_MAX_LINES = 250
SESSION = re.compile(r"session [0-9]+", re.IGNORECASE)


TEXT_SUFFIXES = {".md", ".py", ".sh", ".yaml", ".yml", ".toml", ".ipynb", ".json", ".txt", ""}
SKIPPED_DIRS = {".git", ".venv", ".venv-trl", "site", "runs", "build", "__pycache__", ".pytest_cache"}


def prose_files() -> list[Path]:
    """Every text file of the repository (code, tests, configs, docs): none may say how the work was organised."""
    found = []
    for directory, subdirs, files in os.walk(REPO):
        subdirs[:] = [name for name in subdirs if name not in SKIPPED_DIRS and not name.endswith(".egg-info")]
        found += [Path(directory) / name for name in files if Path(name).suffix in TEXT_SUFFIXES]
    return sorted(found)


def test_the_site_builds_in_strict_mode(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")
    pytest.importorskip("material", reason="the docs extra is not installed: pip install -e '.[docs]'")
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                           cwd=REPO, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert build.returncode == 0, f"mkdocs build --strict failed:\n{build.stdout}\n{build.stderr}"
    assert (tmp_path / "site" / "architecture" / "index.html").is_file()


def test_readme_is_short():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move " \
                                           "detail into the docs pages"


def test_readme_links_resolve():
    """The README is read on GitHub, outside the site: its relative links must name files that exist."""
    text = (REPO / "README.md").read_text()
    missing = [target for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
               if "://" not in target and not (REPO / target).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_figures_are_tied_to_dates_and_commits_not_sessions():
    found = [f"{path.relative_to(REPO)}:{number}: {line.strip()}"
             for path in prose_files() for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
             if SESSION.search(line)]
    assert not found, "name the date and the commit a figure was measured at, not a session:\n" + "\n".join(found)
