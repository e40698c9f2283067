"""``export-llm --dtype float32`` of a bfloat16 checkpoint reads each parameter from the
mapped file when the quantizer or lowering needs it (``lowering.deferred.converted``):
for a hybrid family of each kind of recurrent layer (they read parameters such as
Mamba's ``A_log`` and convolution weights) and a mixture of experts quantized (its expert
stacks), the file is the one that loading the whole model in float32 first writes.
tests/export/test_checkpoint_in_place.py checks a Llama and the loading itself."""

import pytest
import torch
from repeated import tiny
from transformers import AutoModelForCausalLM

from etmlx.exporter import export_methods
from etmlx.llm import causal_lm
from etmlx.llm.export import export_llm
from etmlx.quant.weights import quantized_copy
from examples import llm

CONTEXT = 32


# one family of each kind of recurrent layer (``recurrent_state.FAMILIES``)
HYBRIDS = ("lfm2", "qwen3_next", "mamba2", "jamba")


@pytest.mark.parametrize("family, quantize", [(family, None) for family in HYBRIDS] + [("Mixtral", "int4")])
def test_a_wider_dtype_writes_the_file_of_loading_in_it(family, quantize, tmp_path):
    model = tiny(family) if family == "Mixtral" else llm.tiny_hybrid(family)
    model.to(torch.bfloat16).save_pretrained(tmp_path / "checkpoint")
    export_llm(tmp_path / "checkpoint", tmp_path / "lazy.pte", max_context=CONTEXT, quantize=quantize, group_size=32,
               dtype="float32")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoint", dtype=torch.float32)
    loaded = causal_lm.with_static_cache(loaded, CONTEXT)
    if quantize is not None:
        loaded, _ = quantized_copy(loaded, quantize, 32)
    export_methods(causal_lm.export_methods(loaded, CONTEXT, CONTEXT), tmp_path / "eager.pte")
    assert (tmp_path / "lazy.pte").read_bytes() == (tmp_path / "eager.pte").read_bytes()
