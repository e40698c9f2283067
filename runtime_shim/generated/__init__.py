"""Generated code for the Python runtime: the flatc reader of ExecuTorch's program.fbs
(``regenerate.py`` here), and the op enums' MLX functions (``mlx_functions.py``, from
``serializer/regenerate.py``)."""
