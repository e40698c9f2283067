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


# The files that take longest (tens of seconds each on 2 cores), run first. ``make test``
# hands whole files to its workers in collection order (``--dist loadfile``), so a long
# file collected last would run alone at the end while the other worker idles.
LONGEST_FIRST = (  # longest first, from make test's --durations
    "distributed/test_tensor_parallel.py", "lowering/test_dtype_walk.py", "models/test_recurrent_families.py",
    "generation/test_speculative.py", "models/test_repeated_layers.py", "cli/test_cli.py", "fuzz/test_fuzz.py", "delegate_ops/test_delegate_ops.py",
    "models/test_kv_cache_growth.py", "models/test_causal_lm_families.py", "lowering/test_attention.py",
    "lowering/test_convolution.py", "models/test_sliding_window.py", "generation/test_llm_apps.py",
    "models/test_hf_models.py", "lowering/test_shape.py", "speech/test_whisper.py", "multimodal/test_llava.py",
    "multimodal/test_idefics3.py", "multimodal/test_gemma3.py", "multimodal/test_qwen2_5_vl.py", "serve/test_server.py", "lowering/test_elementwise.py",
    "models/test_mixture_of_experts.py", "export/test_pass_shortcuts.py", "loading/test_mapped_load.py",
    "lowering/test_fusions.py", "models/test_windowed_attention.py", "models/test_quantized_kv_cache.py",
    "lowering/test_quantized.py", "runtime_shim/test_limits.py", "lowering/test_indexing.py",
    "generation/test_device_sampler.py",
)


def pytest_collection_modifyitems(session, config, items):
    root = os.path.dirname(__file__)

    def rank(item):
        path = os.path.relpath(str(item.path), root)
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the rest, and every file's own order, unchanged
