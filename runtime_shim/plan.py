"""The execution-plan interpreter: runs one method's instructions over its values."""

from . import pte_types as t
from .backends import DelegateHandle
from .errors import ExecutionError, IndexRangeError, OperatorError
from .prim_ops import KERNELS, int_list
from .pte_file import PteFile
from .tensor_value import TensorValue
from .values import build_values


def _delegate_arg(values: list, value):
    if isinstance(value, t.IntList):
        return int_list(values, value)
    if isinstance(value, (t.DoubleList, t.BoolList)):
        return list(value.items)
    if isinstance(value, t.TensorList):
        return [values[i] for i in value.items]
    if isinstance(value, t.OptionalTensorList):
        return [None if i == -1 else values[i] for i in value.items]
    return value


class MethodRunner:
    """One method of a loaded program: its values (arenas included) and its steps.

    Each instruction is compiled once into a step ``step() -> next pc or None``.
    The value table persists across calls, as in ExecuTorch: mutable buffers keep
    their state, dynamic tensors keep their last shape until a kernel resizes them.
    """

    def __init__(self, plan: t.ExecutionPlan, pte: PteFile, delegates: list[DelegateHandle]):
        self.plan = plan
        self.values = build_values(plan, pte)
        self._delegates = delegates
        self._steps = [self._compile(ins) for ins in plan.instructions]

    def _describe(self, pc: int) -> str:
        ins = self.plan.instructions[pc]
        if isinstance(ins, t.KernelCall):
            return self.plan.operators[ins.op_index].qualified
        if isinstance(ins, t.DelegateCall):
            return f"delegate {self.plan.delegates[ins.delegate_index].id}"
        return type(ins).__name__

    def _compile(self, ins):
        values = self.values
        if isinstance(ins, t.KernelCall):
            return self._kernel(ins)
        if isinstance(ins, t.DelegateCall):
            handle = self._delegates[ins.delegate_index]
            args = ins.args

            def delegate_call():
                sizes = handle.execute([_delegate_arg(values, values[i]) for i in args]) or {}
                for position, size in sizes.items():
                    values[args[position]] = size

            return delegate_call
        if isinstance(ins, t.MoveCall):

            def move():
                values[ins.move_to] = values[ins.move_from]

            return move
        if isinstance(ins, t.JumpFalseCall):

            def jump_false():
                cond = values[ins.cond_value_index]
                cond = bool(cond.array.all()) if isinstance(cond, TensorValue) else bool(cond)
                return None if cond else ins.destination_instruction

            return jump_false
        # FreeCall: planned memory is never freed, and an unbound tensor keeps its
        # buffer to reuse on the next call, so there is nothing to release.
        return lambda: None

    def _kernel(self, ins: t.KernelCall):
        op = self.plan.operators[ins.op_index]
        values, args = self.values, ins.args
        hand = KERNELS.get(op.qualified)
        if hand is not None:
            fn, nargs = hand
            if len(args) != nargs:
                raise OperatorError(f"{op.qualified} takes {nargs} arguments, the plan passes {len(args)}")
            return lambda: fn(values, args)
        from .torch_kernels import make_kernel  # imports torch: only plans that need it

        kernel = make_kernel(op, args)
        return lambda: kernel(values)

    def execute(self) -> None:
        """Run the instructions once; inputs must already be in place."""
        steps = self._steps
        pc, end = 0, len(steps)
        while pc < end:
            try:
                jump = steps[pc]()
            except IndexRangeError:
                raise  # the method's caller names the method; this is PyTorch's IndexError
            except Exception as e:
                raise ExecutionError(f"method {self.plan.name!r}, instruction {pc} ({self._describe(pc)}): {e}") from e
            pc = pc + 1 if jump is None else jump
