"""The README's supported-models table is the architecture grid's (``tests/architecture_grid.py``), not a list kept
by hand: it fails when a family or layout is added to the grid (or dropped) without regenerating the table."""

from __future__ import annotations

from architecture_grid import MODES, ZOO, cases
from readme_tables import README, render_section, supported_models_table


def test_the_readme_table_is_the_grid_the_tests_run():
    text = README.read_text()
    assert render_section(text) == text, "README.md's supported-models table is stale: run python tests/readme_tables.py"


def test_the_table_marks_exactly_the_grid_cases():
    rows = supported_models_table().splitlines()[2:]
    assert len(rows) == len(ZOO)
    marked = {(name, mode) for row, name in zip(rows, ZOO)
              for cell, mode in zip(row.strip("|").split("|")[3:], MODES) if cell.strip() == "✓"}
    assert marked == set(cases()) and len(marked) > 3 * len(ZOO)
