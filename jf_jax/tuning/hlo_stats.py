"""What a compiled program does per step, read from its optimized HLO text (``compiled.as_text()``): the bytes its
collectives move, the FLOPs of its dots and the bytes its ops read and write, with loops counted as they run.

XLA's own ``cost_analysis()`` counts the body of a ``while`` loop once, whatever its trip count (a ``lax.scan``
over 28 layers reports one layer's FLOPs), so it cannot price a training step whose layers run under ``scan``.
Here every computation gets a multiplicity (how many times one step runs it): 1 for the entry, the caller's times
the loop's ``known_trip_count`` for a loop body (and one more for its condition), the caller's for anything else it
calls (fusions, conditional branches: each branch is counted as if taken). All figures are per device: after SPMD
partitioning the module is one device's program.

* Collectives (``all-reduce``, ``all-gather``, ``reduce-scatter``, ``all-to-all``, ``collective-permute``, and
  their ``-start`` halves; ``-done`` halves are not counted twice): each op counts the larger of its operands'
  bytes and its result's bytes on the device (the whole buffer the collective works on: the gathered result of an
  all-gather, the unscattered operand of a reduce-scatter), times its computation's multiplicity.
* FLOPs: ``2 * (result elements) * (contracted elements)`` of every ``dot`` (inside fusions too). Elementwise
  work is not counted: a transformer step's FLOPs are its matmuls.
* Bytes: operands + result of every op of the computations that run as a sequence (the entry, loop bodies,
  branches; a fusion counts as one op: its inputs and output), the way XLA's cost analysis counts memory traffic:
  a slice read (``dynamic-slice``, ``gather``, ``slice``, also of a fusion's input) counts the slice, an in-place
  update (``dynamic-update-slice``, ``scatter``, also as a fusion's root) counts the update, not the whole buffer
  (a layer loop reads one layer of a stacked weight per step). These are XLA:CPU's fusion decisions, so the
  figure is indicative of a GPU's or TPU's, not equal to it.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import defaultdict

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
DTYPE_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
               "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
FREE_OPS = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all", "partition-id",
            "replica-id", "while", "conditional", "call"}
"""Ops that move no data themselves (the control-flow ops' work is in the computations they run)."""

_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%([^\s=]+)\s*=\s*(.*)$")
_HEADER = re.compile(r"^(?:ENTRY\s+)?%([^\s(]+)\s*\(.*\{\s*$")
_ARRAY = re.compile(r"\b([a-z]+[0-9]*)\[([0-9,]*)\]")
_OP = re.compile(r"([a-z][a-z0-9\-]*)\(")
_CALLED = re.compile(r"\b(body|condition|calls|to_apply|true_computation|false_computation)=%([^\s,}]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_CONTRACTING = re.compile(r"lhs_contracting_dims=\{([0-9,]*)\}")


@dataclasses.dataclass(frozen=True)
class Instruction:
    name: str
    op: str
    shape: str
    operands: tuple[str, ...]
    attributes: str
    parameter: int | None = None
    """A ``parameter(i)`` instruction's index."""

    @property
    def bytes(self) -> float:
        return shape_bytes(self.shape)


@dataclasses.dataclass(frozen=True)
class HloStats:
    """Per-device, per-step totals of one compiled program (see the module docstring for how each is counted)."""

    collective_bytes: dict[str, float]
    """Per collective kind: bytes per step (0 for kinds the program does not use)."""
    collective_ops: dict[str, int]
    """Per collective kind: executions per step (an op inside a 28-step loop counts 28)."""
    dot_flops: float
    op_bytes: float
    loops: tuple[int, ...]
    """The known trip count of every loop (what multiplied the counts)."""

    @property
    def total_collective_bytes(self) -> float:
        return sum(self.collective_bytes.values())

    def to_json(self) -> dict:
        return dict(collective_bytes=self.collective_bytes, collective_ops=self.collective_ops,
                    total_collective_bytes=self.total_collective_bytes, dot_flops=self.dot_flops,
                    op_bytes=self.op_bytes, loop_trip_counts=list(self.loops))


def shape_bytes(shape: str) -> float:
    """Bytes of an HLO shape (an array or a tuple of arrays), e.g. ``(f32[4,8]{1,0}, s32[])``."""
    return sum(DTYPE_BYTES.get(dt, 0) * math.prod(int(d) for d in dims.split(",") if d)
               for dt, dims in _ARRAY.findall(shape))


def _split_shape(rest: str) -> tuple[str, str]:
    """``rest`` of an instruction line (after ``name =``) -> (shape text, text from the op name on)."""
    if rest.startswith("("):
        depth = 0
        for i, ch in enumerate(rest):
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if depth == 0:
                return rest[:i + 1], rest[i + 1:].lstrip()
    shape, _, tail = rest.partition(" ")
    return shape, tail


def _operands(text: str) -> tuple[tuple[str, ...], str]:
    """The operand names inside the op's parentheses, and the attributes after them."""
    depth = 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0 and ch == ")":
            return tuple(re.findall(r"%([^\s,()]+)", text[:i])), text[i + 1:]
    return tuple(re.findall(r"%([^\s,()]+)", text)), ""


def parse(text: str) -> dict[str, list[Instruction]]:
    """Computation name -> its instructions, in order; the entry computation is under key ``""``."""
    computations: dict[str, list[Instruction]] = {}
    current = None
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header and not line.startswith(" "):
            current = computations.setdefault("" if line.startswith("ENTRY") else header.group(1), [])
            continue
        if line.startswith("}"):
            current = None
            continue
        match = _INSTRUCTION.match(line) if current is not None else None
        if match is None:
            continue
        shape, tail = _split_shape(match.group(2))
        op = _OP.match(tail)
        if op is None:
            continue
        operands, attributes = _operands(tail[op.end() - 1:])
        index = re.match(r"parameter\((\d+)\)", tail)
        current.append(Instruction(match.group(1), op.group(1), shape, operands, attributes,
                                   int(index.group(1)) if index else None))
    return computations


def _multiplicities(computations: dict[str, list[Instruction]]) -> tuple[dict[str, int], set[str], list[int]]:
    """(times each computation runs per step, the computations that run as sequences, every loop's trip count)."""
    times: dict[str, int] = defaultdict(int)
    sequential, loops = {""}, []

    def visit(name: str, count: int):
        times[name] += count
        for ins in computations.get(name, ()):
            called = _CALLED.findall(ins.attributes)
            branches = _BRANCHES.search(ins.attributes)
            if branches:
                called += [("branch", b.strip().lstrip("%")) for b in branches.group(1).split(",") if b.strip()]
            trip = _TRIP.search(ins.attributes)
            n = int(trip.group(1)) if trip else 1
            if ins.op == "while":
                loops.append(n)
            for role, target in called:
                if target not in computations:
                    continue
                if role in ("body", "condition", "branch", "true_computation", "false_computation") or \
                        ins.op in ("call", "async-start"):
                    sequential.add(target)
                factor = n if role == "body" else n + 1 if role == "condition" else 1
                visit(target, count * factor)

    visit("", 1)
    return times, sequential, loops


SLICE_READS = ("dynamic-slice", "gather", "slice")
IN_PLACE = {"dynamic-update-slice": 1, "scatter": 2}
"""In-place updates: the operand index of the update (the bytes they write)."""


def _fusion_traffic(body: list[Instruction], shapes: dict[str, str]) -> tuple[dict[int, float], float | None]:
    """A fused computation's (bytes read per parameter index where they are less than the parameter: its slices
    read; bytes written when its root updates in place, else None)."""
    reads: dict[int, float] = {}
    root = body[-1] if body else None
    in_place_target = root.operands[0] if root is not None and root.op in IN_PLACE and root.operands else None
    for p in (ins for ins in body if ins.parameter is not None):
        users = [ins for ins in body if p.name in ins.operands]
        if p.name == in_place_target:
            reads[p.parameter] = 0.0
        elif users and all(u.op in SLICE_READS and u.operands[0] == p.name for u in users):
            reads[p.parameter] = sum(u.bytes for u in users)
    written = None
    if in_place_target is not None and len(root.operands) > IN_PLACE[root.op]:
        written = shape_bytes(shapes.get(root.operands[IN_PLACE[root.op]], ""))
    return reads, written


def _traffic(ins: Instruction, shapes: dict[str, str], fusions: dict[str, tuple[dict[int, float], float | None]]):
    """Bytes one execution of a sequential op reads and writes."""
    def operand(i: int) -> float:
        return shape_bytes(shapes.get(ins.operands[i], ""))

    if ins.op in SLICE_READS:
        return 2.0 * ins.bytes
    if ins.op in IN_PLACE and len(ins.operands) > IN_PLACE[ins.op]:
        return 2.0 * operand(IN_PLACE[ins.op])
    reads, written = {}, None
    called = re.search(r"calls=%([^\s,}]+)", ins.attributes)
    if ins.op == "fusion" and called and called.group(1) in fusions:
        reads, written = fusions[called.group(1)]
    return (sum(reads.get(i, operand(i)) for i in range(len(ins.operands)))
            + (ins.bytes if written is None else written))


def hlo_stats(text: str) -> HloStats:
    """The per-device, per-step counts of a compiled program's HLO text (``compiled.as_text()``)."""
    computations = parse(text)
    if "" not in computations:
        raise ValueError("no ENTRY computation in the HLO text")
    times, sequential, loops = _multiplicities(computations)
    shapes = {ins.name: ins.shape for body in computations.values() for ins in body}
    fusions = {name: _fusion_traffic(body, shapes) for name, body in computations.items() if name not in sequential}
    coll_bytes, coll_ops = {k: 0.0 for k in COLLECTIVES}, {k: 0 for k in COLLECTIVES}
    flops = op_bytes = 0.0
    for name, body in computations.items():
        if times.get(name, 0) == 0:
            continue
        count = times[name]
        for ins in body:
            operand_bytes = sum(shape_bytes(shapes.get(o, "")) for o in ins.operands)
            kind = ins.op.removesuffix("-start")
            if kind in COLLECTIVES and not ins.op.endswith("-done"):
                coll_bytes[kind] += count * max(ins.bytes, operand_bytes)
                coll_ops[kind] += count
            if ins.op == "dot":
                lhs = _ARRAY.search(shapes.get(ins.operands[0], "")) if ins.operands else None
                dims = [int(d) for d in lhs.group(2).split(",") if d] if lhs else []
                contracting = _CONTRACTING.search(ins.attributes)
                k = math.prod(dims[int(i)] for i in contracting.group(1).split(",") if i) if contracting else 1
                flops += count * 2.0 * k * sum(math.prod(int(d) for d in dims_.split(",") if d)
                                               for _, dims_ in _ARRAY.findall(ins.shape))
            if name in sequential and ins.op not in FREE_OPS and not ins.op.endswith("-done"):
                op_bytes += count * _traffic(ins, shapes, fusions)
    return HloStats(collective_bytes=coll_bytes, collective_ops=coll_ops, dot_flops=flops, op_bytes=op_bytes,
                    loops=tuple(loops))
