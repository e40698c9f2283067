import os
import sys

import etmlx  # noqa: F401  (before anything imports mlx: OpenBLAS)

sys.path.insert(0, os.path.dirname(__file__))
