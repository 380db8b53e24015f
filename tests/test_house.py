"""The house's shape, held as tests: modules small enough to read whole, names that say what a
file holds without its folder, and the import layers (lint-imports) kept."""

from __future__ import annotations

import shutil
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "src" / "cosmocub"
MAX_LINES = 400
# A package's face and entry point share their names by Python's convention.
CONVENTIONAL = {"__init__.py", "__main__.py"}


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_module_is_at_most_400_lines() -> None:
    long = {
        str(p.relative_to(REPO)): n
        for p in _modules()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_no_two_modules_share_a_name() -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for p in _modules():
        if p.name not in CONVENTIONAL:
            by_name[p.name].append(str(p.relative_to(PACKAGE)))
    shared = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert not shared, f"module names used more than once: {shared}"


def test_import_layers_hold() -> None:
    lint = shutil.which("lint-imports")
    if lint is None:
        pytest.skip("lint-imports is not installed (pip install -e '.[test]')")
    done = subprocess.run([lint], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "BROKEN" not in done.stdout and done.stdout.count("KEPT") >= 4
    assert "perfmodel does not import train KEPT" in done.stdout
