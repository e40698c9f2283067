import os
import sys

import etmlx  # noqa: F401  (before anything imports mlx: OpenBLAS)
import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(autouse=True)
def _seeded():
    """Every test draws the same random weights and inputs on every run, so a tolerance
    that passes once passes always."""
    torch.manual_seed(0)
    np.random.seed(0)
