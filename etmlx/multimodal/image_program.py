"""The image methods of a vision-language program (``export``): the vision encoder and the
token embedding, as modules over a Hugging Face image-text-to-text model's own parts."""

import torch
from torch.export import Dim

# The channels ``token_embedding`` appends to a token's embedding, by the kind of
# ``text_decoder`` (``etmlx.llm.causal_lm.export_methods``' ``embeddings``): a mark of 0
# (not an image's row), or a placement in multimodal RoPE (no offset, one position).
TOKEN_CHANNELS = {True: (), "marked": (0.0,), "positioned": (0.0, 0.0, 0.0, 1.0)}


class VisionEncoder(torch.nn.Module):
    """``pixel_values [1, 3, H, W] -> features [1, n, hidden]`` of one image: LLaVA's
    ``get_image_features`` (the checkpoint's vision layer and feature selection, then its
    projector); or of one tile of an image that the processor split into tiles (Idefics3,
    SmolVLM: every tile full, so ``get_image_features``' patch mask is all ones and its
    search for padding tiles finds none): the vision model, then the connector.
    ``marked``: each row with a channel of 1 (an image's row)."""

    def __init__(self, model, marked: bool = False):
        super().__init__()
        self.model = model.model
        self.channels = (1.0,) if marked else ()

    def forward(self, pixel_values):
        pixel_values = pixel_values.to(next(self.model.parameters()).dtype)
        if hasattr(self.model, "connector"):  # a tile
            features = self.model.connector(self.model.vision_model(pixel_values=pixel_values).last_hidden_state)
        else:
            features = torch.cat(list(self.model.get_image_features(pixel_values=pixel_values).pooler_output))[None]
        return _with_channels(features, self.channels)

    def dynamic_shapes(self):
        """None: the processor's one image (or tile) size."""
        return None


class TokenEmbedding(torch.nn.Module):
    """``tokens [1, n] -> embeddings [1, n, hidden * (1 + stacked) + len(channels)]``:
    each row followed by ``stacked`` vectors of zeros (where an image's rows carry
    Qwen3-VL's deepstack features), then ``channels``."""

    def __init__(self, embeddings, channels: tuple = (), stacked: int = 0):
        super().__init__()
        self.embeddings = embeddings
        self.channels = channels
        self.stacked = stacked

    def forward(self, tokens):
        rows = self.embeddings(tokens)
        if self.stacked:
            rows = torch.cat([rows, rows.new_zeros(*rows.shape[:-1], rows.shape[-1] * self.stacked)], -1)
        return _with_channels(rows, self.channels)


def _with_channels(rows, values: tuple):
    """``rows [1, n, hidden]`` and a channel of each of ``values``
    (``etmlx.llm.windowed_cache``'s embedded decoders read them)."""
    if not values:
        return rows
    return torch.cat([rows, torch.tensor(values, dtype=rows.dtype).expand(*rows.shape[:-1], len(values))], -1)


def vision_encoder(model, image_size: tuple, embeddings=True):
    """The ``vision_encoder`` module of ``model`` at ``image_size`` for a ``text_decoder``
    of ``embeddings``' kind."""
    if embeddings == "positioned":
        from .grid_encoder import GridVisionEncoder

        return GridVisionEncoder(model, image_size).eval()
    return VisionEncoder(model, marked=embeddings == "marked").eval()


def tokens_per_image(encoder, image_size: tuple) -> int:
    """How many feature rows (placeholder tokens) one image (or tile) of ``image_size``
    makes (at most): an encoder's ``max_rows`` where it knows them, else the count it
    computes."""
    if getattr(encoder, "max_rows", None):
        return encoder.max_rows
    with torch.no_grad():
        return encoder(torch.zeros(1, 3, *image_size)).shape[1]


def export_methods(encoder, text, image_size: tuple, max_seq_len: int, embeddings=True, stacked: int = 0) -> dict:
    """``{"vision_encoder": ..., "token_embedding": ...}``: ExportedPrograms of ``encoder``
    (``vision_encoder``) at ``image_size`` (height, width; other sizes too where the
    encoder's ``dynamic_shapes`` say so) and of ``text``'s input
    embeddings (1 to ``max_seq_len`` tokens), each row followed by ``stacked`` vectors of
    zeros and the channels a ``text_decoder`` of ``embeddings``' kind reads
    (``TOKEN_CHANNELS``)."""
    seq = Dim("seq", min=1, max=max_seq_len) if max_seq_len > 1 else None
    tokens = torch.zeros(1, min(2, max_seq_len), dtype=torch.long)
    embedding = TokenEmbedding(text.get_input_embeddings(), TOKEN_CHANNELS[embeddings], stacked).eval()
    with torch.no_grad():
        return {
            "vision_encoder": torch.export.export(encoder, (torch.zeros(1, 3, *image_size),),
                                                  dynamic_shapes=encoder.dynamic_shapes()),
            "token_embedding": torch.export.export(embedding, (tokens,), dynamic_shapes=({1: seq},) if seq else None),
        }
