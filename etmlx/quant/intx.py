"""torchao's integer weights (``IntxWeightOnlyConfig``'s) of one matrix, computed block by
block of rows: what ``weights.quantize`` makes of a weight, in this process or in its
packing worker (``pack_worker``)."""

SCHEMES = ("int2", "int3", "int4", "int5", "int6", "int8")  # the widths MLX's kernels take

ROWS_AT_ONCE_VALUES = 2**22  # a weight is quantized in blocks of rows of about this many values


def row_blocks(rows: int, columns: int) -> list:
    """Slices of about ``ROWS_AT_ONCE_VALUES`` values of a ``(rows, columns)`` weight, whole rows each."""
    step = max(1, ROWS_AT_ONCE_VALUES // columns)
    return [slice(start, min(start + step, rows)) for start in range(0, rows, step)]


def bits(scheme: str) -> int:
    """The width of a scheme ("int4": 4)."""
    return int(scheme.removeprefix("int"))


def quantized(weight, scheme: str, group_size, deferred: bool):
    """What torchao's ``IntxWeightOnlyConfig`` makes of a 2-d ``weight`` (its default
    symmetric mapping, int8 storage, a scale and zero point per group; ``from_hp``'s own
    calls of ``choose_qparams_affine`` and ``quantize_affine``: ``_integers``), its integer
    values computed now or, ``deferred``, when read. The weight is read in blocks of rows
    (each row's groups are its own), so only a block is widened at a time: once when
    computed now, deferred twice (its scales now, its integers when read); the pages of a
    mapped checkpoint's weight are given back after each read (``deferred.rows``, which
    also reads a weight loaded in another dtype from its source)."""
    import torch
    from torchao.quantization import IntxUnpackedToInt8Tensor
    from torchao.quantization.quant_primitives import _DTYPE_TO_QVALUE_BOUNDS, MappingType, choose_qparams_affine

    from etmlx.lowering import deferred as deferred_constants

    target = getattr(torch, scheme)
    rows, columns = weight.shape
    block_size = (1, columns if group_size is None else group_size)
    qmin, qmax = _DTYPE_TO_QVALUE_BOUNDS[target]
    blocks = row_blocks(rows, columns)

    def scales(values):
        return choose_qparams_affine(values, MappingType.SYMMETRIC, block_size, torch.int8, qmin, qmax,
                                     zero_point_dtype=torch.int8, keepdim=True)

    if not deferred:  # each block read once
        qdata, parts = torch.empty(weight.shape, dtype=torch.int8), []
        for rows_ in blocks:
            with deferred_constants.rows(weight, rows_) as values:
                parts.append(scales(values))
                qdata[rows_] = _integers(values, *parts[-1], qmin, qmax)
        return IntxUnpackedToInt8Tensor(qdata, *(torch.cat(part) for part in zip(*parts)), target, block_size,
                                        weight.dtype, None)
    parts = []
    for rows_ in blocks:
        with deferred_constants.rows(weight, rows_) as values:
            parts.append(scales(values))
    scale, zero_point = (torch.cat(part) for part in zip(*parts))

    def integers():
        qdata = torch.empty(weight.shape, dtype=torch.int8)
        with torch.no_grad():
            for rows_ in blocks:
                with deferred_constants.rows(weight, rows_) as values:
                    qdata[rows_] = _integers(values, scale[rows_], zero_point[rows_], qmin, qmax)
        return qdata

    qdata = deferred_constants.placeholder(weight.shape, torch.int8, integers)
    return IntxUnpackedToInt8Tensor(qdata, scale, zero_point, target, block_size, weight.dtype, None)


def _integers(values, scale, zero_point, qmin: int, qmax: int):
    """torchao's ``quantize_affine`` of the rows ``values`` (groups along each row, a
    ``scale`` and ``zero_point`` per group, kept dims), its arithmetic in ``values``' dtype
    op for op: ``clamp(round(values * (1 / scale)) + zero_point, qmin, qmax)`` as int8; in
    place on one temporary (adding zero points of zero, which change no value, skipped)."""
    import torch

    rows, columns = values.shape
    groups = scale.shape[-1]
    quantized = values.view(rows, groups, columns // groups) * (1.0 / scale).view(rows, groups, 1)
    quantized.round_()
    if zero_point.any():
        quantized += zero_point.view(rows, groups, 1)
    return quantized.clamp_(qmin, qmax).view(rows, columns).to(torch.int8)
