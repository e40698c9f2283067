"""flatc-generated reader for ExecuTorch's program.fbs (see regenerate.py)."""
