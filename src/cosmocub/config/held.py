"""A workflow job's config holds only the sections its rule lists (its `held` key): a stage that
reads any other key fails at once, naming the key, the file and what the file holds.
"""

from __future__ import annotations

import types
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from cosmocub.config.schema import ConfigError

# Sections every job's file holds beside those its rule lists, and that no rule's hash covers:
# where a job records its work (the results folder, the MLflow store and experiment), never
# what it computes. A change there reruns nothing.
RECORD_SECTIONS = ("results", "tracking")


def covers(held: Collection[str], key: str) -> bool:
    """Whether `key` (dotted) or a section above it is held."""
    parts = key.split(".")
    return any(".".join(parts[:i]) in held for i in range(1, len(parts) + 1))


def held_values(values: Mapping[str, Any], sections: Iterable[str]) -> dict[str, Any]:
    """A job's config file: `held` (the sections, dotted keys alike, in the rule's order), the
    top-level sections they lie in (whole: a section's own checks see its true values) and the
    record sections."""
    held = list(sections)
    tops = {key.split(".")[0] for key in held} | set(RECORD_SECTIONS)
    return {"held": held, **{k: v for k, v in values.items() if k in tops}}


def held_keys(values: Mapping[str, Any]) -> frozenset[str] | None:
    """What a config's reads may reach: its `held` sections and the record sections; None where
    it holds the whole config (no `held` key)."""
    held = values.get("held")
    return None if held is None else frozenset([*held, *RECORD_SECTIONS])


def guard(value: Any, key: str, held: frozenset[str], source: str) -> Any:
    """`value`, found at `key`, as a stage may read it: itself where held, a view that checks
    each field where only keys under it are held; else the one-line ConfigError."""
    if covers(held, key):
        return value
    if any(h.startswith(key + ".") for h in held):
        return HeldPart(value, key, held, source)
    listed = ", ".join(sorted(held - set(RECORD_SECTIONS)))
    raise ConfigError(
        f"{source}: key '{key}': read by this stage, but its config holds only {listed} "
        f"(and {', '.join(RECORD_SECTIONS)}): add '{key}' to the sections its rule lists "
        "(job_config), so that its hash covers what the stage reads"
    )


class HeldPart:
    """A config section of which only some keys are held: a held field reads as itself, any
    other raises; the section's properties and methods run on this view, so what they read is
    checked too."""

    __slots__ = ("_held", "_key", "_source", "_value")

    def __init__(self, value: Any, key: str, held: frozenset[str], source: str) -> None:
        object.__setattr__(self, "_value", value)
        object.__setattr__(self, "_key", key)
        object.__setattr__(self, "_held", held)
        object.__setattr__(self, "_source", source)

    @property
    def __class__(self) -> type:  # isinstance() sees the section's class
        return type(self._value)

    def __getattr__(self, name: str) -> Any:
        value = self._value
        attr = getattr(type(value), name, None)
        if isinstance(attr, property):
            return attr.fget(self)
        if isinstance(attr, types.FunctionType):
            return types.MethodType(attr, self)
        if name.startswith("__"):
            return getattr(value, name)
        return guard(getattr(value, name), f"{self._key}.{name}", self._held, self._source)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"config section {self._key} is read-only")

    def __repr__(self) -> str:
        return f"HeldPart({self._key}: {sorted(h for h in self._held if h.startswith(self._key))})"
