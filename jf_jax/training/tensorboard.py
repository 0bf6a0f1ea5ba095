"""TensorBoard scalars from a run's ``metrics.jsonl``, with no TensorFlow / tensorboard / protobuf dependency.

A TensorBoard event file is a TFRecord stream of ``Event`` protocol buffers. Each record is
``uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)`` (little-endian), and
the few fields a scalar needs are encoded by hand here:

    Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
    Summary { repeated Value value = 1; }
    Value   { string tag = 1; float simple_value = 2; }

``metrics.jsonl`` stays the source of truth (a resumed run truncates it to its checkpoint), so the event file is
rewritten from it as a whole, atomically, rather than appended to: ``tensorboard --logdir RUN_DIR/tensorboard``
never shows the steps a crashed run lost.
"""

from __future__ import annotations

import os
import struct

from jf_jax.weights import run_dir as rd

EVENT_FILE = "events.out.tfevents.0.jf_jax"


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1  # Castagnoli polynomial, reflected
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1  # int64 fields are encoded as their two's complement
    while True:
        bits, value = value & 0x7F, value >> 7
        out.append(bits | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, wire_type: int, payload: bytes) -> bytes:
    return _varint(number << 3 | wire_type) + payload


def _bytes_field(number: int, data: bytes) -> bytes:
    return _field(number, 2, _varint(len(data)) + data)


def scalar_event(wall_time: float, step: int, values: dict[str, float]) -> bytes:
    summary = b"".join(_bytes_field(1, _bytes_field(1, tag.encode()) + _field(2, 5, struct.pack("<f", value)))
                       for tag, value in values.items())
    return _field(1, 1, struct.pack("<d", wall_time)) + _field(2, 0, _varint(step)) + _bytes_field(5, summary)


def version_event(wall_time: float) -> bytes:
    return _field(1, 1, struct.pack("<d", wall_time)) + _bytes_field(3, b"brain.Event:2")


def record(data: bytes) -> bytes:
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data))


def write_scalars(path: str, rows: list[dict], wall_time: float = 0.0) -> None:
    """Writes one event file with every numeric field of each ``{"step": s, ...}`` row as a scalar."""
    parts = [record(version_event(wall_time))]
    for row in rows:
        values = {k: float(v) for k, v in row.items() if k != "step" and isinstance(v, (int, float))}
        parts.append(record(scalar_event(wall_time, int(row["step"]), values)))
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(b"".join(parts))
    os.replace(tmp, path)


def export_run(run_dir: str) -> str | None:
    """``RUN_DIR/tensorboard/<event file>`` from ``RUN_DIR/metrics.jsonl``; None when there are no metrics."""
    rows = rd.read_metrics(run_dir)
    if not rows:
        return None
    os.makedirs(os.path.join(run_dir, rd.TENSORBOARD_DIR), exist_ok=True)
    out = os.path.join(run_dir, rd.TENSORBOARD_DIR, EVENT_FILE)
    write_scalars(out, rows, wall_time=os.path.getmtime(os.path.join(run_dir, rd.METRICS_FILE)))
    return out
