"""The config reference page, drawn from the schema: every key with its type, default, allowed
values and description.

The schema (src/cosmocub/schemas/config.schema.yaml) is the one place a key is declared, and
Snakemake and every `cosmocub` command validate against it, so a page drawn from it at build time
lists a key the day it is added, and never one that has gone.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import yaml

from cosmocub.config.schema import load_schema
from cosmocub.reference.markdown import cell

SCHEMA_FILE = "src/cosmocub/schemas/config.schema.yaml"


@dataclass(frozen=True)
class KeyEntry:
    """One property of the schema, wherever it sits (an object's key, a map's value's key, an
    array item's key, a branch of an anyOf)."""

    path: str  # dotted; `<name>` for a map's free key, `[]` for an array's items
    schema: dict[str, Any]


def _branches(node: dict[str, Any]) -> list[dict[str, Any]]:
    """The node and its anyOf/oneOf alternatives: `optimizer.lion_cub` is null or an object."""
    return [node, *node.get("anyOf", ()), *node.get("oneOf", ())]


def key_entries(schema: dict[str, Any] | None = None) -> list[KeyEntry]:
    """Every property of the schema, parents before their children, in the schema's order."""
    return list(_walk(load_schema() if schema is None else schema, ""))


def _walk(node: dict[str, Any], prefix: str) -> Iterator[KeyEntry]:
    for branch in _branches(node):
        for name, sub in branch.get("properties", {}).items():
            path = f"{prefix}.{name}" if prefix else name
            yield KeyEntry(path, sub)
            yield from _walk(sub, path)
        extra = branch.get("additionalProperties")
        if isinstance(extra, dict):
            yield from _walk(extra, f"{prefix}.<name>")
        items = branch.get("items")
        if isinstance(items, dict):
            yield from _walk(items, f"{prefix}[]")


def _types(node: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for branch in _branches(node):
        kind = branch.get("type")
        for t in kind if isinstance(kind, list) else [kind] if kind else []:
            if t == "array" and isinstance(branch.get("items"), dict):
                t = f"array of {' or '.join(_types(branch['items'])) or 'any'}"
            elif t == "object" and isinstance(branch.get("additionalProperties"), dict):
                t = "map of name → object"
            if t not in out:
                out.append(t)
    return out


def _flow(value: Any) -> str:
    """A value as it would be written in a config file (YAML flow style, one line)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6, sort_keys=False)
    return text.removesuffix("\n...\n").strip()  # a scalar document ends in "..."


def _bounds(node: dict[str, Any]) -> list[str]:
    marks = (
        ("minimum", "≥"),
        ("exclusiveMinimum", ">"),
        ("maximum", "≤"),
        ("exclusiveMaximum", "<"),
        ("minItems", "items ≥"),
        ("maxItems", "items ≤"),
        ("minProperties", "entries ≥"),
    )
    return [f"{sign} {node[key]}" for key, sign in marks if key in node]


def allowed(node: dict[str, Any]) -> str:
    """The values a key takes beyond its type: enum, bounds, the items' and names' rules."""
    parts: list[str] = []
    for branch in _branches(node):
        if "enum" in branch:
            parts.append(", ".join(f"`{_flow(v)}`" for v in branch["enum"]))
        parts += _bounds(branch)
        items = branch.get("items")
        if isinstance(items, dict) and (inner := allowed(items)):
            parts.append(f"each: {inner}")
        if "pattern" in branch:
            parts.append(f"matches `{branch['pattern']}`")
        names = branch.get("propertyNames", {})
        if "pattern" in names:
            parts.append(f"names match `{names['pattern']}`")
        if branch.get("required") and "properties" not in branch:
            parts.append("needs " + ", ".join(f"`{r}`" for r in branch["required"]))
    return "; ".join(parts)


def anchor_id(path: str) -> str:
    return path.replace("<name>", "name").replace("[]", "")


def _row(entry: KeyEntry) -> str:
    node = entry.schema
    default = f"`{_flow(node['default'])}`" if "default" in node else "—"
    # An anchor per key, so that a page can link `reference/config.md#train.epochs`.
    anchor = f'<a id="{anchor_id(entry.path)}"></a>'
    cells = [
        f"`{entry.path}`",
        ", ".join(_types(node)) or "any",
        default,
        allowed(node),
        node.get("description", ""),
    ]
    return "| " + anchor + " | ".join(cell(c) for c in cells) + " |"


def render() -> str:
    """The page: one table per top-level section, every key of the schema a row."""
    schema = load_schema()
    entries = key_entries(schema)
    lines = [
        "# Config keys",
        "",
        f"Every key of `{SCHEMA_FILE}`, {len(entries)} in all, drawn from the schema",
        "when this site was built: type, default, allowed values, description. A config file",
        "names only the keys it changes; every other key takes its default. On the command",
        "line: `snakemake --cores all --config train='{epochs: 30}'` (nested values typed by the",
        "schema). Why the defaults are what they are, with their measurements:",
        "[the configs explained](../explanation/configs.md).",
        "",
    ]
    top = [e for e in entries if "." not in e.path]
    loose = [e for e in top if not e.schema.get("properties")]
    if loose:
        lines += ["## Top level", "", *_table(loose), ""]
    for section in (e for e in top if e.schema.get("properties")):
        lines += [f"## `{section.path}`", ""]
        if "description" in section.schema:
            lines += [cell(section.schema["description"]), ""]
        inside = [e for e in entries if e.path.startswith(section.path + ".")]
        lines += [*_table(inside), ""]
    return "\n".join(lines)


def _table(entries: list[KeyEntry]) -> list[str]:
    return [
        "| key | type | default | allowed | description |",
        "|---|---|---|---|---|",
        *(_row(e) for e in entries),
    ]
