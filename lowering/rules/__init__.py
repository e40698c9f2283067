"""Lowering rules, one module per op family. Importing this package registers them."""

from . import (  # noqa: F401
    attention,
    collectives,
    convolution,
    creation,
    delegate_quantized,
    distance,
    elementwise,
    exportables,
    indexing,
    linear_attention,
    matmul,
    normalization,
    quantized,
    quantized_cache,
    reduction,
    sampling,
    scan,
    search,
    shape,
    sizes,
)
