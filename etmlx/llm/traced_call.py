"""The ``WindowedCausalLM`` call being traced, for the functions transformers' modeling
code calls inside it: not every family hands its call's kwargs on to attention
(``windowed_cache.windowed_sdpa``) or to its state-space scan
(``recurrent_kernels.state_space_scan``)."""


class TracedCall:
    """Set by ``WindowedCausalLM.call`` for one traced call, else None: ``window``, the
    cache slots attention reads (a SymInt); ``rings``, its sliding layers' ``Rings``;
    ``quantized``, its quantized layers (``{index: QuantizedLayer}``); ``continues``, for
    a family whose states only a scan reads (``recurrent_state.SCANNED``), whether the
    call continues a sequence (a 0-d bool tensor); ``blocks``, for a call whose image
    tokens attend to each other both ways (``windowed_cache.MarkedEmbeddedCausalLM``), the
    image block of every cache position (``[1, capacity]``, -1 where none)."""

    window = None
    rings = None
    quantized = None
    continues = None
    blocks = None

    def clear(self) -> None:
        self.window = self.rings = self.quantized = self.continues = self.blocks = None


TRACING = TracedCall()
