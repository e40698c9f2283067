"""``split``/``chunk`` calls rewritten as one ``slice`` per piece before ``to_edge``.

ExecuTorch 1.5.1's ``to_edge`` specializes every dynamic dim of a tensor that is split
along one of its static dims: its argument validator runs ``split_with_sizes_copy`` on
the example shapes and records a guard that fixes the other dims (measured: a SwiGLU's
``gate_up.chunk(2, -1)`` over a dynamic sequence length turned the exported length range
2..32 into exactly 4, the example's). Slices of the same extents compute the same views
and keep the dims symbolic.
"""

import operator

import torch

from etmlx.lowering.arguments import bind

aten = torch.ops.aten
_SPLITS = (aten.split.Tensor, aten.split_with_sizes.default, aten.chunk.default)


def _piece_sizes(node) -> list | None:
    """The sizes along the split dim, or None when that dim is dynamic."""
    args = bind(node)
    size = args.self.meta["val"].shape[args.dim]
    if not isinstance(size, int):
        return None
    if node.target is aten.split_with_sizes.default:
        sizes = list(args.split_sizes)
        return sizes if all(isinstance(s, int) for s in sizes) else None
    if node.target is aten.chunk.default:
        step = -(-size // args.chunks) if size else 0
    else:
        step = args.split_size
    if not isinstance(step, int) or step <= 0:
        return None
    return [min(step, size - start) for start in range(0, size, step)] or [0]


def split_calls_as_slices(program):
    """Rewrites, in place, the split/chunk calls of ``program`` (an ExportedProgram)
    along a static dim whose pieces are read by index only; returns the program."""
    graph = program.graph_module.graph
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _SPLITS:
            continue
        sizes = _piece_sizes(node)
        if sizes is None or not all(user.target is operator.getitem for user in node.users):
            continue
        args = bind(node)
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        for user in list(node.users):
            piece = user.args[1]
            with graph.inserting_before(user):
                sliced = graph.call_function(
                    aten.slice.Tensor, (args.self, args.dim, starts[piece], starts[piece] + sizes[piece])
                )
            sliced.meta = dict(user.meta)
            user.replace_all_uses_with(sliced)
            graph.erase_node(user)
        graph.erase_node(node)
        changed = True
    if changed:
        program.graph_module.recompile()
    return program
