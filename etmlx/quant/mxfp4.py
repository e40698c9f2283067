"""``quantize="mxfp4"``: MLX's mxfp4 weights (FP4 E2M1 values, an E8M0 power of two per
32), in the form ExecuTorch's exportable quantized tensors take: a torchao tensor
subclass whose linear and embedding layers dequantize through a custom op
(``etmlx::dequantize_mxfp4``), which etmlx lowers to MLX's kernels
(``lowering/rules/exportables.py``). ExecuTorch's own ``ExportableMXConfig`` takes FP8
elements only.

Values are torchao's ``to_mx`` (two FP4 codes a byte, the even element in the low
nibble: MLX's packing), so the eager kernels here compute what MLX's do.
"""

import torch
from torch import Tensor
from torchao.utils import TorchAOBaseTensor

aten = torch.ops.aten
GROUP = 32


@torch.library.custom_op("etmlx::dequantize_mxfp4", mutates_args=())
def dequantize_mxfp4(qdata: Tensor, scale: Tensor, output_dtype: torch.dtype) -> Tensor:
    """``(N, K)`` values of ``qdata`` (``(N, K/2)`` uint8, two FP4 E2M1 codes a byte)
    times ``scale`` (``(N, K/32)`` float8_e8m0fnu), in ``output_dtype``."""
    from torchao.prototype.mx_formats.kernels import f4_unpacked_to_f32, unpack_uint4

    values = f4_unpacked_to_f32(unpack_uint4(qdata.contiguous()))
    rows, columns = values.shape
    scaled = values.view(rows, columns // GROUP, GROUP) * scale.to(torch.float32).view(rows, -1, 1)
    return scaled.view(rows, columns).to(output_dtype)


@dequantize_mxfp4.register_fake
def _(qdata, scale, output_dtype):
    return qdata.new_empty((qdata.shape[0], 2 * qdata.shape[1]), dtype=output_dtype)


class Mxfp4Tensor(TorchAOBaseTensor):
    """A weight in mxfp4; ``orig_dtype`` is what it dequantizes to."""

    tensor_data_names = ["qdata", "scale"]
    tensor_attribute_names = ["orig_dtype"]

    def __new__(cls, qdata, scale, orig_dtype):
        shape = (qdata.shape[0], 2 * qdata.shape[1])
        self = torch.Tensor._make_wrapper_subclass(cls, shape, dtype=orig_dtype, device=qdata.device,
                                                   requires_grad=False)
        self.qdata, self.scale, self.orig_dtype = qdata, scale, orig_dtype
        return self

    @classmethod
    def from_float(cls, weight: Tensor) -> "Mxfp4Tensor":
        from torchao.prototype.mx_formats.mx_tensor import to_mx

        scale, qdata = to_mx(weight.detach().float().contiguous(), torch.float4_e2m1fn_x2, GROUP)
        return cls(qdata.view(torch.uint8).contiguous(), scale.contiguous(), weight.dtype)

    def dequantize(self, output_dtype=None) -> Tensor:
        return torch.ops.etmlx.dequantize_mxfp4(self.qdata, self.scale, output_dtype or self.orig_dtype)

    __torch_function__ = torch._C._disabled_torch_function_impl


implements = Mxfp4Tensor.implements


@implements([aten.linear.default])
def _(func, types, args, kwargs):
    x, weight = args[0], args[1]
    return torch.nn.functional.linear(x, weight.dequantize(x.dtype), args[2] if len(args) > 2 else None)


@implements([aten.embedding.default])
def _(func, types, args, kwargs):
    return torch.nn.functional.embedding(args[1], args[0].dequantize())


@implements([aten.t.default])
def _(func, types, args, kwargs):
    return args[0].dequantize().t()


@implements([aten.detach.default, aten.alias.default])
def _(func, types, args, kwargs):
    return args[0]


@implements([aten._to_copy.default])
def _(func, types, args, kwargs):
    return args[0].dequantize(kwargs.get("dtype", args[0].orig_dtype))
