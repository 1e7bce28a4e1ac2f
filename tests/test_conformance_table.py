"""docs/conformance.md: every row marked ``served`` names tests, and every test it names exists.

Pure file reading: the table's rows are split on ``|``; a test is named as
``tests/<path>.py::<function>``.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import ROOT

TABLE = ROOT / "docs" / "conformance.md"
TEST_NAME = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def rows(text: str) -> list[list[str]]:
    """The cells of every table row of ``text`` below a header (separator lines left out)."""
    out = []
    for line in text.splitlines():
        if not line.startswith("|") or set(line) <= {"|", "-", " "}:
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[1:3] == ["one server", "gateway"]:  # a header
            continue
        out.append(cells)
    return out


def missing_tests(cells: list[str], root: Path) -> list[str]:
    """What is wrong with one row: no test named while it says ``served``, or a named test
    that is not defined."""
    named = TEST_NAME.findall(cells[3])
    problems = []
    if "served" in cells[1:3] and not named:
        problems.append(f"{cells[0]}: marked served, names no test")
    for path, function in named:
        file = root / path
        if not file.is_file() or not re.search(rf"^def {function}\(", file.read_text(), re.M):
            problems.append(f"{cells[0]}: {path}::{function} does not exist")
    return problems


def test_every_served_row_names_tests_that_exist() -> None:
    table = rows(TABLE.read_text())
    assert len(table) > 30
    assert all(len(cells) == 5 for cells in table), [c for c in table if len(c) != 5]
    problems = [p for cells in table for p in missing_tests(cells, ROOT)]
    assert problems == []


def test_a_served_row_without_a_test_and_a_test_that_does_not_exist_are_found() -> None:
    text = (
        "| RPC | one server | gateway | tests | notes |\n|---|---|---|---|---|\n"
        "| A | served | not served | | |\n"
        "| B | untested | served | `tests/test_conformance_table.py::no_such_test` | |\n"
        "| C | served | served | `tests/test_conformance_table.py::rows` | |\n"
    )
    found = [p for cells in rows(text) for p in missing_tests(cells, ROOT)]
    assert found == [
        "A: marked served, names no test",
        "B: tests/test_conformance_table.py::no_such_test does not exist",
    ]
