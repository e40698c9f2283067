"""Values the exporter and both runtimes must agree on, in one place: the Python side
imports them, and ``serializer/regenerate.py`` writes ``native/generated/constants.h``
from them for the native backend (a test fails while it is stale).

Format versions: 1, the first format. 2: CheckIndex (bounds-checked run-time indices).
3: quantized weights (QuantizedMatmul, Dequantize), Unary/Binary ops from IsNan to
Atan2, and Sort. 4: Rope (rotary embeddings fused into mx.fast.rope), IndexPut's
``reduce``. 5: ArgSort (sort and topk indices), GatherMm and GatherQmm
(mixture-of-experts matmuls). 6: AllSum (tensor parallelism across processes).
7: quantized weights of 3, 5 and 6 bits. 8: the float quantization modes (mxfp4, mxfp8,
nvfp4) of QuantizedMatmul and Dequantize, which have no biases. 9: buffers that grow
along an axis (KV caches whose memory follows the tokens held). 10: Quantize and
QuantizedMatmul's ``transpose`` (quantized KV caches). 11: RandomUniform (keyed random
numbers: the noise of ``mlx::sample``). 12: GatedDelta (the gated delta rule of
linear-attention layers). 13: SelectiveScan (Mamba's selective state-space scan).
"""

# The id ExecuTorch files payloads of this format under: the AOT backend's class name
# (lowering/preprocess.py) and what both runtimes register.
BACKEND_ID = "EtMlxBackend"
PAYLOAD_MAGIC = b"EMLX"
# The payload format this etmlx writes; both readers refuse a newer one by name.
FORMAT_VERSION = 13
# Slot counts past this are refused before a runtime allocates per-slot storage.
MAX_SLOTS = 1 << 24
# ETMLX_MAX_ARRAY_BYTES's default: the largest array one MLX node may make.
DEFAULT_MAX_ARRAY_BYTES = 16 << 30
# The widths and group sizes of quantized weights both runtimes take: what mx.quantize packs.
QUANTIZED_BITS = (2, 3, 4, 5, 6, 8)
QUANTIZED_GROUP_SIZES = (32, 64, 128)
# The widths of a quantized KV cache (Quantize): whole values a byte or a word.
QUANTIZED_CACHE_BITS = (4, 8)
# The float modes' (QuantMode 1, 2, 3) one width and group size each: MLX's.
QUANTIZED_FLOAT_BITS = (4, 8, 4)
QUANTIZED_FLOAT_GROUP_SIZES = (32, 32, 16)
# What the native backend's last error was, by value (its C interface; etmlx.native
# raises the matching Python error).
ERROR_KINDS = ("None", "Format", "Version", "Input", "IndexRange", "Memory", "Other")
# erf on MLX's CPU, where mx.erf is slow: x * P(x*x) / Q(x*x) for x clamped to
# [-ERF_CLAMP, ERF_CLAMP], coefficients from the lowest power up (serializer/fit_erf.py
# fits them; float32 error at most 3.5e-7, 6 ulps: mx.erf's own is 5.3e-7).
ERF_CLAMP = 3.92
ERF_NUMERATOR = (1.1283791679566195, 0.1852445021439774, 0.05427724677815554, 0.0038456590528055438,
                 0.0003776770556171965, 4.630621975650062e-06, -1.2917060060457786e-08)
ERF_DENOMINATOR = (1.0, 0.49750205580674356, 0.11393555123000897, 0.015447125406539381, 0.0013042144079156112,
                   6.260447516659353e-05)
# exp on MLX's CPU, as 2^k * e^r: the input range kept (the logs of float32's least
# normal and largest values) and ln 2 in two parts, the first exact times any k.
EXP_LOW, EXP_HIGH = -87.33654475, 88.72283906
LN2_HIGH, LN2_LOW = 0.693145751953125, 1.428606765330187e-06
# e^t for t <= 0 on MLX's CPU (sigmoid from e^-|x|, softmax from e^(x - max)): the least
# t taken (e^-104 rounds to 0 in float32) and the power of two that 2^k * e^r is lifted by
# while k is added to its exponent bits (a normal number for every k from -150 on; one
# multiplication by the inverse then rounds it into the subnormal range once). Adding and
# subtracting ROUND_TO_INTEGER rounds a float32 of magnitude below 2^22 to an integer.
EXP_NONPOSITIVE_LEAST = -104.0
EXP_NONPOSITIVE_LIFT = 25
ROUND_TO_INTEGER = 12582912.0
# The gated delta rule over many tokens on MLX's CPU (GatedDelta): the tokens taken together
# per step (transformers' and FLA's chunk), and the least log-decay taken (exp of it is 0
# in float32, as the decay it stands for; a decay of 0, log -inf, would make NaN).
GATED_DELTA_CHUNK = 64
GATED_DELTA_LEAST_LOG = -200.0
