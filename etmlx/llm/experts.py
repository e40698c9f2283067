"""Mixture-of-experts models' experts in the form etmlx traces them."""

import contextlib


@contextlib.contextmanager
def batched_experts(model):
    """Runs a mixture-of-experts model's experts through transformers' ``batched_mm``
    form while tracing (the chosen experts' weights gathered per token, then ``bmm``),
    which lowering turns into ``mx.gather_mm``; its default ``grouped_mm`` form calls an
    opaque custom op. The model's own setting is restored after. No-op for other models."""
    if not model._can_set_experts_implementation():
        yield
        return
    before = model.get_experts_implementation()
    model.set_experts_implementation("batched_mm")
    try:
        yield
    finally:
        model.set_experts_implementation(before)
