"""Every hybrid family etmlx exports (``examples.llm.HYBRIDS``: LFM2, LFM2-MoE, Qwen3.5,
Qwen3.5-MoE, Qwen3-Next, Mamba, Falcon-Mamba, Jamba, Mamba2, Falcon-H1, Granite 4 hybrid,
Bamba, Nemotron-H, Zamba2) through the checks of tests/hybrids.py, with float and with
4-bit weights. ``make test-vision`` runs this sweep; ``make test`` runs one
family of each kind (tests/models/test_recurrent_families.py)."""

import pytest
from hybrids import check_generation, exported

from examples import llm


@pytest.mark.parametrize("quantize", [None, "int4"])
@pytest.mark.parametrize("family", sorted(llm.HYBRIDS))
def test_every_hybrid_family_generates_eager_tokens(family, quantize, tmp_path):
    check_generation(*exported(family, tmp_path, quantize))
