"""Weight-only quantization at export: torchao's integer configs, ExecuTorch's exportable
float modes and etmlx's MXFP4 (``weights``, ``mxfp4``)."""
