"""A trial's profiler trace in JAX, and what its events are. Mirror image of torch_impl/profile.py.

`record` runs a few more steps, after the timed window and never inside it, under jax.profiler.trace, each step
in a "step" annotation. It writes the XProf trace (<folder>/plugins/profile/<time>/*.xplane.pb: TensorBoard with
the profile plugin opens the folder) and a Perfetto trace beside it (perfetto_trace.json.gz: Perfetto's UI opens
it). `classify` names each event's category for bench.measure.timeline: an XLA operation's event carries its
program and instruction (hlo_module, hlo_op), and the compiled programs' HLO says what the instruction computes:
its opcode, those of the computation it fuses, and where in the Python it came from (op_name, stack frames).
"""

from __future__ import annotations

import re
from pathlib import Path

import jax

from bench.jax_impl.flops import split_shape
from bench.measure.timeline import STEP_EVENT

TRACE_GLOB = "plugins/profile/*/perfetto_trace.json.gz"
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")
# op_name words of random draws: jax.random's programs (the tangents, MeZO's perturbations, dropout masks, the
# keys folded for them)
RANDOM = (
    "rng_bit_generator",
    "rng-bit-generator",
    "random_bits",
    "threefry",
    "_uniform",
    "_normal",
    "_bernoulli",
    "random_fold_in",
    "random_wrap",
    "dropout_key",
)
MATMUL_CALLS = ("matmul", "gemm", "onednn", "dot")  # custom-call targets that are matmuls (oneDNN, cuBLAS)
SOFTMAX = "softmax"  # the named scope every family's JAX attention puts around its softmax
OPTIMIZER_SOURCE = "/optax/"

_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%([^\s=]+) = (.*)$")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%([^\s(]+)\s*\(.*\{\s*$")
_OPNAME = re.compile(r'op_name="([^"]*)"')
_FRAME = re.compile(r"stack_frame_id=(\d+)")
_CALLS = re.compile(r"calls=%([^\s,}]+)")
_TARGET = re.compile(r'custom_call_target="([^"]*)"')


def record(trainer, updates: list, folder: Path) -> Path:
    """Run one step per update under jax.profiler.trace, synced, each in a "step" annotation; the trace ->
    folder. Returns the Perfetto trace's path."""
    folder.mkdir(parents=True, exist_ok=True)
    with jax.profiler.trace(str(folder), create_perfetto_trace=True):
        for batches in updates:
            with jax.profiler.TraceAnnotation(STEP_EVENT):
                trainer.sync(trainer.step(batches))
    found = sorted(folder.glob(TRACE_GLOB))
    if not found:
        raise FileNotFoundError(f"jax.profiler.trace left no {TRACE_GLOB} under {folder}")
    return found[-1]


def classify(trainer, events: list[dict]):
    """event, the names enclosing it -> its category, or None for what is not an operation. The operations are
    the events of an XLA instruction (args hlo_module, hlo_op); in a GPU trace only those on the device, so that
    busy time is the GPU's and `overhead` the time it waited for the host."""
    programs = {}
    for compiled, _ in trainer.programs():
        text = compiled.as_text()
        programs[module_name(text)] = instruction_categories(text)
    devices = {
        e.get("pid")
        for e in events
        if e.get("ph") == "M"
        and e.get("name") == "process_name"
        and "/device:" in str(e.get("args", {}).get("name", ""))
    }

    def category(event: dict, enclosing: tuple[str, ...]) -> str | None:
        args = event.get("args") or {}
        if "hlo_op" not in args or (devices and event.get("pid") not in devices):
            return None
        known = programs.get(args.get("hlo_module", ""), {})
        return known.get(args["hlo_op"], "elementwise")

    return category


def module_name(hlo_text: str) -> str:
    return hlo_text.split(None, 2)[1].rstrip(",")


def instruction_categories(hlo_text: str) -> dict[str, str]:
    """Every instruction of a compiled program's HLO text -> its category. A fusion is what it fuses: random if
    it draws, attention for a batched matmul (the scores and context) or the softmax, matmul for any other
    matmul, the optimizer's if its source is optax, else elementwise (layer norms, activations, copies)."""
    files = source_files(hlo_text)
    computations: dict[str, list[dict]] = {}
    current = None
    for line in hlo_text.splitlines():
        head = _COMPUTATION.match(line)
        if head:
            current = computations.setdefault(head.group(1), [])
            continue
        m = _INSTR.match(line)
        if m is None or current is None:
            continue
        name, rest = m.groups()
        frame = _FRAME.search(rest)
        calls = _CALLS.search(rest)
        target = _TARGET.search(rest)
        current.append(
            {
                "name": name,
                "opcode": opcode(rest),
                "op_name": (_OPNAME.search(rest) or [None, ""])[1],
                "files": files.get(int(frame.group(1)), ()) if frame else (),
                "fuses": calls.group(1) if calls and " fusion(" in rest else None,
                "batched": "lhs_batch_dims=" in rest,
                "target": target.group(1).lower() if target else "",
            }
        )

    def contents(instr: dict, depth: int = 0) -> list[dict]:
        inner = computations.get(instr["fuses"], []) if instr["fuses"] and depth < 4 else []
        return [instr] + [c for i in inner for c in contents(i, depth + 1)]

    return {i["name"]: category_of(contents(i)) for body in computations.values() for i in body}


def category_of(parts: list[dict]) -> str:
    if any(p["opcode"].removesuffix("-start").removesuffix("-done") in COLLECTIVES for p in parts):
        return "collectives"
    if any(p["opcode"] in ("rng", "rng-bit-generator") or any(w in p["op_name"] for w in RANDOM) for p in parts):
        return "random"
    dots = [
        p
        for p in parts
        if p["opcode"] in ("dot", "convolution")
        or (p["opcode"] == "custom-call" and any(w in p["target"] for w in MATMUL_CALLS))
    ]
    if any(p["batched"] for p in dots) or any(SOFTMAX in p["op_name"] for p in parts):
        return "attention"
    if dots:
        return "matmul"
    if any(OPTIMIZER_SOURCE in f for p in parts for f in p["files"]):
        return "optimizer"
    return "elementwise"


def opcode(rest: str) -> str:
    """The opcode of an instruction's right-hand side: its shape (a tuple's in parentheses), then `opcode(`."""
    m = re.match(r"([a-z][\w\-]*)\(", split_shape(rest)[1])
    return m.group(1) if m else ""


def source_files(hlo_text: str) -> dict[int, tuple[str, ...]]:
    """stack_frame_id -> the source files of the frame and its callers, from the HLO text's FileNames,
    FileLocations and StackFrames tables."""
    tables: dict[str, dict[int, str]] = {}
    section = None
    for line in hlo_text.splitlines():
        if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            section = tables.setdefault(line, {})
            continue
        if section is None:
            continue
        if not line or not line[0].isdigit():
            if line.startswith(("HloModule", "ENTRY", "%")):
                break
            section = None if not line else section
            continue
        key, value = line.split(" ", 1)
        section[int(key)] = value
    names = {k: v.strip('"') for k, v in tables.get("FileNames", {}).items()}
    location_file = {
        k: int(re.search(r"file_name_id=(\d+)", v).group(1))
        for k, v in tables.get("FileLocations", {}).items()
        if "file_name_id=" in v
    }
    frames = {}
    for k, v in tables.get("StackFrames", {}).items():
        loc, parent = re.search(r"file_location_id=(\d+)", v), re.search(r"parent_frame_id=(\d+)", v)
        frames[k] = (int(loc.group(1)) if loc else 0, int(parent.group(1)) if parent else 0)
    out = {}
    for k in frames:
        seen, chain, f = set(), [], k
        while f in frames and f not in seen:
            seen.add(f)
            loc, parent = frames[f]
            chain.append(names.get(location_file.get(loc, 0), ""))
            f = parent
        out[k] = tuple(chain)
    return out
