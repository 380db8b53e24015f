"""The house's layers (pyproject.toml's import-linter contracts) and its private names hold."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "cosmocub"


def test_lint_imports_keeps_every_contract():
    exe = shutil.which("lint-imports")
    if exe is None:
        pytest.fail("lint-imports not found: install the test extra (pip install -e '.[test]')")
    done = subprocess.run(
        [exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def _private_imports(path: Path, *, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cosmocub"):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(
                        f"{path.relative_to(root)}:{node.lineno}: {node.module}.{alias.name}"
                    )
    return found


def test_no_private_name_is_imported_across_modules():
    found = [hit for path in sorted(SRC.rglob("*.py")) for hit in _private_imports(path)]
    assert found == []


def test_the_private_import_check_sees_one(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from cosmocub.io import _remove\nfrom cosmocub.io import atomic_path\n")
    assert _private_imports(bad, root=tmp_path) == ["bad.py:1: cosmocub.io._remove"]


def _snakefile_imports() -> list[str]:
    """The cosmocub import statements of the Snakefile and its rules, as written."""
    statements = []
    for path in [ROOT / "Snakefile", *sorted((ROOT / "workflow" / "rules").glob("*.smk"))]:
        lines = iter(path.read_text().splitlines())
        for line in lines:
            if line.startswith(("from cosmocub", "import cosmocub")):
                statement = [line]
                while "".join(statement).count("(") > "".join(statement).count(")"):
                    statement.append(next(lines))
                statements.append("\n".join(statement))
    return statements


def test_parsing_the_snakefile_imports_no_torch():
    """Every Snakemake invocation parses the Snakefile, and under a cluster profile every job
    does it twice: importing torch there cost 2.3 s of a dry run's 4.6 s of CPU."""
    statements = _snakefile_imports()
    # The rules import one module, and it reaches the packages they need (the study engine).
    assert all(s.startswith("from cosmocub.workflow_support import") for s in statements)
    code = "\n".join(["import sys", *statements])
    code += "\nprint(sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'mlflow'}))"
    code += "\nprint('cosmocub.studies.engine' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["[]", "True"]
