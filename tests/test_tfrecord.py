"""MLPerf TFRecord reader (src/cosmocub/data/tfrecord.py): real samples and corrupted copies."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

from cosmocub.data.tfrecord import (
    TFRecordError,
    iter_tfrecords,
    masked_crc32c,
    parse_example,
    read_tfrecord_sample,
)
from cosmocub.io import sha256_file

# From ../shared/data/cosmoflow-real-samples/README.md
REAL_SHA256 = {
    "21688988_univ_ics_2019-03_a10018182_006.tfrecord": (
        "14c44b73b24070f3d76407de5e18cac69b63e310c5eba58f63291352f751efc5"
    ),
    "21688988_univ_ics_2019-03_a10021730_018.tfrecord": (
        "73bb07e96926a76c8c9e02c4d4952ddd9a967821ade2442732143ebac1b57365"
    ),
    "22098324_univ_ics_2019-03_a13254982_001.tfrecord": (
        "70b139df4a08ea5dac59260e4098c8a815f8bebca77e124e661e80990bd64c34"
    ),
}


# --- a tiny writer, the mirror image of the reader, to build test files --------------------
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _example(x: bytes | None, y: np.ndarray | None, *, packed: bool = True) -> bytes:
    entries = b""
    if x is not None:
        feature = _field(1, _field(1, x))  # Feature{bytes_list{value: x}}
        entries += _field(1, _field(1, b"x") + _field(2, feature))
    if y is not None:
        floats = np.asarray(y, "<f4")
        if packed:
            float_list = _field(1, floats.tobytes())
        else:  # one wire-type-5 field per float, as some writers emit
            float_list = b"".join(_varint(1 << 3 | 5) + f.tobytes() for f in floats)
        entries += _field(1, _field(1, b"y") + _field(2, _field(2, float_list)))
    return _field(1, entries)


def _frame(payload: bytes) -> bytes:
    length = struct.pack("<Q", len(payload))
    return (
        length
        + struct.pack("<I", masked_crc32c(length))
        + payload
        + struct.pack("<I", masked_crc32c(payload))
    )


def _write(path: Path, raw: bytes, *, compress: bool = True) -> Path:
    path.write_bytes(gzip.compress(raw) if compress else raw)
    return path


@pytest.fixture
def small_sample() -> tuple[np.ndarray, np.ndarray, bytes]:
    rng = np.random.default_rng(5)
    x = rng.poisson(1.0, size=(8, 8, 8, 4)).astype(np.int16)
    y = np.array([0.25, -0.5, 0.75, -1.0], dtype=np.float32)
    return x, y, _frame(_example(x.astype("<i2").tobytes(), y))


# --- tests -------------------------------------------------------------------------------
def test_masked_crc_known_value() -> None:
    # CRC32C("123456789") = 0xE3069283 (RFC 3720 check value); masked by hand:
    crc = 0xE3069283
    assert masked_crc32c(b"123456789") == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) % 2**32


@pytest.mark.realdata
def test_real_samples(real_samples: list[Path]) -> None:
    assert [p.name for p in real_samples] == sorted(REAL_SHA256)
    for path in real_samples:
        assert sha256_file(path) == REAL_SHA256[path.name]
        x, y = read_tfrecord_sample(path)
        assert x.shape == (128, 128, 128, 4) and x.dtype == np.int16
        assert y.shape == (4,) and y.dtype == np.float32
        assert np.all(np.abs(y) <= 1)
        assert x.min() >= 0
        # Mean count is about one particle per voxel per channel in the public universes.
        assert 0.85 < x.mean() < 1.2
    x, y = read_tfrecord_sample(real_samples[0])
    np.testing.assert_allclose(y, [-0.5267246, -0.1341405, 0.4718833, -0.2802058], atol=1e-6)
    assert x.max() == 1019
    assert len(list(iter_tfrecords(real_samples[0]))) == 1


def test_round_trip_packed_and_unpacked(tmp_path: Path, small_sample) -> None:
    x, y, framed = small_sample
    back_x, back_y = read_tfrecord_sample(_write(tmp_path / "s.tfrecord", framed))
    np.testing.assert_array_equal(back_x, x)
    np.testing.assert_array_equal(back_y, y)
    unpacked = _frame(_example(x.tobytes(), y, packed=False))
    _, back_y = read_tfrecord_sample(_write(tmp_path / "u.tfrecord", unpacked))
    np.testing.assert_array_equal(back_y, y)


def test_several_records_are_iterated(tmp_path: Path) -> None:
    payloads = [b"", b"a", b"bc" * 1000]
    path = _write(tmp_path / "many.tfrecord", b"".join(_frame(p) for p in payloads))
    assert list(iter_tfrecords(path)) == payloads
    plain = _write(tmp_path / "plain.tfrecord", _frame(b"xyz"), compress=False)
    assert list(iter_tfrecords(plain, compressed=False)) == [b"xyz"]


def test_parse_example_keeps_unknown_features() -> None:
    feats = parse_example(_example(b"\x01\x00", np.array([1.5], np.float32)))
    assert feats["x"][0] == "bytes" and bytes(feats["x"][1][0]) == b"\x01\x00"
    np.testing.assert_array_equal(feats["y"][1], [1.5])


def _one_line(err: pytest.ExceptionInfo, path: Path) -> None:
    assert str(err.value).startswith(str(path)) and "\n" not in str(err.value)


def test_payload_crc_mismatch(tmp_path: Path, small_sample) -> None:
    framed = bytearray(small_sample[2])
    framed[100] ^= 0x01
    path = _write(tmp_path / "flip.tfrecord", bytes(framed))
    with pytest.raises(TFRecordError, match=r"record 0: CRC mismatch in the \d+-byte payload") as e:
        read_tfrecord_sample(path)
    _one_line(e, path)


def test_length_crc_mismatch(tmp_path: Path, small_sample) -> None:
    framed = bytearray(small_sample[2])
    framed[8] ^= 0xFF
    path = _write(tmp_path / "len.tfrecord", bytes(framed))
    with pytest.raises(TFRecordError, match=r"CRC mismatch in the length header"):
        read_tfrecord_sample(path)


def test_truncated_record(tmp_path: Path, small_sample) -> None:
    framed = small_sample[2]
    path = _write(tmp_path / "cut.tfrecord", framed[:-10])
    with pytest.raises(TFRecordError, match=rf"record 0 is truncated: {len(framed) - 22} of "):
        read_tfrecord_sample(path)
    path = _write(tmp_path / "cuthead.tfrecord", framed + framed[:5])
    with pytest.raises(TFRecordError, match=r"record 1 is truncated: header has 5 of 12"):
        list(iter_tfrecords(path))


def test_not_gzip_and_truncated_gzip(tmp_path: Path, small_sample) -> None:
    plain = _write(tmp_path / "plain.tfrecord", small_sample[2], compress=False)
    with pytest.raises(TFRecordError, match=r"plain.tfrecord: not a valid GZIP file") as e:
        read_tfrecord_sample(plain)
    _one_line(e, plain)
    blob = gzip.compress(small_sample[2])
    cut = tmp_path / "cutgz.tfrecord"
    cut.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(TFRecordError, match=r"cutgz.tfrecord: GZIP stream is truncated"):
        read_tfrecord_sample(cut)
    with pytest.raises(TFRecordError, match=r"nothere.tfrecord: no such TFRecord file"):
        read_tfrecord_sample(tmp_path / "nothere.tfrecord")
    empty = _write(tmp_path / "empty.tfrecord", b"")
    with pytest.raises(TFRecordError, match=r"empty.tfrecord: holds no records"):
        read_tfrecord_sample(empty)


def test_missing_feature_and_wrong_sizes(tmp_path: Path, small_sample) -> None:
    x, y, _ = small_sample
    no_y = _write(tmp_path / "noy.tfrecord", _frame(_example(x.tobytes(), None)))
    with pytest.raises(TFRecordError, match=r"missing feature 'y' \(has \['x'\]\)"):
        read_tfrecord_sample(no_y)
    odd = _write(tmp_path / "odd.tfrecord", _frame(_example(x.tobytes()[:-8], y)))
    with pytest.raises(TFRecordError, match=r"'x' has 4088 bytes, not a cube"):
        read_tfrecord_sample(odd)
    three = _write(tmp_path / "three.tfrecord", _frame(_example(x.tobytes(), y[:3])))
    with pytest.raises(TFRecordError, match=r"'y' has 3 floats, expected 4"):
        read_tfrecord_sample(three)
    garbage = _write(tmp_path / "garbage.tfrecord", _frame(b"\x0a\xff\xff\xff\x0f"))
    with pytest.raises(TFRecordError, match=r"not a valid tf.train.Example"):
        read_tfrecord_sample(garbage)


def test_example_with_a_number_where_a_message_belongs_is_a_clean_error():
    from cosmocub.data.tfrecord import parse_example

    # Field 1 of an Example (its Features) sent as a varint: wire type 0, value 5.
    with pytest.raises(IndexError, match="field 1 should be a nested message"):
        parse_example(bytes([0x08, 0x05]))
    # Features → entry → value (field 2) sent as a varint.
    entry = bytes([0x0A, 0x01, ord("x"), 0x10, 0x05])  # key "x", value: varint 5
    features = bytes([0x0A, len(entry)]) + entry
    with pytest.raises(IndexError, match="field 2 should be a nested message"):
        parse_example(bytes([0x0A, len(features)]) + features)


@pytest.mark.parametrize(
    ("y", "message"),
    [
        ([0.1, float("nan"), 0.2, 0.3], r"record 0: feature 'y' \[0\.1.*nan.*\] is not finite"),
        ([0.1, 0.2, 1.5, 0.3], r"record 0: feature 'y' \[.*1\.5.*\] is outside \[-1, 1\]"),
    ],
)
def test_targets_are_checked_like_the_hdf5_reader(tmp_path: Path, small_sample, y, message):
    x, _, _ = small_sample
    framed = _frame(_example(x.astype("<i2").tobytes(), np.array(y, np.float32)))
    path = _write(tmp_path / "bad_y.tfrecord", framed)
    with pytest.raises(TFRecordError, match=message) as err:
        read_tfrecord_sample(path)
    _one_line(err, path)


def test_every_record_is_read_and_checked(tmp_path: Path, small_sample) -> None:
    """Not just the first: a corrupt or malformed later record fails the read."""
    from cosmocub.data.inspect import inspect_path
    from cosmocub.data.tfrecord import read_tfrecord

    x, y, framed = small_sample
    good = _write(tmp_path / "three.tfrecord", framed * 3)
    back_x, back_y, count = read_tfrecord(good)
    assert count == 3
    np.testing.assert_array_equal(back_x, x)
    np.testing.assert_array_equal(back_y, y)
    report = inspect_path(good)
    assert report["records"] == 3
    broken = bytearray(framed)
    broken[-10] ^= 0xFF  # a payload byte of the last record
    path = _write(tmp_path / "bad_last.tfrecord", framed + framed + bytes(broken))
    with pytest.raises(TFRecordError, match=r"record 2: CRC mismatch in the \d+-byte payload"):
        read_tfrecord(path)
    no_y = _frame(_example(x.astype("<i2").tobytes(), None))
    path = _write(tmp_path / "no_y_second.tfrecord", framed + no_y)
    with pytest.raises(TFRecordError, match=r"record 1: missing feature 'y'"):
        read_tfrecord_sample(path)
