"""Small file helpers shared by every stage: atomic writes, checksums, and the readers and writers
of JSON, JSON lines and TSV tables, each naming the file in its errors."""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import math
import os
import shutil
import signal
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling of `path`; rename it onto `path` only if the block succeeds.

    A killed or failing job therefore never leaves a half-written file under the final name, and
    an existing file at `path` survives a failed rewrite. Works for files and folders.
    """
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    _remove(tmp)
    try:
        yield tmp
        if final.is_dir() and not final.is_symlink():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        _remove(tmp)


@contextlib.contextmanager
def sigterm_deferred() -> Iterator[None]:
    """Hold a SIGTERM that arrives inside the block until the block has ended, then deliver it
    to the handler that was there before.

    A scheduler cancels with SIGTERM (Slurm's scancel; SIGKILL follows KillWait later): without
    this, one landing between a temporary file's write and its rename kills the process with the
    temporary left beside the final name. Only the main thread can set handlers; elsewhere the
    block runs unguarded. For short, bounded writes (a checkpoint; `write_json`, `write_jsonl`
    and `write_tsv` hold one around their own): `atomic_path` itself does not
    defer, because some of its blocks hold a whole stage (preprocess writes into its temporary
    folder for minutes), and a cancel must stop those at once.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
        if received:
            signal.raise_signal(signal.SIGTERM)


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """SIGTERM/SIGINT raise SystemExit/KeyboardInterrupt inside the block, so that a `finally`
    in it cleans up what the process started elsewhere (network namespaces, Slurm jobs) before
    a scheduler's SIGKILL follows (the main thread only: Python delivers signals there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    previous = {}
    for s in (signal.SIGTERM, signal.SIGINT):
        if signal.getsignal(s) in (signal.SIG_DFL, signal.default_int_handler):
            previous[s] = signal.signal(s, stop)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()


def sha256_file(path: str | os.PathLike, *, block_size: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(block_size):
            digest.update(block)
    return digest.hexdigest()


def read_json(path: str | os.PathLike, *, not_found: str = "not found") -> Any:
    """The JSON value in `path`. A missing file is a FileNotFoundError "<path>: <not_found>" (a
    caller may say which stage writes it), bad JSON a ValueError naming the file and line."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: {not_found}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from None


def write_json(path: str | os.PathLike, value: Any, *, indent: int | None = 2) -> None:
    """`value` as JSON (one trailing newline) at `path`, atomically; a SIGTERM waits for the
    rename (`sigterm_deferred`), so a cancelled job leaves no temporary beside it."""
    with sigterm_deferred(), atomic_path(path) as tmp:
        tmp.write_text(json.dumps(value, indent=indent) + "\n")


def write_jsonl(path: str | os.PathLike, records: Sequence[Mapping[str, Any]]) -> None:
    """`records` as JSON lines (metrics.jsonl: one object per epoch) at `path`, as `write_json`
    writes."""
    with sigterm_deferred(), atomic_path(path) as tmp:
        tmp.write_text("".join(json.dumps(r) + "\n" for r in records))


def read_jsonl(path: str | os.PathLike, *, not_found: str = "not found") -> list[dict[str, Any]]:
    """The objects of a JSON-lines file (metrics.jsonl: one per epoch), blank lines skipped. A
    missing file is a FileNotFoundError "<path>: <not_found>"; a line that is not a JSON object
    a ValueError naming the file and the line."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: {not_found}") from None
    records = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: line {lineno} is not JSON ({err.msg})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}: line {lineno} is not a JSON object")
        records.append(record)
    return records


def write_tsv(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], path: Path) -> None:
    """`rows` as a tab-separated table of `columns` (floats to 6 significant digits, None and NaN
    as empty cells), atomically, as `write_json` writes."""
    with sigterm_deferred(), atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(
            f, fieldnames=list(columns), delimiter="\t", lineterminator="\n", extrasaction="ignore"
        )
        writer.writeheader()
        for row in rows:
            writer.writerow({k: format_cell(row.get(k)) for k in columns})


def read_tsv(path: str | os.PathLike, *, not_found: str = "not found") -> list[dict[str, str]]:
    """The rows of a tab-separated table with a header line, as strings by column name. A missing
    file is a FileNotFoundError "<path>: <not_found>"."""
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f, delimiter="\t"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: {not_found}") from None


def format_cell(value: Any, *, digits: int = 6) -> str:
    """One table cell: a float to `digits` significant digits, None and NaN empty, else str."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def json_safe(value: Any) -> Any:
    """`value` with non-finite floats as None (strict JSON has no NaN: an undefined R² becomes
    null) and paths as strings, through dicts, lists and tuples."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, os.PathLike):
        return str(value)
    return value
