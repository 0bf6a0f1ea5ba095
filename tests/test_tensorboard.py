"""The dependency-free TensorBoard writer: CRC32C check values and an independent decode of the records."""

import json
import struct

import pytest

from jf_jax.training import tensorboard


def test_crc32c_check_values():
    assert tensorboard.crc32c(b"123456789") == 0xE3069283  # the CRC-32C catalogue check value
    assert tensorboard.crc32c(b"") == 0
    assert tensorboard.crc32c(bytes(32)) == 0x8A9136AA  # RFC 3720 B.4: 32 bytes of zeros


def _varint(buf, i):
    shift = value = 0
    while True:
        b = buf[i]
        value |= (b & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if not b & 0x80:
            return value, i


def _fields(buf):
    """Protobuf wire format -> list of (field number, value) (bytes for length-delimited fields)."""
    out, i = [], 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 1:
            value, i = struct.unpack("<d", buf[i:i + 8])[0], i + 8
        elif wire == 5:
            value, i = struct.unpack("<f", buf[i:i + 4])[0], i + 4
        elif wire == 2:
            n, i = _varint(buf, i)
            value, i = buf[i:i + n], i + n
        else:
            raise AssertionError(f"unexpected wire type {wire}")
        out.append((number, value))
    return out


def _records(data):
    i = 0
    while i < len(data):
        header = data[i:i + 8]
        (length,) = struct.unpack("<Q", header)
        assert struct.unpack("<I", data[i + 8:i + 12])[0] == tensorboard.masked_crc32c(header)
        payload = data[i + 12:i + 12 + length]
        assert struct.unpack("<I", data[i + 12 + length:i + 16 + length])[0] == tensorboard.masked_crc32c(payload)
        yield payload
        i += 16 + length


def test_event_file_decodes_to_the_metrics(tmp_path):
    rows = [{"step": 1, "loss/total": 2.5, "loss/ar": 0.25}, {"step": 300, "loss/total": -1.0, "note": "x"}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = tensorboard.export_run(str(tmp_path))
    with open(path, "rb") as f:
        events = [dict(_fields(r)) for r in _records(f.read())]
    assert events[0][3] == b"brain.Event:2"
    decoded = []
    for event in events[1:]:
        values = {}
        for _, value in _fields(event[5]):
            v = dict(_fields(value))
            values[v[1].decode()] = v[2]
        decoded.append({"step": event[2], **values})
    assert decoded == [{"step": 1, "loss/total": 2.5, "loss/ar": 0.25}, {"step": 300, "loss/total": -1.0}]
    assert tensorboard.export_run(str(tmp_path / "missing")) is None


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 2**40, -1])
def test_varint_round_trip(value):
    decoded, _ = _varint(tensorboard._varint(value), 0)
    assert decoded == value & (2**64 - 1)
