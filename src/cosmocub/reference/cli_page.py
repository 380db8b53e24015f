"""The command-line reference page, drawn from the CLI's own argparse parser: every `cosmocub`
stage (and sub-stage, such as `perf-model predict`) with every argument it takes.

The page walks the parser that `cosmocub` itself parses with (`cosmocub.cli.build_parser`), so
a flag exists on the page exactly when the command accepts it.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass

from cosmocub.cli import build_parser
from cosmocub.reference.markdown import cell


@dataclass(frozen=True)
class Stage:
    """One command a user types: `cosmocub simulate`, `cosmocub perf-model predict`."""

    words: tuple[str, ...]  # after `cosmocub`
    parser: argparse.ArgumentParser
    help: str

    @property
    def name(self) -> str:
        return " ".join(("cosmocub", *self.words))

    def arguments(self) -> list[argparse.Action]:
        """What it takes, less -h and the sub-stage choice (listed as stages of their own)."""
        return [
            a
            for a in self.parser._actions
            if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)
        ]

    def has_substages(self) -> bool:
        return any(isinstance(a, argparse._SubParsersAction) for a in self.parser._actions)


def _subparsers(parser: argparse.ArgumentParser) -> Iterator[argparse._SubParsersAction]:
    return (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def stages(
    parser: argparse.ArgumentParser | None = None, words: tuple[str, ...] = ()
) -> Iterator[Stage]:
    """Every stage, depth first, in the order `--help` lists them."""
    parser = build_parser() if parser is None else parser
    for action in _subparsers(parser):
        helps = {c.dest: c.help or "" for c in action._choices_actions}
        for name, sub in action.choices.items():
            stage = Stage((*words, name), sub, helps.get(name, sub.description or ""))
            yield stage
            yield from stages(sub, stage.words)


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The help text as `--help` prints it (with %(default)s and the like filled in)."""
    if not action.help:
        return ""
    return parser._get_formatter()._expand_help(action)


def _form(action: argparse.Action) -> str:
    """How the argument is written: `--out PATH`, `--verbose`, `universe`."""
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`" + (" …" if action.nargs in ("*", "+") else "")
    names = ", ".join(f"`{o}`" for o in action.option_strings)
    if action.nargs == 0:
        return names
    metavar = action.metavar or action.dest.upper()
    if isinstance(metavar, tuple):
        metavar = " ".join(metavar)
    more = " …" if action.nargs in ("*", "+", argparse.REMAINDER) else ""
    return f"{names} `{metavar}`{more}"


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS):
        return ""
    return f"`{action.default}`"


def render() -> str:
    """The page: a section per stage, a row per argument."""
    all_stages = list(stages())
    lines = [
        "# `cosmocub` commands",
        "",
        f"Every stage of the `cosmocub` command, {len(all_stages)} in all, with every argument,",
        "drawn from the command's own parser when this site was built. Each workflow job runs one",
        "of them with its config named (`--config`), so the line `snakemake -p` prints for a job",
        "runs by hand the same way. A stage given no `--config` runs on the schema's defaults and",
        "says so in one line. User mistakes end in one line on stderr and exit status 2.",
        "",
    ]
    for stage in all_stages:
        lines += [f"## `{stage.name}`", "", cell(stage.help) or "", ""]
        if stage.has_substages():
            subs = [s for s in all_stages if s.words[:-1] == stage.words]
            lines += ["Sub-stages: " + ", ".join(f"`{s.words[-1]}`" for s in subs) + ".", ""]
        args = stage.arguments()
        if not args:
            continue
        lines += ["| argument | default | allowed | description |", "|---|---|---|---|"]
        for action in args:
            choices = ", ".join(f"`{c}`" for c in action.choices) if action.choices else ""
            helps = [_help(stage.parser, action)]
            if action.required and action.option_strings:
                helps.insert(0, "required")
            cells = [_form(action), _default(action), choices, "; ".join(h for h in helps if h)]
            lines.append("| " + " | ".join(cell(c) for c in cells) + " |")
        lines.append("")
    return "\n".join(lines)
