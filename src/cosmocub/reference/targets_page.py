"""The Snakemake targets page, drawn from the workflow itself: every rule a user can name on the
command line (`snakemake --cores all <target>`), with its docstring and what it makes.

A target is a rule whose outputs have no wildcards, the rules `snakemake --list-target-rules`
prints. The workflow is loaded in a child process (`python -m cosmocub.reference.targets_page`):
loading it sets up Snakemake's logging and globals, which have no business in the process that
builds the site (MkDocs counts the warnings its own logger sees).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from cosmocub.reference.markdown import cell


@dataclass(frozen=True)
class Target:
    name: str
    doc: str
    makes: tuple[str, ...]  # its outputs, or for a rule without any the files it asks for


def _load_targets(snakefile: Path) -> list[dict]:
    """The target rules of the workflow, read by Snakemake's own parser (run in the child)."""
    import tempfile

    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings

    # Parsing the rules writes each job's resolved config under the config's results folder:
    # a folder of our own, so that building the site leaves nothing in the checkout.
    scratch = tempfile.mkdtemp(prefix="cosmocub-targets-")
    with SnakemakeApi(OutputSettings()) as api:
        workflow = api.workflow(
            resource_settings=ResourceSettings(),
            config_settings=ConfigSettings(config={"results": scratch}),
            snakefile=snakefile,
            workdir=snakefile.parent,
        )._workflow  # the parsed rules; the API has no public walk of them
        out = []
        for rule in workflow.rules:
            if rule.has_wildcards():
                continue
            files = rule.output or rule.input
            out.append(
                {
                    "name": rule.name,
                    "doc": " ".join((rule.docstring or "").split()),
                    # An input given by a function has no name until the DAG is built.
                    "makes": [str(f).replace(scratch, "results") for f in files if not callable(f)],
                }
            )
    shutil.rmtree(scratch, ignore_errors=True)
    return out


def targets(root: Path) -> list[Target]:
    """Every target of the workflow at `root`, in the order the rule files declare them."""
    proc = subprocess.run(
        [sys.executable, "-m", "cosmocub.reference.targets_page", str(root / "Snakefile")],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"loading the workflow for its targets failed:\n{proc.stderr}")
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    return [Target(r["name"], r["doc"], tuple(r["makes"])) for r in rows]


def render(root: Path) -> str:
    found = targets(root)
    lines = [
        "# Snakemake targets",
        "",
        f"Every target of the workflow, {len(found)} in all, read from the workflow's rules when",
        "this site was built: `snakemake --cores all <target>` makes it and whatever it needs,",
        "and `snakemake --cores all` alone makes `all`. Paths are under `results/` (the config's",
        "`results`). Rules whose outputs have wildcards (one universe, one run, one study point)",
        "are steps of these and are not named on the command line.",
        "",
        "| target | what it makes | files |",
        "|---|---|---|",
    ]
    for t in found:
        files = "<br>".join(f"`{f}`" for f in t.makes[:4])
        if len(t.makes) > 4:
            files += f"<br>… {len(t.makes) - 4} more"
        lines.append(f'| <a id="{t.name}"></a>`{t.name}` | {cell(t.doc)} | {files} |')
    return "\n".join([*lines, ""])


if __name__ == "__main__":
    # The child: one JSON line on stdout, last (Snakemake may print before it).
    rows = _load_targets(Path(sys.argv[1]).resolve())
    print(json.dumps(rows))
