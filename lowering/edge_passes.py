"""Passes and checks over ExecuTorch's programs around etmlx's delegates, each working
around a behaviour of ExecuTorch 1.5.1 that its docstring names: run by
``etmlx.pipeline.lower_methods`` between ``to_edge``, ``to_backend`` and ``to_executorch``."""

import contextlib
import functools

from etmlx.errors import ExportError


def verify_outside_mlx(program) -> None:
    """ExecuTorch's checks of an edge program (core ATen operators, the dtypes their
    kernels take) on what is left once MLX took its part, instead of on the whole graph
    before partitioning, which ``to_edge`` did twice (a fifth of an LLM's export time):
    the calls MLX took are checked by its own rules."""
    from executorch.exir import EdgeCompileConfig
    from executorch.exir.verification.verifier import EXIREdgeDialectVerifier
    from torch._dispatch.python import enable_python_dispatcher
    from torch._export.utils import _detect_fake_mode_from_gm
    from torch._export.verifier import SpecViolationError

    EXIREdgeDialectVerifier(edge_compile_config=EdgeCompileConfig())(program.graph_module)
    gm = program.graph_module
    validator = kernel_dtype_validator()(gm)
    with enable_python_dispatcher(), _detect_fake_mode_from_gm(gm) or contextlib.nullcontext():
        validator.run(*(node.meta.get("val") for node in gm.graph.nodes if node.op == "placeholder"))
    if validator.violating_ops:
        calls = "; ".join(f"{op} with {dtypes}" for op, (dtypes, _) in validator.violating_ops.items())
        raise SpecViolationError(f"These operators are taking Tensor inputs with mismatched dtypes: {calls}")


def kernel_dtype_validator():
    """ExecuTorch's dtype validator, walking past delegate calls: the verifier's own walk
    stops at the first one, leaving the kernels after it unchecked."""
    from executorch.exir.verification.arg_validator import EdgeOpArgValidator
    from torch._ops import HigherOrderOperator

    class Validator(EdgeOpArgValidator):
        def call_function(self, target, args, kwargs):
            if isinstance(target, HigherOrderOperator):
                return self.node.meta["val"]  # the delegate's outputs, as traced
            return super().call_function(target, args, kwargs)

    return Validator


def not_in_edge_dialect(error, report) -> str:
    """ExecuTorch's refusal of an operator outside the core ATen opset (a stable sort
    MLX declined, say), in one line, with MLX's reason where it declined the call."""
    first = next((line for line in str(error).splitlines() if line.strip()), "").strip().rstrip('".')
    reasons = [
        f"{operator}: {reason}" for operator, entry in report.operators.items()
        for _, reason in (*entry.decomposed, *entry.declined) if operator.replace("::", ".") in first
    ]
    because = f"; MLX declined it ({'; '.join(sorted(set(reasons)))})" if reasons else ""
    return f"ExecuTorch cannot take this program: {first}{because}"


def refuse_declined_custom_ops(report) -> None:
    """etmlx's own ops have no ExecuTorch kernel: one MLX declined (a sum across ranks in
    float64, say) would fail in ``to_executorch`` as "Missing out variants"."""
    declined = sorted({f"{operator}: {reason}" for operator, entry in report.operators.items()
                       if operator.startswith("etmlx::") for _, reason in entry.declined})
    if declined:
        raise ExportError(f"ExecuTorch has no kernel for etmlx's own ops that MLX declined ({'; '.join(declined)})")


def share_weights_when_copied(program) -> None:
    """ExecuTorch's ``to_backend`` hands each backend's ``preprocess`` a deep copy of the
    claimed part of the program, weights included: a second copy of the whole model in
    memory (of a memory-mapped checkpoint's too, so far only read in place). The
    program's parameters become ``_SharedWhenCopied`` parameters over the same storage,
    which such a copy shares: preprocess only reads them."""
    import torch

    for name, value in program.state_dict.items():
        if isinstance(value, torch.nn.Parameter) and type(value) is torch.nn.Parameter:
            program.state_dict[name] = _shared_when_copied()(value, requires_grad=False)


@functools.cache
def _shared_when_copied():
    import torch

    class _SharedWhenCopied(torch.nn.Parameter):
        def __deepcopy__(self, memo):
            memo[id(self)] = self
            return self

    return _SharedWhenCopied


def keep_initial_values(program) -> None:
    """Mutable buffers MLX declined stay with ExecuTorch, which drops their initial
    values unless their placeholders carry ``et_init_buffer`` (delegated buffers carry
    their own in the payload). Set here on exactly those placeholders: ExecuTorch's
    ``InitializedMutableBufferPass`` matches names by substring, and so also marked a
    user input named like a buffer (``scale`` for buffer ``scale``, placeholder
    ``b_scale``), whose program then lost the buffer's updates without an error."""
    signature = program.graph_signature
    mutated = set(signature.buffers_to_mutate.values())
    names = {name for name, target in signature.inputs_to_buffers.items() if target in mutated}
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in names:
            node.meta["et_init_buffer"] = True


def rename_inputs_named_like_state(program) -> None:
    """Renames method inputs that share a name with a buffer or weight (``forward(self,
    x, scale)`` next to buffer ``scale``). ExecuTorch's write-back of mutated buffers
    looks placeholders up by buffer name and by input name in one table, so such an
    input took the buffer's place: the update was written into the input and the buffer
    kept its old value, with no error. A method's input names are not in the .pte."""
    from torch.export.graph_signature import InputKind, TensorArgument

    signature = program.graph_signature
    state = {spec.target for spec in signature.input_specs if spec.kind is not InputKind.USER_INPUT}
    taken = {node.name for node in program.graph.nodes} | state
    placeholders = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    for spec in signature.input_specs:
        if spec.kind is not InputKind.USER_INPUT or not isinstance(spec.arg, TensorArgument):
            continue
        if spec.arg.name not in state:
            continue
        new = f"{spec.arg.name}_input"
        while new in taken:
            new += "_"
        taken.add(new)
        placeholders[spec.arg.name].name = new
        spec.arg = TensorArgument(name=new)
    program.graph_module.recompile()


@contextlib.contextmanager
def passes_skipped_where_nothing_to_rewrite():
    """While in the block, three of ExecuTorch's passes that rewrite only some calls return
    the graph as it is when it holds none of them. Each is an ``ExportPass``, which retraces
    every node on fake tensors to rewrite any (about 1 s apiece for a 3-layer hybrid LM, a
    tenth of its export); unchanged, the retrace gives the graph back as it was.
    ``NormalizeTransposePass`` rewrites ``aten.t`` (which the traced graphs here do not
    hold), ``ReplaceBrokenOpsWithFunctionalOpsPass`` the view operators that the pass
    before it left, ``LegalizePortableDimOrderPass`` five portable kernels' inputs (only
    where such a kernel is left outside MLX). Each test below is the one the pass's
    ``call_operator`` makes."""
    import torch
    from executorch.exir.passes.legalize_portable_dim_order_pass import LegalizePortableDimOrderPass
    from executorch.exir.passes.normalize_transpose_pass import NormalizeTransposePass
    from executorch.exir.passes.replace_broken_ops_with_function_ops_pass import (
        ReplaceBrokenOpsWithFunctionalOpsPass,
    )
    from torch.fx.passes.infra.pass_base import PassResult

    rewrites = {
        NormalizeTransposePass: lambda target: target == torch.ops.aten.t.default,
        ReplaceBrokenOpsWithFunctionalOpsPass: lambda target: isinstance(target, torch._ops.OpOverload)
        and target.is_view,
        LegalizePortableDimOrderPass: lambda target: target in LegalizePortableDimOrderPass._target_ops,
    }
    originals = {cls: cls.call for cls in rewrites}

    def skipping(cls):
        def call(self, graph_module):
            graphs = (m.graph for m in graph_module.modules() if isinstance(m, torch.fx.GraphModule))
            if not any(node.op == "call_function" and rewrites[cls](node.target) for graph in graphs
                       for node in graph.nodes):
                return PassResult(graph_module, False)
            return originals[cls](self, graph_module)
        return call

    for cls in rewrites:
        cls.call = skipping(cls)
    try:
        yield
    finally:
        for cls, call in originals.items():
            cls.call = call


@contextlib.contextmanager
def rewrites_in_one_retrace():
    """While in the block, ``to_edge``'s five passes that rewrite one call at a time from
    its operator and arguments -- scalars and SymInts to tensors, mixed dtypes cast, ATen
    to Edge operators, memory formats to dim orders -- run as one ``ExportPass``: each
    retraces every node on fake tensors (a sixth of an LLM's export for the five). Their
    ``call_operator``s hand on to ``super()``, so one class that inherits all five, in
    ``to_edge``'s order, rewrites each call as the five retraces would. Four passes that
    edit the graph in place (no-op casts and slices, empty concatenations, redundant
    quantize pairs) ran between the second and the third; they run before the first
    instead: they match calls the first two do not touch or make."""
    from executorch.exir.pass_base import ExportPass
    from executorch.exir.passes.memory_format_ops_pass import MemoryFormatOpsPass
    from executorch.exir.passes.remove_mixed_type_operators import RemoveMixedTypeOperators
    from executorch.exir.passes.replace_aten_with_edge_pass import OpReplacePass
    from executorch.exir.passes.scalar_to_tensor_pass import ScalarToTensorPass
    from executorch.exir.passes.sym_to_tensor_pass import SymToTensorPass
    from executorch.exir.program import _program
    from torch.fx.passes.infra.pass_base import PassResult

    class OneRetrace(ScalarToTensorPass, SymToTensorPass, RemoveMixedTypeOperators, OpReplacePass,
                     MemoryFormatOpsPass):
        pass

    class Done(ExportPass):
        """Where ``_generate_edge_program`` runs the last two, which ``OneRetrace`` ran."""

        def call(self, graph_module):
            return PassResult(graph_module, False)

    merged = (ScalarToTensorPass, SymToTensorPass, RemoveMixedTypeOperators)
    passes_of = _program._get_aten_to_edge_passes

    def passes(config):
        before, after = passes_of(config)
        if config._skip_dim_order:
            raise ExportError("etmlx lowers programs with dim orders (EdgeCompileConfig's default)")
        kept = [p for p in before if not isinstance(getattr(p, "__wrapped__", p), merged)]  # some come wrapped
        return kept + [OneRetrace()], after

    replaced = {"_get_aten_to_edge_passes": passes, "OpReplacePass": Done, "MemoryFormatOpsPass": Done}
    originals = {name: getattr(_program, name) for name in replaced}
    for name, value in replaced.items():
        setattr(_program, name, value)
    try:
        yield
    finally:
        for name, value in originals.items():
            setattr(_program, name, value)


@contextlib.contextmanager
def delegate_outputs_from_their_trace():
    """While in the block, a pass that retraces a program on fake tensors (ExecuTorch's
    ``SpecPropPass``, as the program is written) takes the outputs of an etmlx delegate of
    static output shapes from the delegated graph's own trace, instead of running that
    whole graph again on fake tensors, as ExecuTorch's fake kernel of
    ``executorch_call_delegate`` does (half a second of a 4-layer tiny Llama's 4 s
    export, two at the Llama-3.2-1B shape). Outputs of dynamic shape, and other backends'
    delegates, run as before."""
    import torch
    from executorch.exir.delegate import executorch_call_delegate
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.export.graph_signature import OutputKind
    from torch.utils import _pytree as pytree

    from etmlx.serializer.constants import BACKEND_ID

    table = executorch_call_delegate.python_key_table
    run_again = table[FakeTensorMode]

    def outputs(mode, lowered_module, *args):
        program = lowered_module.original_module
        if lowered_module.backend_id != BACKEND_ID:
            return run_again(mode, lowered_module, *args)
        (returned,) = [node.args[0] for node in program.graph.nodes if node.op == "output"]
        traced = [node.meta.get("val") for node, spec in zip(returned, program.graph_signature.output_specs)
                  if spec.kind is OutputKind.USER_OUTPUT]
        if not all(isinstance(v, torch.Tensor) and all(isinstance(n, int) for n in (*v.shape, *v.stride()))
                   for v in traced):
            return run_again(mode, lowered_module, *args)
        with mode:
            made = [torch.empty_strided(v.shape, v.stride(), dtype=v.dtype) for v in traced]
        return pytree.tree_unflatten(made, program.call_spec.out_spec)

    table[FakeTensorMode] = outputs
    try:
        yield
    finally:
        table[FakeTensorMode] = run_again
