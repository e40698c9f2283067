"""Silences import-time noise of etmlx's dependencies that says nothing to its users.

Importing executorch (or transformers) imports torchao, which logs that its optional
CUDA kernels failed to load and trips a torch deprecation about Enum constants; torch's
export machinery warns about its own LeafSpec. Only those loggers and that warning are
touched, and only from ``import etmlx``.
"""

import logging
import warnings


def quiet_dependency_noise() -> None:
    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
