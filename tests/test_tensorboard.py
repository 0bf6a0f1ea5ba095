"""The TensorBoard export: the event file decodes (record framing read here, Event protos by tensorboardX's own
schema) to exactly the metrics, and a rewrite replaces the file instead of adding one."""

import json
import os
import struct

from tensorboardX.proto.event_pb2 import Event

from jf_jax.training import tensorboard


def _records(data):
    i = 0
    while i < len(data):
        (length,) = struct.unpack("<Q", data[i:i + 8])
        yield data[i + 12:i + 12 + length]
        i += 16 + length
    assert i == len(data)


def _decode(path):
    with open(path, "rb") as f:
        events = [Event.FromString(r) for r in _records(f.read())]
    assert events[0].file_version.startswith("brain.Event")
    steps = {}
    for e in events[1:]:
        for v in e.summary.value:
            steps.setdefault(e.step, {})[v.tag] = v.simple_value
    return [{"step": s, **values} for s, values in sorted(steps.items())]


def test_event_file_decodes_to_the_metrics(tmp_path):
    rows = [{"step": 1, "loss/total": 2.5, "loss/ar": 0.25}, {"step": 300, "loss/total": -1.0, "note": "x"}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = tensorboard.export_run(str(tmp_path))
    assert _decode(path) == [{"step": 1, "loss/total": 2.5, "loss/ar": 0.25}, {"step": 300, "loss/total": -1.0}]
    # a resumed run truncates its metrics: the export is rewritten, one file, with only the kept steps
    (tmp_path / "metrics.jsonl").write_text(json.dumps(rows[0]) + "\n")
    assert tensorboard.export_run(str(tmp_path)) == path
    assert os.listdir(tmp_path / "tensorboard") == [tensorboard.EVENT_FILE]
    assert _decode(path) == [{"step": 1, "loss/total": 2.5, "loss/ar": 0.25}]
    assert tensorboard.export_run(str(tmp_path / "missing")) is None
