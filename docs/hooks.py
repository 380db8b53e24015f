"""MkDocs hooks (mkdocs.yml `hooks:`): the pages that are drawn from the code, not written.

At every build, `on_files` adds
- the reference pages for the config keys, the `cosmocub` commands and the Snakemake targets,
  rendered by `cosmocub.reference` from the schema, the CLI's parser and the workflow, so that a
  key, flag or target added anywhere is on the site with no edit here;
- the Markdown that lives beside what it explains in the repository (config/README.md beside
  the configs, profiles/README.md beside the profiles), shown as it is, so there is one copy.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File, Files

from cosmocub.reference import cli_page, config_page, targets_page

ROOT = Path(__file__).resolve().parent.parent

# site page -> the repository's file it shows
INCLUDED = {
    "explanation/configs.md": "config/README.md",
    "cluster/profiles.md": "profiles/README.md",
}


def generated_pages() -> dict[str, str]:
    """Every page this hook adds, by its path under docs/ (tests/test_docs.py reads them too)."""
    pages = {
        "reference/config.md": config_page.render(),
        "reference/cli.md": cli_page.render(),
        "reference/targets.md": targets_page.render(ROOT),
    }
    for uri, source in INCLUDED.items():
        # Both sit one folder deep in the repository and in the site, so a link into docs/
        # from the repository's copy (../docs/x.md) is ../x.md on the site.
        pages[uri] = (ROOT / source).read_text().replace("](../docs/", "](../")
    return pages


def on_files(files: Files, config) -> Files:
    for uri, content in generated_pages().items():
        files.append(File.generated(config, uri, content=content))
    return files
