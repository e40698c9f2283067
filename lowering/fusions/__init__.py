"""Every graph rewrite etmlx performs that replaces several operator calls with one MLX
kernel, in one place (the README lists them).

Two kinds, by when they must run:

- before decomposition (``fused_calls``): calls ExecuTorch would decompose, kept whole
  per call when the lowering rule accepts them — ``scaled_dot_product_attention`` ->
  ``etmlx::sdpa`` (``mx.fast.scaled_dot_product_attention``) and ``roll`` ->
  ``etmlx::roll``. Run by the partitioner's ``transform_for_pre_decomposition``.
- at lowering (``LOWERING_FUSIONS``): patterns in the edge graph, each a module with
  ``NAME``, ``match(ctx, node)`` (the parts, or None) and ``emit(ctx, node, parts)``,
  tried on every node before its own rule (``fuse``). Look-alikes must not match:
  each module's tests show one that does not.

Not fusions, and elsewhere: constant folding (``lowering/folding.py``), dead-node
removal (``lowering/passes.py``), and the runtimes' evaluation of constant-only nodes
at load.
"""

from . import exportable_tensors, gather_mm, rms_norm, rope

LOWERING_FUSIONS = (rms_norm, rope, gather_mm, exportable_tensors)


def fuse(ctx, node) -> bool:
    """Lowers ``node`` through the first fusion that matches it; False if none does."""
    for fusion in LOWERING_FUSIONS:
        parts = fusion.match(ctx, node)
        if parts is not None:
            fusion.emit(ctx, node, parts)
            return True
    return False
