"""The vision encoder of a Qwen2-VL, Qwen2.5-VL or Qwen3-VL export (``export``), at one
image size.

``vision_encoder(pixel_values [1, 3, H, W]) -> rows [1, n, hidden * (1 + k) + 4]``: the
image cut into patches as Qwen's processor cuts it (``qwen_processor.QwenVLProcessor``
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

from etmlx.errors import ExportError
from etmlx.llm.attention_probe import attention_implementation

# "flash" in the name: transformers then hands attention the window boundaries, as given
ATTENTION = "etmlx_flash_windows"


class GridVisionEncoder(torch.nn.Module):
    """``vision_encoder`` of Qwen's vision transformer and merger. ``image_size``: (height,
    width); Qwen2.5-VL's encoder takes images of that size only (its windows are laid out
    in Python); the others take any size up to its area (``dynamic``), which the
    processor's own resize then keeps to (``max_rows`` tokens at most)."""

    def __init__(self, model, image_size: tuple):
        super().__init__()
        self.visual = model.model.visual
        config = self.visual.config
        self.patch, self.merge, self.copies = config.patch_size, config.spatial_merge_size, config.temporal_patch_size
        self.unit = self.patch * self.merge  # pixels a side of a merged patch
        height, width = image_size
        self.windows = {}
        if getattr(config, "window_size", None):  # Qwen2.5-VL (the others attend over the whole image)
            from transformers.vision_utils import get_vision_window_index

            grid = torch.tensor([[1, height // self.patch, width // self.patch]])
            window_index, cu_window_seqlens = get_vision_window_index(
                grid, spatial_merge_size=self.merge, window_size=config.window_size, patch_size=self.patch)
            windows = tuple(cu_window_seqlens.tolist())
            self.windows = dict(window_index=window_index, cu_window_seqlens=windows,
                                max_window_seqlen=max(b - a for a, b in zip(windows, windows[1:])))
        self.dynamic = not self.windows
        self.max_rows = height * width // self.unit ** 2  # an image's tokens, at most

    def dynamic_shapes(self):
        """torch.export's shapes of ``forward``'s pixels: any multiple of a merged patch
        each side, up to ``max_rows`` of them (None: the one size)."""
        from torch.export import Dim

        if not self.dynamic:
            return None
        rows, columns = Dim("rows", min=1, max=self.max_rows), Dim("columns", min=1, max=self.max_rows)
        return ({2: self.unit * rows, 3: self.unit * columns},)

    def forward(self, pixel_values):
        _, _, height, width = pixel_values.shape
        rows, columns = height // self.unit, width // self.unit
        y, x = _patch_positions(rows, columns, self.merge)
        patches = rows * columns * self.merge ** 2
        # What transformers would compute from the grid in Python, as graph operations
        grid = dict(position_ids=torch.stack([y, x], -1), cu_seqlens=(0, patches), max_seqlen=patches, **self.windows)
        if hasattr(self.visual, "num_grid_per_side"):  # Qwen3-VL: a learned position grid, resampled to the image's
            grid.update(self._resampled_positions(y, x, rows * self.merge, columns * self.merge))
        with attention_implementation(self.visual, ATTENTION):
            output = self.visual(self.patches(pixel_values), grid_thw=None, **grid)
        features = [output.pooler_output, *(getattr(output, "deepstack_features", None) or ())]
        return torch.cat([*features, placement(rows, columns).to(output.pooler_output.dtype)], -1)[None]

    def _resampled_positions(self, y, x, height: int, width: int) -> dict:
        """Qwen3-VL's ``interp_indices`` and ``interp_weights``: each patch's four taps into
        the learned square grid and their bilinear weights (corners aligned), as
        transformers' ``get_vision_interpolation_indices_and_weights`` computes them."""
        side = self.visual.num_grid_per_side
        if self.visual.interpolation_mode != "bilinear" or not self.visual.interpolation_align_corners:
            raise ExportError(f"{type(self.visual).__name__} resamples its position grid by "
                              f"{self.visual.interpolation_mode}, which etmlx does not compute")

        def taps(index, size):
            source = index.float() * (side - 1) / torch.clamp(torch.scalar_tensor(size - 1, dtype=torch.long), min=1)
            floor = torch.floor(source)
            offsets = torch.arange(2)
            weights = (1 - (source[:, None] - floor[:, None] - offsets).abs()).clamp(min=0)
            return (floor.long()[:, None] + offsets).clamp(0, side - 1), weights

        (rows, row_weights), (columns, column_weights) = taps(y, height), taps(x, width)
        return dict(interp_indices=(rows[:, :, None] * side + columns[:, None, :]).reshape(-1, 4),
                    interp_weights=(row_weights[:, :, None] * column_weights[:, None, :]).reshape(-1, 4))

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


def _patch_positions(rows, columns, merge: int) -> tuple:
    """(row, column) of each patch of a grid of ``rows`` x ``columns`` merged patches, in
    the processor's order (merged patches in raster order, each its merge x merge patches)."""
    y = torch.arange(rows)[:, None, None, None] * merge + torch.arange(merge)[None, None, :, None]
    x = torch.arange(columns)[None, :, None, None] * merge + torch.arange(merge)[None, None, None, :]
    return (y.expand(rows, columns, merge, merge).reshape(-1), x.expand(rows, columns, merge, merge).reshape(-1))


def placement(rows, columns):
    """``[rows * columns, 4]``: each merged patch's (0, row, column) offsets, and the
    positions the image advances on its last row (Qwen2.5-VL's ``get_rope_index``: the
    text after an image starts past the larger side of its grid). Sizes may be symbolic."""
    row = torch.arange(rows)[:, None].expand(rows, columns).reshape(-1)
    column = torch.arange(columns)[None, :].expand(rows, columns).reshape(-1)
    larger = torch.maximum(torch.scalar_tensor(rows, dtype=torch.long), torch.scalar_tensor(columns, dtype=torch.long))
    advance = torch.cat([torch.zeros(rows * columns - 1, dtype=torch.long), larger[None]])
    return torch.stack([torch.zeros_like(row), row, column, advance], -1).float()


def window_attention(module, query, key, value, attention_mask=None, scaling=None, cu_seq_lens_q=None, **kwargs):
    """Attention of ``query``, ``key``, ``value`` ``[1, heads, n, head_dim]`` within each
    window that the boundaries ``cu_seq_lens_q`` (Python ints: ``GridVisionEncoder``'s)
    delimit, as ``[1, n, heads, head_dim]``: windows of one length in one batched call
    (the fused kernel), others one call each."""
    _, heads, length, width = query.shape
    lengths = [end - start for start, end in zip(cu_seq_lens_q, cu_seq_lens_q[1:])]
    attend = torch.nn.functional.scaled_dot_product_attention
    if len(lengths) == 1 or len(set(lengths)) == 1:  # (one window: its length may be symbolic)
        windows = [t.reshape(heads, len(lengths), lengths[0], width).transpose(0, 1) for t in (query, key, value)]
        return attend(*windows, scale=scaling).transpose(1, 2).reshape(1, length, heads, width), None
    outputs = [attend(*(t[:, :, start:end] for t in (query, key, value)), scale=scaling)
               for start, end in zip(cu_seq_lens_q, cu_seq_lens_q[1:])]
    return torch.cat(outputs, 2).transpose(1, 2), None


AttentionInterface.register(ATTENTION, window_attention)
