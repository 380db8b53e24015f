"""The config's schema machinery: validate against the JSON schema (the one source of defaults),
fill defaults, coerce CLI strings, hash, flatten and merge resolved dicts.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from cosmocub.config.optimizer_kind import OptimizerKind

SCHEMA_PATH = Path(str(resources.files("cosmocub") / "schemas" / "config.schema.yaml"))


class ConfigError(ValueError):
    """A user's configuration is invalid; the message names the file, key and numbers."""


def _validator_filling_defaults():
    # jsonschema does not fill defaults by itself; extend the properties keyword so that a missing
    # key takes the schema's default before validation descends into it (as Snakemake does).
    base = jsonschema.Draft202012Validator
    validate_properties = base.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub and name not in instance:
                    instance[name] = json.loads(json.dumps(sub["default"]))
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(base, {"properties": set_defaults})


@functools.cache
def _parsed_schema() -> dict[str, Any]:
    # libyaml's loader where PyYAML has it (10x faster on this 32 kB file, read by every
    # config load and every Snakefile parse); each caller gets its own copy.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(SCHEMA_PATH) as f:
        return yaml.load(f, Loader=loader)


def load_schema() -> dict[str, Any]:
    return copy.deepcopy(_parsed_schema())


# Keys that were renamed (one word for the ranks started on a node: ranks_per_node; one for a
# link's rate: rate_mbit), each with its new name and what it means; "*" stands for any item of a
# list. The schema would refuse the old names too, but only as unknown keys, without saying what
# to write instead.
RENAMED_KEYS = {
    "train.nproc_per_node": ("ranks_per_node", "the ranks started on each node"),
    "unet.train.nproc_per_node": ("ranks_per_node", "the U-Net's ranks on its node"),
    "step_time_study.points.*.nproc_per_node": ("ranks_per_node", "the point's ranks"),
    "network_study.nproc_per_node": ("ranks_per_node", "ranks per emulated node"),
    "scaling_study.nproc_per_node": ("ranks_per_node", "ranks per emulated node"),
    "parallel.ranks_per_node": ("assumed_ranks_per_node", "the node size Lion Cub assumes"),
    "unet.parallel.ranks_per_node": ("assumed_ranks_per_node", "the node size Lion Cub assumes"),
    # One name for a link's rate, in Mbit/s, across config, code, CLI (--rate-mbit) and tables.
    "network_study.bandwidths_mbit": ("rates_mbit", "the links' rates of the study's points"),
    "scaling_study.bandwidth_mbit": ("rate_mbit", "every node's link rate"),
}


def _key_paths(value: Any, parts: list[str], at: tuple[str, ...] = ()):
    """The paths in `value` that match `parts` ("*": any list item), as tuples of keys."""
    if not parts:
        yield at
    elif parts[0] == "*" and isinstance(value, list):
        for i, item in enumerate(value):
            yield from _key_paths(item, parts[1:], (*at, str(i)))
    elif isinstance(value, dict) and parts[0] in value:
        yield from _key_paths(value[parts[0]], parts[1:], (*at, parts[0]))


def refuse_renamed_keys(raw: Mapping[str, Any], *, source: str) -> None:
    """ConfigError, in one line naming `source`, the old key and the new one, for the first key
    of `raw` that was renamed (RENAMED_KEYS)."""
    for old, (new, meaning) in RENAMED_KEYS.items():
        for path in _key_paths(raw, old.split(".")):
            where = ".".join(path)
            raise ConfigError(
                f"{source}: key '{where}' was renamed: write "
                f"'{'.'.join((*path[:-1], new))}' instead ({meaning})"
            )


def resolve(raw: dict[str, Any] | None, *, source: str = "<config>") -> dict[str, Any]:
    """Validate `raw` against the schema and return a copy with every default filled in."""
    refuse_renamed_keys(raw or {}, source=source)
    values = json.loads(json.dumps(raw or {}))
    validator = _validator_filling_defaults()(load_schema())
    errors = sorted(validator.iter_errors(values), key=lambda e: list(e.absolute_path))
    if errors:
        err = errors[0]
        while err.context:  # an anyOf: name the option that is wrong, not just its section
            err = max(err.context, key=_relevance)
        key = ".".join(str(p) for p in err.absolute_path) or "<top level>"
        raise ConfigError(f"{source}: key '{key}': {err.message}")
    return values


def fill_lion_cub_defaults(values: dict[str, Any]) -> None:
    """optimizer.lion_cub defaults to null, so that options given to another optimizer can be
    refused; lion_cub itself then takes the schema's defaults, filled here in place."""
    optimizer = values.get("optimizer", {})
    name = optimizer.get("name")
    takes_options = name in set(OptimizerKind) and OptimizerKind(name).takes_lion_cub_options
    if takes_options and optimizer.get("lion_cub") is None:
        optimizer["lion_cub"] = {}
        validator = _validator_filling_defaults()(load_schema())
        assert not list(validator.iter_errors(values)), "schema defaults of lion_cub are valid"


def _relevance(err: jsonschema.ValidationError) -> tuple[int, bool, bool]:
    # Deepest first, then an error other than a type mismatch, then one from a branch other
    # than the first (the first anyOf branch of a nullable section is the null).
    branch = err.relative_schema_path[0] if err.relative_schema_path else 0
    return (len(err.absolute_path), err.validator != "type", branch != 0)


def coerce_cli_strings(values: dict[str, Any]) -> dict[str, Any]:
    """Turn strings into the numbers/booleans/nulls the schema expects, in place; returns values.

    Snakemake parses nested `--config key='{a: 1}'` with YAML's BaseLoader, which leaves every
    scalar a string; the schema says which of them are meant as numbers, booleans or null.
    """
    _coerce(values, load_schema())
    return values


def _coerce(value: Any, schema: dict[str, Any]) -> Any:
    if isinstance(value, dict) and "anyOf" in schema:  # e.g. optimizer.lion_cub: null or options
        schema = next((s for s in schema["anyOf"] if "properties" in s), schema)
    if isinstance(value, dict):
        for key, sub in value.items():
            if key in schema.get("properties", {}):
                value[key] = _coerce(sub, schema["properties"][key])
        return value
    if isinstance(value, list) and "items" in schema:
        return [_coerce(v, schema["items"]) for v in value]
    types = schema.get("type", [])
    types = [types] if isinstance(types, str) else types
    if isinstance(value, str) and value in ("null", "~") and "null" in types:
        return None
    if isinstance(value, str) and "string" not in types:
        parsed = yaml.safe_load(value) if value.strip() else None
        if isinstance(parsed, bool | int | float | list) or parsed is None:
            return _coerce(parsed, schema) if isinstance(parsed, list) else parsed
    return value


def config_hash(values: dict[str, Any]) -> str:
    """A short, stable hash of a resolved config (key order does not matter)."""
    blob = json.dumps(values, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` → `{"a.b": 1}`, for MLflow params."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, prefix=f"{name}."))
        else:
            flat[name] = value
    return flat


def deep_merge(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `update` merged in, section by section (nested mappings merge, anything else
    replaces); neither argument is changed."""
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged
