"""The documentation: the site builds strictly (no warning, broken link, missing anchor or page
left out of the nav), its reference pages hold every schema key, `cosmocub` flag and Snakemake
target, and the commands the README and the how-to pages show exist as written.

The reference pages are drawn from the code at build time (cosmocub.reference), so these tests
hold the drawing to the code by other routes: a generic scan of the schema, the defaults the
schema fills, the parser walked here, and `snakemake --list-target-rules`.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cosmocub.cli import build_parser
from cosmocub.config.schema import flatten, load_schema, resolve
from cosmocub.reference import cli_page, config_page, targets_page

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# The pages a user follows step by step: every command in their code blocks must run as written.
HOW_TO_PAGES = [
    README,
    *(
        ROOT / "docs" / p
        for p in (
            "index.md",
            "getting-started/laptop.md",
            "getting-started/results.md",
            "your-data.md",
            "cluster/index.md",
            "lion-cub.md",
            "studies/index.md",
            "perf-model.md",
        )
    ),
]


def _property_names(node) -> list[str]:
    """Every key under any `properties` of the schema, found without knowing its shape (anyOf
    branches, map values, array items alike): what the page must hold, counted another way."""
    found: list[str] = []
    if isinstance(node, dict):
        props = node.get("properties")
        if isinstance(props, dict):
            found += list(props)
        for key, value in node.items():
            found += _property_names(value) if key != "properties" else []
        for value in props.values() if isinstance(props, dict) else ():
            found += _property_names(value)
    elif isinstance(node, list):
        for value in node:
            found += _property_names(value)
    return found


def _config_rows(page: str) -> dict[str, str]:
    """key path -> its row, from the rendered config page."""
    rows = re.findall(r'^\| <a id="[^"]+"></a>`([^`]+)` \|(.*)$', page, flags=re.M)
    return dict(rows)


def test_every_schema_key_has_a_reference_row():
    schema = load_schema()
    page = config_page.render()
    rows = _config_rows(page)
    sections = re.findall(r"^## `(\w+)`$", page, flags=re.M)  # a top-level object: its heading
    names = _property_names(schema)
    # One entry per property of the schema, wherever it is nested (234 at 887530d; keys added
    # since, such as universes.mlperf_dir, raise it).
    assert len(rows) + len(sections) == len(names) >= 222
    assert sorted([p.rsplit(".", 1)[-1] for p in rows] + sections) == sorted(names)
    # Every key that has a default, by the path a config file writes it under.
    for path in flatten(resolve({})):
        assert path in rows or any(path.startswith(p + ".") for p in rows), path
    # What a row says is the schema's own: type, default, the enum, the description.
    source = rows["universes.source"]
    assert "string" in source and "`synthetic`" in source
    assert "`known_answer`" in source and "`cosmoflow`" in source
    assert schema["properties"]["universes"]["properties"]["source"]["description"][:40] in source
    assert "`flat`" in rows["optimizer.lion_cub.hierarchy"]  # inside an anyOf's object branch
    assert "≥ 1" in rows["universes.count"] and "`48`" in rows["universes.count"]


def test_a_key_added_to_the_schema_gets_its_row():
    # The page is drawn from whatever schema it is given: a key another engineer adds appears.
    schema = load_schema()
    universes = schema["properties"]["universes"]["properties"]
    universes["mlperf_dir_probe"] = {"type": ["string", "null"], "default": None}
    paths = [e.path for e in config_page.key_entries(schema)]
    assert "universes.mlperf_dir_probe" in paths


def _walk_parser(parser, words=()):
    """(words, option strings and positional names) of every stage, walked here by hand."""
    for action in parser._actions:
        if action.__class__.__name__ != "_SubParsersAction":
            continue
        for name, sub in action.choices.items():
            args = [
                a
                for a in sub._actions
                if a.__class__.__name__ not in ("_HelpAction", "_SubParsersAction")
            ]
            yield (*words, name), args
            yield from _walk_parser(sub, (*words, name))


def test_every_cli_stage_and_flag_has_a_reference_entry():
    page = cli_page.render()
    sections = dict(
        re.findall(r"^## `cosmocub ([^`]+)`\n(.*?)(?=^## |\Z)", page, flags=re.M | re.S)
    )
    stages = list(_walk_parser(build_parser()))
    assert len(stages) == len(sections) > 20
    for words, args in stages:
        section = sections[" ".join(words)]
        for action in args:
            for name in action.option_strings or [action.metavar or action.dest]:
                assert f"| `{name}`" in section or f", `{name}`" in section, (words, name)
    assert "`--accelerator`" in sections["perf-model predict"]


def _snakemake(*args: str, results: Path) -> str:
    """`snakemake ARGS` on the workflow, its results (where parsing writes the jobs' resolved
    configs) in a scratch folder rather than the checkout."""
    return subprocess.run(
        ["snakemake", *args, "--config", f"results={results}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


@pytest.fixture(scope="module")
def targets(tmp_path_factory) -> set[str]:
    out = _snakemake("--list-target-rules", results=tmp_path_factory.mktemp("results"))
    # One line a target: its name, then its docstring in brackets where it has one.
    return {m.group(1) for m in re.finditer(r"^([A-Za-z_]\w*)(?: \(.*\))?$", out, flags=re.M)}


def test_every_snakemake_target_has_a_reference_row(targets):
    drawn = targets_page.targets(ROOT)
    assert {t.name for t in drawn} == targets
    assert {"all", "perf_model", "unet", "sample_size_study"} <= targets
    # A target without a docstring would be a row that says nothing.
    assert not [t.name for t in drawn if not t.doc]


def _code_lines(path: Path) -> list[str]:
    """Lines of the page's shell blocks, a command continued with `\\` joined into one."""
    blocks = re.findall(r"^ *```bash\n(.*?)^ *```", path.read_text(), flags=re.M | re.S)
    text = "\n".join(blocks).replace("\\\n", " ")
    return [line.strip() for line in text.splitlines() if line.strip()]


def _commands(prefix: str) -> list[tuple[str, list[str]]]:
    out = []
    for page in HOW_TO_PAGES:
        for line in _code_lines(page):
            for part in line.split("&&"):
                words = shlex.split(part, comments=True)
                if words and words[0] == prefix:
                    out.append((f"{page.name}: {part.strip()}", words[1:]))
    return out


def test_the_cosmocub_commands_shown_parse():
    commands = _commands("cosmocub")
    assert len(commands) >= 8
    for where, argv in commands:
        try:
            build_parser().parse_args(argv)
        except SystemExit:
            pytest.fail(f"{where}: `cosmocub` does not take this")


def test_the_snakemake_commands_shown_name_real_targets_and_files(targets):
    from snakemake.cli import get_argument_parser

    commands = _commands("snakemake")
    assert len(commands) >= 10
    for where, argv in commands:
        args = get_argument_parser().parse_args(argv)
        for target in args.targets:
            assert target in targets, f"{where}: no target {target}"
        for path in [*(args.configfile or []), *(args.profile or [])]:
            assert (ROOT / path).exists(), f"{where}: no {path}"


def test_the_lion_cub_examples_call_it_with_arguments_it_takes():
    import ast
    import inspect

    from cosmocub.optim import LionCub, LionCubSettings

    page = (ROOT / "docs" / "lion-cub.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", page, flags=re.M | re.S)
    for cls in (LionCub, LionCubSettings):
        takes = set(inspect.signature(cls).parameters)
        calls = [
            node
            for block in blocks
            for node in ast.walk(ast.parse(block))
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == cls.__name__
        ]
        assert len(calls) >= 2, cls.__name__
        for call in calls:
            assert {k.arg for k in call.keywords} <= takes, (cls.__name__, ast.unparse(call))


def test_the_readme_is_a_front_page_and_keeps_the_test_command():
    text = README.read_text()
    assert len(text.splitlines()) <= 120
    # .ci/run reads the test command from the code line after this paragraph.
    command = re.search(r"^Run the tests:\n\n```bash\n(.*)\n```", text, flags=re.M)
    assert command and command.group(1).endswith("pytest -n 2 --dist loadscope")
    assert "pip install -c constraints/cpu.txt -e . && snakemake --cores all" in text


def test_the_rulegraph_picture_names_the_rules_the_workflow_runs(tmp_path):
    dot = _snakemake("--rulegraph", results=tmp_path)
    drawn = set(re.findall(r'label = "(\w+)"', dot))
    svg = (ROOT / "docs" / "figures" / "rulegraph.svg").read_text()
    pictured = set(re.findall(r"<text[^>]*>(\w+)</text>", svg))
    assert drawn == pictured, "redraw it: see the command under the picture in README.md"


def test_each_measurement_narrative_says_when_and_at_which_commit():
    pages = sorted((ROOT / "docs" / "explanation").glob("*.md"))
    narratives = [p for p in pages if p.stem not in ("index", "layout")]
    assert len(narratives) >= 7
    index = (ROOT / "docs" / "explanation" / "index.md").read_text()
    for page in narratives:
        head = page.read_text()[:600]
        assert re.search(r"> \*\*Measured\*\* \d{4}-\d\d-\d\d to \d{4}-\d\d-\d\d", head), page
        assert re.search(r"`[0-9a-f]{7}`", head), page
        assert f"]({page.name})" in index, page


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path):
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed: pip install -e '.[docs]' (the test extra has it)")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # mkdocs-material's banner
        check=False,
    )
    # Strict mode turns every warning into a failure; the nav validation in mkdocs.yml makes a
    # page left out of the nav, a broken link and a missing anchor warnings.
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "WARNING" not in proc.stderr
    site = tmp_path / "site"
    config = (site / "reference" / "config" / "index.html").read_text()
    assert 'id="universes.source"' in config
    api = (site / "reference" / "lion-cub-api" / "index.html").read_text()
    assert "cosmocub.optim.LionCub" in api and "world_node_groups" in api


@pytest.mark.long
def test_the_site_opens_in_a_headless_browser_without_errors():
    # ~16 s at load ~2 (a build, then Chromium on three pages): beyond what the suite's budget
    # gives one check, so on request with the other long tests.
    if importlib.util.find_spec("playwright") is None or importlib.util.find_spec("mkdocs") is None:
        pytest.skip("needs playwright and mkdocs: pip install -e '.[test]'")
    if not any(shutil.which(c) for c in ("chromium", "chromium-browser", "google-chrome")):
        pytest.skip("no Chromium on PATH: apt-get install chromium")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "check_docs_browser.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "3 pages opened in headless Chromium: 0 problems" in proc.stdout
