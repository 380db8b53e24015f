"""Read the MLPerf HPC CosmoFlow TFRecord samples without TensorFlow or protobuf.

A GZIP TFRecord file is a sequence of records (length, masked CRC32C, payload, masked CRC32C); each
payload is a `tf.train.Example` with feature `x` (int16 counts as bytes) and `y` (unitPar floats).
"""

from __future__ import annotations

import gzip
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import google_crc32c
import numpy as np

from cosmocub.cosmology.parameters import NUM_CHANNELS, NUM_PARAMS

_MASK_DELTA = 0xA282EAD8


class TFRecordError(ValueError):
    """A TFRecord file or its tf.train.Example is malformed; the message names the file."""


def masked_crc32c(data: bytes | memoryview) -> int:
    """TFRecord's masked CRC32C: rotate right by 15 bits and add a constant (mod 2**32)."""
    crc = google_crc32c.value(bytes(data) if isinstance(data, memoryview) else data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def iter_tfrecords(path: str | os.PathLike, *, compressed: bool = True) -> Iterator[bytes]:
    """Yield each record's payload, checking both CRCs (GZIP unless `compressed=False`)."""
    path = Path(path)
    if not path.is_file():
        raise TFRecordError(f"{path}: no such TFRecord file")
    opener = gzip.open if compressed else open
    try:
        with opener(path, "rb") as stream:
            yield from read_records(path, stream)
    except gzip.BadGzipFile as err:
        raise TFRecordError(f"{path}: not a valid GZIP file ({err})") from None
    except EOFError:
        raise TFRecordError(f"{path}: GZIP stream is truncated") from None
    except zlib.error as err:
        raise TFRecordError(f"{path}: GZIP stream is corrupt ({err})") from None


def read_records(path: Path, stream: BinaryIO) -> Iterator[bytes]:
    """Each record's payload from an open (decompressed) stream, both CRCs checked."""
    index = 0
    while True:
        header = stream.read(12)
        if not header:
            return
        if len(header) < 12:
            raise TFRecordError(
                f"{path}: record {index} is truncated: header has {len(header)} of 12 bytes"
            )
        length_bytes, (length_crc,) = header[:8], struct.unpack("<I", header[8:])
        if masked_crc32c(length_bytes) != length_crc:
            raise TFRecordError(f"{path}: record {index}: CRC mismatch in the length header")
        (length,) = struct.unpack("<Q", length_bytes)
        body = stream.read(length + 4)
        if len(body) < length + 4:
            raise TFRecordError(
                f"{path}: record {index} is truncated: {len(body)} of {length + 4} bytes "
                f"(payload and CRC)"
            )
        data = body[:length]
        (data_crc,) = struct.unpack("<I", body[length:])
        if masked_crc32c(data) != data_crc:
            raise TFRecordError(
                f"{path}: record {index}: CRC mismatch in the {length}-byte payload"
            )
        yield data
        index += 1


# --- protobuf wire format: just enough for tf.train.Example ---------------------------------
# A hand-written reader of ~50 lines keeps the package free of protobuf/TensorFlow (large,
# version-sensitive dependencies) for the three nested messages we need:
#   Example{1: Features}  Features{1: map<string, Feature>} (entries {1: key, 2: value})
#   Feature{1: BytesList{1: bytes*}, 2: FloatList{1: float* (packed)}, 3: Int64List{1: int64*}}


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise IndexError("varint runs past the end of the message")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise IndexError("varint longer than 10 bytes")


def _fields(buf: memoryview) -> Iterator[tuple[int, int, memoryview | int]]:
    """Yield (field number, wire type, value) of one message; values are views, not copies."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield number, wire, value
        elif wire == 1:
            yield number, wire, buf[pos : pos + 8]
            pos += 8
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if pos + size > len(buf):
                raise IndexError(f"field {number} of {size} bytes runs past the end")
            yield number, wire, buf[pos : pos + size]
            pos += size
        elif wire == 5:
            yield number, wire, buf[pos : pos + 4]
            pos += 4
        else:
            raise IndexError(f"unsupported wire type {wire} in field {number}")
        if pos > len(buf):
            raise IndexError(f"field {number} runs past the end")


def _message(value: object, number: int) -> memoryview:
    """A nested message field; anything else means the bytes are not a tf.train.Example."""
    if not isinstance(value, memoryview):
        raise IndexError(f"field {number} should be a nested message, found a number")
    return value


def _parse_feature(buf: memoryview) -> tuple[str, list[memoryview] | np.ndarray]:
    for number, _, raw in _fields(buf):
        value = _message(raw, number)
        if number == 1:  # BytesList
            return "bytes", [v for n, _, v in _fields(value) if n == 1]  # type: ignore[misc]
        if number == 2:  # FloatList: packed (wire 2) or one float per field (wire 5)
            parts = [bytes(v) for n, _, v in _fields(value) if n == 1]  # type: ignore[arg-type]
            return "float", np.frombuffer(b"".join(parts), dtype="<f4").astype(np.float32)
        if number == 3:  # Int64List: packed varints or one varint per field
            ints = [i for n, wire, v in _fields(value) if n == 1 for i in _int64s(wire, v)]
            return "int64", np.array(ints, dtype=np.uint64).view(np.int64)
    return "empty", []


def _int64s(wire: int, v: int | memoryview) -> list[int]:
    """An Int64List field's values: one varint (wire 0), or a packed run of them."""
    if wire == 0:
        return [int(v)]  # type: ignore[arg-type]
    out, pos = [], 0
    while pos < len(v):  # type: ignore[arg-type]
        item, pos = _varint(v, pos)  # type: ignore[arg-type]
        out.append(item)
    return out


def parse_example(payload: bytes | memoryview) -> dict[str, tuple[str, object]]:
    """Parse a serialized tf.train.Example into {name: (kind, value)}; kind: bytes/float/int64."""
    features: dict[str, tuple[str, object]] = {}
    for number, _, example_field in _fields(memoryview(payload)):
        if number != 1:
            continue
        for entry_number, _, entry in _fields(_message(example_field, number)):
            if entry_number != 1:
                continue
            key, value = "", memoryview(b"")
            for n, _, v in _fields(_message(entry, entry_number)):
                if n == 1:
                    key = bytes(_message(v, n)).decode()
                elif n == 2:
                    value = _message(v, n)
            features[key] = _parse_feature(value)
    return features


def read_tfrecord_sample(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """The first sample of an MLPerf CosmoFlow file: (x int16 (S, S, S, 4), y float32 (4,)).

    Every record of the file is read, CRC-checked and decoded (see `read_tfrecord`).
    """
    x, y, _ = read_tfrecord(path)
    return x, y


def read_tfrecord(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray, int]:
    """(x, y) of the first record and the number of records, each of which is read, CRC-checked
    and decoded as a sample (a corrupt later record must not pass unnoticed).

    S follows from the byte count of `x` (a cube of 4 int16 channels: 128 for MLPerf); `y` must be
    4 finite unitPar values in [-1, 1].
    """
    path = Path(path)
    first: tuple[np.ndarray, np.ndarray] | None = None
    count = 0
    for index, payload in enumerate(iter_tfrecords(path)):
        sample = decode_sample(path, index, payload)
        if first is None:
            first = sample
        count += 1
    if first is None:
        raise TFRecordError(f"{path}: holds no records")
    return first[0], first[1], count


def decode_sample(path: Path, index: int, payload: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(x int16 (S, S, S, 4), y float32 (4,)) of record `index` of `path`, checked: a cube of
    int16 counts, 4 finite unitPar in [-1, 1]; a TFRecordError naming the file and record."""
    where = f"{path}: record {index}"
    try:
        features = parse_example(payload)
    except (IndexError, UnicodeDecodeError) as err:
        raise TFRecordError(f"{where} is not a valid tf.train.Example ({err})") from None
    for name, kind in (("x", "bytes"), ("y", "float")):
        if name not in features:
            raise TFRecordError(f"{where}: missing feature '{name}' (has {sorted(features)})")
        if features[name][0] != kind:
            raise TFRecordError(
                f"{where}: feature '{name}' is a {features[name][0]} list, expected {kind}"
            )
    x_values = features["x"][1]
    assert isinstance(x_values, list)
    if len(x_values) != 1:
        raise TFRecordError(f"{where}: feature 'x' holds {len(x_values)} byte strings, expected 1")
    raw = x_values[0]
    voxels = len(raw) // (2 * NUM_CHANNELS)
    side = round(voxels ** (1 / 3))
    if side < 1 or side**3 * NUM_CHANNELS * 2 != len(raw):
        raise TFRecordError(
            f"{where}: feature 'x' has {len(raw)} bytes, not a cube of {NUM_CHANNELS} int16 "
            f"channels (side**3 * 8 bytes)"
        )
    x = np.frombuffer(raw, dtype="<i2").astype(np.int16).reshape(side, side, side, NUM_CHANNELS)
    y = np.asarray(features["y"][1], dtype=np.float32)
    if y.shape != (NUM_PARAMS,):
        raise TFRecordError(f"{where}: feature 'y' has {y.size} floats, expected {NUM_PARAMS}")
    # The same checks as the HDF5 reader's on unitPar: a NaN target would poison training.
    if not np.all(np.isfinite(y)):
        raise TFRecordError(f"{where}: feature 'y' {y.tolist()} is not finite")
    if np.any(np.abs(y) > 1.0):
        raise TFRecordError(f"{where}: feature 'y' {y.tolist()} is outside [-1, 1]")
    return x, y


# --- writing: the same format, for `cosmocub export-mlperf` -------------------------------


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2): key, length, bytes."""
    return _varint_bytes(number << 3 | 2) + _varint_bytes(len(payload)) + payload


def encode_example(x: np.ndarray, y: np.ndarray) -> bytes:
    """A serialized tf.train.Example with `x` (the counts' little-endian int16 bytes, one bytes
    value) and `y` (the unitPar as a packed FloatList): the features the MLPerf reference
    parses (FixedLenFeature [] string and [4] float32)."""
    x_bytes = np.ascontiguousarray(x, dtype="<i2").tobytes()
    y_bytes = np.asarray(y, dtype="<f4").tobytes()
    features = _field(1, _field(1, b"x") + _field(2, _field(1, _field(1, x_bytes))))
    features += _field(1, _field(1, b"y") + _field(2, _field(2, _field(1, y_bytes))))
    return _field(1, features)


def frame_record(payload: bytes) -> bytes:
    """One TFRecord record: length, its masked CRC32C, the payload, its masked CRC32C."""
    length = struct.pack("<Q", len(payload))
    return (
        length
        + struct.pack("<I", masked_crc32c(length))
        + payload
        + struct.pack("<I", masked_crc32c(payload))
    )
