"""The etmlx backend at run time: an interpreter of the IR that builds one lazy MLX
graph per call and evaluates it once, at the delegate's boundary.

The interpreter is a pure function of (inputs, buffer values), so it runs under
``mx.compile`` from a call signature's second call: traced once, then replayed without
Python work per node (tiny Llama decode, hidden 512: 174 -> 213 tokens/s).
``ETMLX_COMPILE=0`` turns it off."""

import collections
import contextlib
import math
import os

import mlx.core as mx
import numpy as np

from etmlx.serializer import BACKEND_ID, PayloadError, deserialize
from etmlx.serializer.generated.etmlx_ir.Transpose import TransposeT
from etmlx.serializer.generated.etmlx_ir.ValueKind import ValueKind
from etmlx.serializer.ir import NUMPY_STORAGE, OP_NAMES, TidT, read_operands

from .backends import register_backend
from .errors import ExecutionError
from .limits import max_array_bytes
from .mlx_ops import HANDLERS
from .mlx_ops.indexing import first_out_of_range, index_error
from .mlx_ops.env import MX_DTYPES, Env
from .state import ProgramState

# What MLX's Python API raises for bad shapes, axes and arguments.
MLX_ERRORS = (ValueError, RuntimeError, TypeError, OverflowError, IndexError)
_CHECK_INDEX = HANDLERS["CheckIndex"]
# Compiled graphs a delegate keeps, one per call signature, the least recently used
# dropped past this many (native: kMaxCompiledGraphs); signatures called once remembered.
MAX_COMPILED_GRAPHS = 16
MAX_SIGNATURES_SEEN = 1024


class MlxDelegate:
    """One loaded delegate. Constants are turned into mx arrays once, at load; mutable
    buffers live in the program's ``ProgramState``, shared with its other delegates."""

    def __init__(self, processed: bytes, named_data, state: ProgramState):
        graph = deserialize(processed)
        self._graph = graph
        # Keys hash the bytes only (all-zero tensors of different dtypes share one), so
        # an array is identified by key, dtype and shape; delegates share them.
        constants = {
            c.slot: state.constant((c.key, c.dtype, tuple(c.shape or [])), lambda c=c: _named_array(c, named_data))
            for c in graph.constants or []
        }
        try:
            self._steps, self._transposed_matrices = _hoist_constant_nodes(
                [_step(i, node) for i, node in enumerate(graph.nodes or [])], constants)
        except MLX_ERRORS as error:  # the payload's constant part does not compute: malformed
            raise PayloadError(f"a node over constants fails: {error}") from error
        # Size-1 constants reach the compiled graph as arguments, not captured: mx.compile
        # writes a captured one into the code it generates as a literal and drops the sign
        # of -0.0 (mlx 0.32), which 1 / x and atan2(y, x) tell apart.
        self._constants = [(slot, array) for slot, array in constants.items() if array.size != 1]
        self._literal_slots = [slot for slot, array in constants.items() if array.size == 1]
        self._literals = [constants[slot] for slot in self._literal_slots]
        self._check_ops = [op for handler, op, _, _ in self._steps if handler is _CHECK_INDEX]  # in run order
        for op in self._check_ops:
            if not op.size.isSlot and op.size.value < 0:
                raise PayloadError(f"a CheckIndex against a negative size, {op.size.value}")
        self._state = state
        input_of_slot = {v.slot: i for i, v in enumerate(graph.inputs or []) if v.kind == ValueKind.Int}
        self._growing = []  # (buffer name, the input giving its extent)
        for buffer in graph.buffers or []:
            named, grows = buffer.initial, buffer.growAxis >= 0
            state.register(buffer.name, tuple(named.shape or []), MX_DTYPES[named.dtype],
                           lambda named=named: _named_array(named, named_data), buffer.growAxis if grows else None)
            if grows:
                self._growing.append((buffer.name, input_of_slot[buffer.growExtent]))
        self._buffer_slots = [(b.name, b.initial.slot) for b in graph.buffers or []]
        self._buffer_updates = [(b.name, b.update) for b in graph.buffers or [] if b.hasUpdate]
        self._compilable = os.environ.get("ETMLX_COMPILE", "1") != "0" and _compilable(graph)
        self._compiled = collections.OrderedDict()  # call signature -> its compiled graph, least recent first
        self._seen = set()  # signatures called once
        self.num_inputs = len(graph.inputs or [])
        self.num_outputs = len(graph.outputs or [])

    def run(self, inputs: list) -> list:
        """Runs the graph on mx arrays (and ints for size inputs); returns evaluated outputs.
        Raises IndexRangeError, changing no buffer, when a bounds check fails.

        The checked indices are evaluated first and the buffer updates committed before
        the rest is: the program state then no longer holds a buffer's old value when
        its update is computed, so MLX writes the update into the old value's memory (a
        KV-cache write touches its slots instead of copying the whole cache). A growing
        buffer is first extended to the extent its integer input asks for."""
        for name, position in self._growing:
            self._state.reserve(name, int(inputs[position]))
        buffers = [self._state[name] for name, _ in self._buffer_slots]
        with _mlx_failures_as_execution_errors():
            outputs, updates, checks = self._compute(inputs, buffers)(list(inputs), buffers, self._literals)
            del buffers  # from here the state holds the only references to the old values
            mx.eval(checks)
        self._raise_failed_index_check(checks)
        for (name, _), value in zip(self._buffer_updates, updates):
            self._state[name] = value
        with _mlx_failures_as_execution_errors():
            mx.eval([o for o in outputs if isinstance(o, mx.array)] + updates)
        return outputs

    def _compute(self, inputs: list, buffers: list):
        """The graph's function for this call: interpreted the first time a signature
        (the integer inputs' values, the arrays' shapes and dtypes) is called, compiled
        from the second. A prompt's length is one call's shape: compiling it would only
        cost its trace (a 1B model's 37-token prefill took 4.1 s compiled, 3.4 s
        interpreted, and held 20 MiB for the program's life); a decode step's is every
        step's. A size read on the host (an attention window's) is invisible to a trace,
        so it is a constant of the graph compiled for it."""
        if not self._compilable:
            return self._interpret
        signature = tuple(
            (tuple(value.shape), value.dtype) if isinstance(value, mx.array) else int(value)
            for value in [*inputs, *buffers]
        )
        compiled = self._compiled.get(signature)
        if compiled is not None:
            self._compiled.move_to_end(signature)
            return compiled
        if signature not in self._seen:
            if len(self._seen) >= MAX_SIGNATURES_SEEN:
                self._seen.clear()
            self._seen.add(signature)
            return self._interpret
        self._seen.discard(signature)
        if len(self._compiled) >= MAX_COMPILED_GRAPHS:
            self._compiled.popitem(last=False)  # MLX drops its trace with the function
        compiled = self._compiled[signature] = mx.compile(self._interpret)
        return compiled

    def _raise_failed_index_check(self, checks: list) -> None:
        """The first CheckIndex whose evaluated indices leave their range, as an
        IndexRangeError. Checked here, on the host, rather than in the graph: reading
        a few indices costs less than the reductions a verdict in the graph needs."""
        sizes = iter(checks[len(self._check_ops) :])  # those not stated by the payload
        for op, indices in zip(self._check_ops, checks):
            size = next(sizes).item() if op.size.isSlot else op.size.value
            first = first_out_of_range(indices, size, op.wraps)
            if first is not None:
                raise index_error(op, first, size)

    def _interpret(self, inputs: list, buffers: list, literals: list):
        """The graph as a pure function: (inputs, buffer values, literals) -> (outputs,
        buffer updates, the checked indices then the sizes of their axes the payload does
        not state)."""
        graph = self._graph
        env = Env(graph.numTensorSlots, graph.numIntSlots, self._transposed_matrices)
        for value, arg in zip(graph.inputs, inputs):
            if value.kind == ValueKind.Int:
                env.ints[value.slot] = int(arg)
            else:
                env.tensors[value.slot] = arg
        for slot, array in self._constants:
            env.tensors[slot] = array
        for slot, array in zip(self._literal_slots, literals):
            env.tensors[slot] = array
        for (_, slot), array in zip(self._buffer_slots, buffers):
            env.tensors[slot] = array
        for handler, op, out, is_int in self._steps:
            if is_int:
                env.ints[out] = handler(op, env)
            else:
                env.tensors[out] = _within_limit(handler(op, env), op)
        outputs = [env.ints[v.slot] if v.kind == ValueKind.Int else env.tensors[v.slot] for v in graph.outputs]
        checks = [indices for indices, _ in env.checks]
        checks += [mx.array(size, dtype=mx.int64) for op, (_, size) in zip(self._check_ops, env.checks) if op.size.isSlot]
        return outputs, [env.tensors[slot] for _, slot in self._buffer_updates], checks

    def execute(self, args: list) -> dict:
        """ExecuTorch's calling convention: inputs, then outputs to write in place.
        Returns the integer outputs (a size passed on to another delegate), by argument
        position: the plan stores those, ints have no place to write to."""
        inputs = [arg.to_mx() if hasattr(arg, "to_mx") else arg for arg in args[: self.num_inputs]]
        outputs = self.run(inputs)
        sizes = {}
        for position, (target, value) in enumerate(zip(args[self.num_inputs :], outputs), self.num_inputs):
            if isinstance(value, int):
                sizes[position] = value
            else:
                target.set_mx(value)
        return sizes


@contextlib.contextmanager
def _mlx_failures_as_execution_errors():
    try:
        yield
    except MLX_ERRORS as error:
        raise ExecutionError(f"MLX delegate failed: {error}") from error


def _within_limit(array: mx.array, op) -> mx.array:
    """``array``, unless it is larger than ``limits.max_array_bytes()`` (checked on its
    shape, before MLX allocates it)."""
    nbytes, limit = math.prod(array.shape) * array.itemsize, max_array_bytes()
    if nbytes > limit:
        raise ExecutionError(
            f"a {type(op).__name__[:-1]} node makes an array of shape {tuple(array.shape)} ({nbytes} bytes), past "
            f"the limit of {limit} (ETMLX_MAX_ARRAY_BYTES)"
        )
    return array


def _compilable(graph) -> bool:
    """mx.compile traces once per input shapes and replays; int outputs are no arrays, so
    such graphs are interpreted."""
    return all(v.kind != ValueKind.Int for v in graph.outputs or [])


def _hoist_constant_nodes(steps: list, constants: dict) -> tuple:
    """Evaluates, once at load, every node that reads only constants (scalars, fills,
    ops on weights), adding its result to ``constants``; returns the steps left to run
    per call, and the slots of those results that are a 2-D matrix's transposed view."""
    env = Env(0, 0)
    env.tensors = constants  # a dict works: Env reads tensors[slot]
    remaining, transposed = [], set()
    for step in steps:
        handler, op, out, is_int = step
        reads = list(read_operands(op))
        checks = handler is _CHECK_INDEX  # its indices are checked on every call
        if is_int or checks or not all(isinstance(ref, TidT) and ref.idx in constants for _, ref in reads):
            remaining.append(step)
            continue
        constants[out] = handler(op, env)
        mx.eval(constants[out])
        if isinstance(op, TransposeT) and constants[out].ndim == 2 and list(op.perm) == [1, 0]:
            transposed.add(out)
    return remaining, frozenset(transposed)


def _step(index: int, node):
    """(handler, op, slot written, whether it is an int slot) of node ``index``."""
    name = OP_NAMES[node.opType]  # known: the validator rejects other types
    handler = HANDLERS.get(name)
    if handler is None:  # a payload newer than this runtime's handlers
        raise PayloadError(f"node {index} ({name}): no handler in this runtime")
    op = node.op
    if hasattr(op, "outInt") and op.outInt is not None:
        return handler, op, op.outInt.value, True
    return handler, op, op.out.idx, False


def _named_array(named, named_data) -> mx.array:
    """An mx array of a NamedTensor's bytes (bfloat16 through their 16-bit pattern).

    MLX's Python API takes no memory it does not own, so the bytes are copied, and the
    file's pages of them dropped: a mapped file's weights are then held once, and at
    most one tensor's twice while loading."""
    data = np.frombuffer(named_data.get(named.key), dtype=NUMPY_STORAGE[named.dtype])
    array = mx.array(data.reshape(list(named.shape or [])))
    del data
    named_data.evict(named.key)
    dtype = MX_DTYPES[named.dtype]
    return array.view(dtype) if array.dtype != dtype else array


def _factory(processed: bytes, compile_specs, named_data, state: ProgramState) -> MlxDelegate:
    return MlxDelegate(processed, named_data, state)


register_backend(BACKEND_ID, _factory)
