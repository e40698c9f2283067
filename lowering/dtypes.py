"""The dtypes MLX computes exactly as PyTorch does, and their IR and byte forms."""

import torch

from etmlx.serializer.ir import TORCH_DTYPE_NAMES

TORCH_TO_IR = {getattr(torch, name): dtype for dtype, name in TORCH_DTYPE_NAMES.items()}

FLOATING = (torch.float16, torch.bfloat16, torch.float32)

# Packed quantized weights (lowering/rules/quantized.py): written as constants, never
# an operator's operand in the graph, where PyTorch's uint32 support is partial.
STORAGE_ONLY = (torch.uint32,)


def ir_dtype(dtype: torch.dtype) -> int:
    return TORCH_TO_IR[dtype]


def fill_fields(value, dtype: torch.dtype) -> dict:
    """The IR fields of a fill value (Scalar, Full): integers kept exact as int64."""
    if dtype.is_floating_point:
        return {"value": float(value), "dtype": ir_dtype(dtype)}
    return {"intValue": int(value), "dtype": ir_dtype(dtype)}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def check_dtype(dtype: torch.dtype):
    if dtype in TORCH_TO_IR and dtype not in STORAGE_ONLY:
        return None
    return f"dtype {dtype_name(dtype)} is not computed by MLX here"


def check_floating(dtype: torch.dtype, operands: str):
    """For the MLX kernels that take floating point only (matmul, convolution, pooling
    averages), where PyTorch's CPU kernels also take integers."""
    return None if dtype.is_floating_point else f"{dtype_name(dtype)} {operands}: MLX computes these in floating point only"


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    """Row-major bytes of ``tensor`` (bfloat16 through its 16-bit pattern)."""
    tensor = tensor.detach().contiguous().cpu()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.view(torch.uint16)
    return tensor.numpy().tobytes()
