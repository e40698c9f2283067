"""The draft of speculative decoding written into the target's own ``.pte``, so that an app
loads one file (``export-llm TARGET --draft DIR``, or ``--draft-layers N``): beside the
target's ``forward`` and ``verify``, the draft's ``draft_forward`` and constant methods
(``draft_get_max_seq_len``, ...), its KV caches under names of its own (``draft.cached.*``).
``Session(program, prefix=PREFIX)`` drives those methods of a loaded program.

``--draft-layers N`` needs no second checkpoint: the draft is the target's first N decoder
layers, then its final norm and head (``first_layers.first_layers``), the same modules, so the file
stores their weights once (named data is keyed by content) and the draft costs only its
caches. Its proposals are what the target's first layers would make of the text, which a
model whose later layers refine rather than rewrite keeps often."""

from etmlx.errors import ExportError

# The name the draft's methods and buffers start with.
PREFIX = "draft"


def refuse_recurrent(model, role: str) -> None:
    """A model whose layers keep a recurrent state cannot go back past a rejected token."""
    from .recurrent_state import FAMILIES

    if model.config.get_text_config().model_type in FAMILIES:
        raise ExportError(f"the {role}'s layers keep a recurrent state ({model.config.get_text_config().model_type}), "
                          "which cannot go back past a rejected token: speculative decoding needs attention caches")


def methods(draft_model, max_seq_len: int, capacity: int) -> dict:
    """The draft's methods for the target's file: ``causal_lm.export_methods`` of
    ``draft_model`` over a cache of ``capacity`` tokens, its buffers and names prefixed."""
    from . import causal_lm

    refuse_recurrent(draft_model, "draft")
    exported = causal_lm.export_methods(draft_model, max_seq_len, capacity, buffer_prefix=PREFIX)
    return {f"{PREFIX}_{name}": value for name, value in exported.items()}
