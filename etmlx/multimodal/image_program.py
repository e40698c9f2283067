"""The image methods of a vision-language program (``export``): the vision encoder and the
token embedding, as modules over a Hugging Face image-text-to-text model's own parts."""

import torch
from torch.export import Dim


class VisionEncoder(torch.nn.Module):
    """``pixel_values [1, 3, H, W] -> features [1, n, hidden]`` of one image: LLaVA's
    ``get_image_features`` (the checkpoint's vision layer and feature selection, then its
    projector); or of one tile of an image that the processor split into tiles (Idefics3,
    SmolVLM: every tile full, so ``get_image_features``' patch mask is all ones and its
    search for padding tiles finds none): the vision model, then the connector."""

    def __init__(self, model, marked: bool = False):
        super().__init__()
        self.model = model.model
        self.marked = marked

    def forward(self, pixel_values):
        pixel_values = pixel_values.to(next(self.model.parameters()).dtype)
        if hasattr(self.model, "connector"):  # a tile
            features = self.model.connector(self.model.vision_model(pixel_values=pixel_values).last_hidden_state)
        else:
            features = torch.cat(list(self.model.get_image_features(pixel_values=pixel_values).pooler_output))[None]
        return _marked(features, 1) if self.marked else features


class TokenEmbedding(torch.nn.Module):
    """``tokens [1, n] -> embeddings [1, n, hidden]``."""

    def __init__(self, embeddings, marked: bool = False):
        super().__init__()
        self.embeddings = embeddings
        self.marked = marked

    def forward(self, tokens):
        embedded = self.embeddings(tokens)
        return _marked(embedded, 0) if self.marked else embedded


def _marked(rows, mark: int):
    """``rows [1, n, hidden]`` and a channel of ``mark``: 1 for an image's rows, 0 for a
    token's (``etmlx.llm.windowed_cache.MarkedEmbeddedCausalLM`` reads it)."""
    return torch.cat([rows, torch.full((*rows.shape[:-1], 1), mark, dtype=rows.dtype)], -1)


def tokens_per_image(model, image_size: tuple) -> int:
    """How many feature rows (placeholder tokens) one image (or tile) of ``image_size`` makes."""
    with torch.no_grad():
        return VisionEncoder(model)(torch.zeros(1, 3, *image_size)).shape[1]


def export_methods(model, text, image_size: tuple, max_seq_len: int, marked: bool = False) -> dict:
    """``{"vision_encoder": ..., "token_embedding": ...}``: ExportedPrograms of ``model``'s
    vision part at ``image_size`` (height, width) and of ``text``'s input embeddings
    (1 to ``max_seq_len`` tokens); ``marked``: each row with a channel marking an image's."""
    seq = Dim("seq", min=1, max=max_seq_len) if max_seq_len > 1 else None
    tokens = torch.zeros(1, min(2, max_seq_len), dtype=torch.long)
    with torch.no_grad():
        return {
            "vision_encoder": torch.export.export(VisionEncoder(model, marked).eval(), (torch.zeros(1, 3, *image_size),)),
            "token_embedding": torch.export.export(TokenEmbedding(text.get_input_embeddings(), marked).eval(), (tokens,),
                                                   dynamic_shapes=({1: seq},) if seq else None),
        }
