"""The vision encoder of a Qwen2-VL, Qwen2.5-VL or Qwen3-VL export (``export``), at one
image size.

``vision_encoder(pixel_values [1, 3, H, W]) -> rows [1, n, hidden * (1 + k) + 4]``: the
image cut into patches as Qwen's processor cuts it (``fixed_grid.FixedGridProcessor``
undoes that for the runners, which pass images whole), its vision transformer and merger,
Qwen3-VL's k deepstack features (early layers' merged outputs, which its text model adds
to its first k layers' outputs; k = 0 for the others), and four channels per row that
place it in the text model's three-dimensional RoPE
(``etmlx.llm.windowed_cache.PositionedEmbeddedCausalLM``): the row's offsets in time,
height and width from the image's first position, and how many positions it advances
the text after it (0, but the last row: the larger side of the merged grid).

The transformer's window order, window and image boundaries, rotary positions and
(Qwen3-VL) the resampling of its learned position grid depend on the grid only;
transformers computes them in Python (``vision_utils``), so they are computed here once
for the export's grid and handed to the model as its precomputed keyword arguments. Its
attention within windows is ``window_attention``: transformers' own splits each window
off by boundaries it reads from a tensor, which a trace cannot."""

import torch
from transformers import AttentionInterface

from etmlx.llm.attention_probe import attention_implementation

# "flash" in the name: transformers then hands attention the window boundaries, as given
ATTENTION = "etmlx_flash_windows"


class GridVisionEncoder(torch.nn.Module):
    def __init__(self, model, image_size: tuple):
        from transformers.vision_utils import (get_vision_attention_seqlens, get_vision_interpolation_indices_and_weights,
                                               get_vision_position_ids, get_vision_window_index)

        super().__init__()
        self.visual = model.model.visual
        config = self.visual.config
        self.patch, self.merge, self.copies = config.patch_size, config.spatial_merge_size, config.temporal_patch_size
        height, width = image_size
        self.grid = torch.tensor([[1, height // self.patch, width // self.patch]])
        cu_seqlens, _ = get_vision_attention_seqlens(self.grid, config)
        image = tuple(cu_seqlens.tolist())
        self.precomputed = dict(position_ids=get_vision_position_ids(self.grid, self.merge), cu_seqlens=image,
                                max_seqlen=_longest(image))
        if hasattr(self.visual, "num_grid_per_side"):  # Qwen3-VL: a learned position grid, resampled to the image's
            interp_indices, interp_weights = get_vision_interpolation_indices_and_weights(
                self.grid, num_grid_per_side=self.visual.num_grid_per_side, mode=self.visual.interpolation_mode,
                align_corners=self.visual.interpolation_align_corners, spatial_merge_size=self.merge)
            self.precomputed.update(interp_indices=interp_indices, interp_weights=interp_weights)
        if getattr(config, "window_size", None):  # Qwen2.5-VL (Qwen2-VL attends over the whole image)
            window_index, cu_window_seqlens = get_vision_window_index(
                self.grid, spatial_merge_size=self.merge, window_size=config.window_size, patch_size=self.patch)
            windows = tuple(cu_window_seqlens.tolist())
            self.precomputed.update(window_index=window_index, cu_window_seqlens=windows,
                                    max_window_seqlen=_longest(windows))
        self.placement = placement(height // self.patch // self.merge, width // self.patch // self.merge)
        self.rows = len(self.placement)  # an image's tokens

    def forward(self, pixel_values):
        with attention_implementation(self.visual, ATTENTION):
            output = self.visual(self.patches(pixel_values), grid_thw=self.grid, **self.precomputed)
        features = [output.pooler_output, *(getattr(output, "deepstack_features", None) or ())]
        return torch.cat([*features, self.placement.to(output.pooler_output.dtype)], -1)[None]

    def patches(self, pixel_values):
        """``[1, 3, H, W]`` as the processor's ``[patches, 3 * copies * patch * patch]``:
        merged patches in raster order, each its merge x merge patches in raster order,
        each patch channel-major and repeated over the temporal patch (a still image)."""
        _, channels, height, width = pixel_values.shape
        patch, merge = self.patch, self.merge
        grid = pixel_values.reshape(channels, height // patch // merge, merge, patch, width // patch // merge, merge,
                                    patch)
        grid = grid.permute(1, 4, 2, 5, 0, 3, 6)[:, :, :, :, :, None]  # (rows, columns, y, x, channel, copy, py, px)
        grid = grid.expand(*grid.shape[:5], self.copies, patch, patch)
        return grid.reshape(-1, channels * self.copies * patch * patch).to(self.visual.dtype)


def placement(rows: int, columns: int):
    """``[rows * columns, 4]``: each merged patch's (0, row, column) offsets, and the
    positions the image advances on its last row (Qwen2.5-VL's ``get_rope_index``: the
    text after an image starts past the larger side of its grid)."""
    row, column = torch.meshgrid(torch.arange(rows), torch.arange(columns), indexing="ij")
    advance = torch.zeros(rows * columns)
    advance[-1] = max(rows, columns)
    return torch.stack([torch.zeros(rows * columns), row.flatten().float(), column.flatten().float(), advance], -1)


def window_attention(module, query, key, value, attention_mask=None, scaling=None, cu_seq_lens_q=None, **kwargs):
    """Attention of ``query``, ``key``, ``value`` ``[1, heads, n, head_dim]`` within each
    window that the boundaries ``cu_seq_lens_q`` (Python ints: ``GridVisionEncoder``'s)
    delimit, as ``[1, n, heads, head_dim]``: windows of one length in one batched call
    (the fused kernel), others one call each."""
    _, heads, length, width = query.shape
    lengths = [end - start for start, end in zip(cu_seq_lens_q, cu_seq_lens_q[1:])]
    attend = torch.nn.functional.scaled_dot_product_attention
    if len(set(lengths)) == 1:
        windows = [t.reshape(heads, len(lengths), lengths[0], width).transpose(0, 1) for t in (query, key, value)]
        return attend(*windows, scale=scaling).transpose(1, 2).reshape(1, length, heads, width), None
    outputs = [attend(*(t[:, :, start:end] for t in (query, key, value)), scale=scaling)
               for start, end in zip(cu_seq_lens_q, cu_seq_lens_q[1:])]
    return torch.cat(outputs, 2).transpose(1, 2), None


def _longest(bounds: tuple) -> int:
    return max(end - start for start, end in zip(bounds, bounds[1:]))


AttentionInterface.register(ATTENTION, window_attention)
