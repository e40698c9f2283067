"""``etmlx inspect``: what a .pte holds, with each etmlx delegate's MLX nodes in order."""

import collections
import math
import textwrap

from etmlx.runtime_shim.describe import describe
from etmlx.runtime_shim.pte_file import read_pte
from etmlx.serializer import BACKEND_ID, deserialize, node_type
from etmlx.serializer.generated.etmlx_ir.QuantMode import QuantMode
from etmlx.serializer.generated.etmlx_ir.QuantizedPart import QuantizedPart
from etmlx.serializer.ir import DTYPE_NAMES, NUMPY_STORAGE, QUANT_MODE_NAMES


def inspect_program(path_or_bytes) -> dict:
    """``{"methods": {name: {"inputs", "outputs", "delegates": [...], "kernels": [...]}},
    "named_data": {key: bytes}}``; each delegate lists its ``nodes`` (IR node types in
    execution order), ``constants`` and ``buffers`` when it is an etmlx one."""
    pte = read_pte(path_or_bytes)
    info = describe(pte)
    methods = {}
    for plan, method in zip(pte.program.plans, info.methods):
        methods[method.name] = {
            "inputs": [_io(v) for v in method.inputs],
            "outputs": [_io(v) for v in method.outputs],
            "delegates": [_delegate(pte, d) for d in plan.delegates],
            "kernels": list(method.kernel_calls),
        }
    report = {"file_size": info.file_size, "methods": methods, "named_data": dict(info.named_data)}
    report["held_bytes"] = held_bytes(report)
    return report


def buffer_dtypes(path_or_bytes, method: str = "forward") -> set:
    """The dtypes (``"bfloat16"``, ...) of the buffers ``method``'s etmlx delegates hold (a
    language model's caches: the dtype it computes in), reading no other part of them."""
    pte = read_pte(path_or_bytes)
    names = [m.name for m in describe(pte).methods]
    if method not in names:
        return set()
    delegates = pte.program.plans[names.index(method)].delegates
    graphs = [deserialize(pte.delegate_data(d)) for d in delegates if d.id == BACKEND_ID]
    return {DTYPE_NAMES[b.initial.dtype].lower() for graph in graphs for b in graph.buffers or []}


def held_bytes(report: dict) -> dict:
    """What a load of the program holds in MLX, ``{"constants": n, "buffers": n,
    "growing_buffers": n}``: each constant once per key, dtype and shape (the runtimes
    share them between methods), each buffer once per name; ``growing_buffers`` is what
    the buffers that grow with the tokens held (KV caches) take at their capacity, of
    which a load holds nothing until calls write them."""
    sizes, constants, buffers, growing = report["named_data"], {}, {}, {}
    for method in report["methods"].values():
        for delegate in method["delegates"]:
            for tensor in delegate.get("constants", []):
                constants[(tensor["key"], tensor["dtype"], tuple(tensor["shape"]))] = sizes.get(tensor["key"], 0)
            for tensor in delegate.get("buffers", []):
                (buffers if tensor["grows_along"] is None else growing)[tensor["name"]] = tensor["bytes"]
    totals = {"constants": constants, "buffers": buffers, "growing_buffers": growing}
    return {name: sum(part.values()) for name, part in totals.items()}


def constant_methods(path_or_bytes) -> dict:
    """``{name: [values]}`` of the methods that take no input and return constants only
    (``to_edge(..., constant_methods=...)``: an LLM's runner metadata), read from the file."""
    pte = read_pte(path_or_bytes)
    constants = {}
    for plan in pte.program.plans:
        values = [plan.values[i] for i in plan.outputs]
        if not plan.inputs and not plan.instructions and all(isinstance(v, (bool, int, float, str)) for v in values):
            constants[plan.name] = values
    return constants


def _io(value) -> dict:
    if value.kind != "tensor":
        return {"kind": value.kind}
    return {"kind": "tensor", "dtype": value.dtype, "sizes": list(value.sizes), "dynamism": value.dynamism}


def _delegate(pte, delegate) -> dict:
    entry = {"backend": delegate.id, "payload_bytes": len(pte.delegate_data(delegate))}
    if delegate.id != BACKEND_ID:
        return entry
    graph = deserialize(pte.delegate_data(delegate))
    entry["nodes"] = [node_type(node) for node in graph.nodes or []]
    entry["constants"] = [_named(c) for c in graph.constants or []]
    entry["buffers"] = [
        {"name": b.name, **_named(b.initial), "grows_along": b.growAxis if b.growAxis >= 0 else None,
         "bytes": math.prod(b.initial.shape or []) * NUMPY_STORAGE[b.initial.dtype].itemsize}
        for b in graph.buffers or []
    ]
    entry["quantized"] = _quantized_weights(graph)
    entry["quantized_cache"] = [  # per keys or values written to a quantized KV cache
        {"format": f"int{node.op.bits}", "group_size": node.op.groupSize}
        for node in graph.nodes or [] if node_type(node) == "Quantize" and node.op.part == QuantizedPart.Words
    ]
    return entry


def _quantized_weights(graph) -> list:
    """Per quantized weight a node reads, in execution order: its node, the format it runs
    in (``int4``, groups of 64; ``mxfp8``, groups of 32) and its logical shape (the packed
    words unpacked). Not a quantized KV cache's reads: their words are no constant."""
    shapes = {c.slot: list(c.shape or []) for c in graph.constants or []}
    gathered = {node.op.out.idx: node.op.x.idx for node in graph.nodes or [] if node_type(node) == "Take"}
    weights = []
    for node in graph.nodes or []:
        kind = node_type(node)
        if kind not in ("QuantizedMatmul", "Dequantize", "GatherQmm"):
            continue
        op = node.op
        table = gathered.get(op.w.idx, op.w.idx)  # an embedding's rows are taken from its table first
        if table not in shapes:
            continue
        shape = list(shapes[table])
        if shape and op.bits:
            shape[-1] = shape[-1] * 32 // op.bits
        mode = getattr(op, "mode", QuantMode.Affine)
        name = f"int{op.bits}" if mode == QuantMode.Affine else QUANT_MODE_NAMES[mode]
        weights.append({"node": kind, "format": name, "group_size": op.groupSize, "shape": shape})
    return weights


def _named(tensor) -> dict:
    return {"key": tensor.key, "dtype": DTYPE_NAMES[tensor.dtype].lower(), "shape": list(tensor.shape or [])}


def format_text(report: dict, constants: bool = False) -> str:
    """The report for people: per delegate its nodes, buffers, and its constants as one
    summary line (count and bytes), or one line each with ``constants``."""
    held = report["held_bytes"]
    lines = [
        f"file size: {report['file_size']} bytes",
        f"held once loaded: {held['constants']} bytes of constants, {held['buffers']} bytes of buffers",
    ]
    if held["growing_buffers"]:
        lines.append(f"and as tokens are held: KV caches that grow to {held['growing_buffers']} bytes")
    for name, method in report["methods"].items():
        lines.append(f"method {name}:")
        for label in ("inputs", "outputs"):
            shown = ", ".join(_io_text(v) for v in method[label]) or "none"
            lines.append(f"  {label}: {shown}")
        for i, delegate in enumerate(method["delegates"]):
            lines.append(f"  delegate {i}: {delegate['backend']} ({delegate['payload_bytes']} bytes of IR)")
            if "nodes" in delegate:
                chain = textwrap.wrap(" -> ".join(delegate["nodes"]), 96, break_on_hyphens=False)
                lines.append(f"    nodes ({len(delegate['nodes'])}):")
                lines.extend(f"      {part}" for part in chain)
                formats = collections.Counter(
                    f"{w['format']} in groups of {w['group_size']}" for w in delegate.get("quantized", [])
                )
                if formats:
                    lines.append("    quantized weights: " + ", ".join(f"{n} {f}" for f, n in sorted(formats.items())))
                cache = collections.Counter(
                    f"{w['format']} in groups of {w['group_size']}" for w in delegate.get("quantized_cache", [])
                )
                if cache:
                    lines.append("    KV cache quantized: " + ", ".join(f"{n} writes {f}" for f, n in sorted(cache.items())))
                sizes = report["named_data"]
                if not constants:
                    total = sum(sizes.get(tensor["key"], 0) for tensor in delegate["constants"])
                    lines.append(f"    constants: {len(delegate['constants'])}, {total} bytes (--constants lists them)")
                for label in ("constants", "buffers") if constants else ("buffers",):
                    for tensor in delegate[label]:
                        held = _held_text(tensor, sizes)
                        lines.append(f"    {label[:-1]} {tensor['dtype']}{tensor['shape']}: {held}")
        kernels = method["kernels"]
        lines.append(f"  kernels outside MLX ({len(kernels)}): {', '.join(kernels) or 'none'}")
    return "\n".join(lines)


def _held_text(tensor: dict, sizes: dict) -> str:
    if tensor.get("grows_along") is not None:
        return f"grows along axis {tensor['grows_along']} to {tensor['bytes']} bytes ({tensor['name']})"
    return f"{sizes.get(tensor['key'], 0)} bytes ({tensor['key']})"


def _io_text(value: dict) -> str:
    if value["kind"] != "tensor":
        return value["kind"]
    dynamic = "" if value["dynamism"] == "static" else " (upper bounds)"
    return f"{value['dtype']}{value['sizes']}{dynamic}"
