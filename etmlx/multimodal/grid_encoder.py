"""The vision encoder of a Qwen2-VL, Qwen2.5-VL or Qwen3-VL export (``export``), for
images of any size (each side a multiple of a merged patch) up to a number of pixels.

``vision_encoder(pixel_values [1, 3, H, W]) -> rows [1, n, hidden * (1 + k) + 4]``: the
image cut into patches as Qwen's processor cuts it (``qwen_processor.QwenVLProcessor``
undoes that for the runners, which pass images whole), its vision transformer and merger,
Qwen3-VL's k deepstack features (early layers' merged outputs, which its text model adds
to its first k layers' outputs; k = 0 for the others), and four channels per row that
place it in the text model's three-dimensional RoPE
(``etmlx.llm.windowed_cache.PositionedEmbeddedCausalLM``): the row's offsets in time,
height and width from the image's first position, and how many positions it advances
the text after it (0, but the last row: the larger side of the merged grid).

The transformer's rotary positions, attention windows and image bounds, and (Qwen3-VL) the
resampling of its learned position grid depend on the grid only; transformers computes
them in Python (``vision_utils``) from the grid's sizes, which a trace of any size does not
know. Here they are graph operations on the image's height and width, handed to the
model as its precomputed keyword arguments; its attention is ``window_attention``, which
transformers hands the window layout (``Windows``) as it was given."""

import torch
from transformers import AttentionInterface

from etmlx.errors import ExportError
from etmlx.llm.attention_probe import attention_implementation

from .qwen_processor import longest_side

# "flash" in the name: transformers then hands attention the window layout, as given
ATTENTION = "etmlx_flash_windows"


class GridVisionEncoder(torch.nn.Module):
    """``vision_encoder`` of Qwen's vision transformer and merger, for images whose sides
    are multiples of a merged patch, as many of them as an image of ``image_size``
    (height, width) has at most (``max_rows``): the processor's own resize keeps each
    image's shape within that area (``qwen_processor.longest_side`` of them a side at most)."""

    def __init__(self, model, image_size: tuple):
        super().__init__()
        self.visual = model.model.visual
        config = self.visual.config
        self.patch, self.merge, self.copies = config.patch_size, config.spatial_merge_size, config.temporal_patch_size
        self.unit = self.patch * self.merge  # pixels a side of a merged patch
        # Qwen2.5-VL's windows: merged patches a side (the others attend over the whole image)
        self.window = config.window_size // self.unit if getattr(config, "window_size", None) else None
        self.max_rows = image_size[0] * image_size[1] // self.unit ** 2  # an image's tokens, at most

    def dynamic_shapes(self):
        """torch.export's shapes of ``forward``'s pixels: any multiple of a merged patch
        each side, up to ``longest_side(max_rows)`` of them."""
        from torch.export import Dim

        side = longest_side(self.max_rows)
        rows, columns = Dim("rows", min=1, max=side), Dim("columns", min=1, max=side)
        return ({2: self.unit * rows, 3: self.unit * columns},)

    def forward(self, pixel_values):
        _, _, height, width = pixel_values.shape
        rows, columns = height // self.unit, width // self.unit
        y, x = _patch_positions(rows, columns, self.merge)
        patches = rows * columns * self.merge ** 2
        # What transformers would compute from the grid in Python, as graph operations
        grid = dict(position_ids=torch.stack([y, x], -1), cu_seqlens=(0, patches), max_seqlen=patches)
        if self.window:
            grid.update(Windows(rows, columns, self.window, self.merge ** 2).arguments())
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


def _raster(rows, columns) -> tuple:
    """(row, column) of each cell of a ``rows`` x ``columns`` grid, in raster order."""
    return (torch.arange(rows)[:, None].expand(rows, columns).reshape(-1),
            torch.arange(columns)[None, :].expand(rows, columns).reshape(-1))


def placement(rows, columns):
    """``[rows * columns, 4]``: each merged patch's (0, row, column) offsets, and the
    positions the image advances on its last row (Qwen2.5-VL's ``get_rope_index``: the
    text after an image starts past the larger side of its grid). Sizes may be symbolic."""
    row, column = _raster(rows, columns)
    larger = torch.maximum(torch.scalar_tensor(rows, dtype=torch.long), torch.scalar_tensor(columns, dtype=torch.long))
    advance = torch.cat([torch.zeros(rows * columns - 1, dtype=torch.long), larger[None]])
    return torch.stack([torch.zeros_like(row), row, column, advance], -1).float()


class Windows:
    """Qwen2.5-VL's attention windows over a grid of ``rows`` x ``columns`` merged patches
    (sizes that may be symbolic), each ``side`` x ``side`` merged patches of ``merged``
    patches, those at the right and bottom edges cut short. transformers orders the
    patches window by window (``window_index``: windows in raster order, each its merged
    patches in raster order) and attends within each, of lengths it reads from the grid in
    Python; here every window is padded to the full length (with copies of a patch), and
    all attend in one batched call whose mask leaves the padding out: the same softmax
    over the same keys."""

    def __init__(self, rows, columns, side: int, merged: int):
        row, column = _raster(rows, columns)
        across = (columns + side - 1) // side  # windows in a row of them
        self.count = (rows + side - 1) // side * across
        self.length = side * side * merged  # patches in a full window
        # each merged patch's slot in the padded windows, whose order is transformers'
        slot = ((row // side) * across + column // side) * side * side + (row % side) * side + column % side
        slots, self.window_index = torch.sort(slot)
        # each patch's slot (the sequence is in window order); each slot's patch, and whether it has one
        self.slots = (slots[:, None] * merged + torch.arange(merged)).reshape(-1)
        empty = torch.zeros(self.count * self.length, dtype=torch.long)
        self.patch_of_slot = empty.index_put((self.slots,), torch.arange(rows * columns * merged))
        unfilled = torch.zeros_like(empty, dtype=torch.bool)
        self.real = unfilled.index_put((self.slots,), torch.ones_like(self.slots, dtype=torch.bool))

    def arguments(self) -> dict:
        """The window keyword arguments of transformers' vision transformer: ``window_index``,
        and this layout where it takes the windows' boundaries (``window_attention`` reads it)."""
        return dict(window_index=self.window_index, cu_window_seqlens=self, max_window_seqlen=self.length)

    def attend(self, query, key, value, scaling):
        """``[1, heads, n, head_dim]`` each, in window order -> ``[1, n, heads, head_dim]``."""
        _, heads, _, width = query.shape

        def windowed(t):  # [windows, heads, window length, head_dim]; padding: a patch the mask leaves out
            padded = torch.index_select(t, 2, self.patch_of_slot)
            return padded.reshape(heads, self.count, self.length, width).transpose(0, 1)

        real = self.real.reshape(self.count, 1, 1, self.length)
        out = torch.nn.functional.scaled_dot_product_attention(*map(windowed, (query, key, value)), attn_mask=real,
                                                               scale=scaling)
        out = torch.index_select(out.transpose(0, 1).reshape(heads, self.count * self.length, width), 1, self.slots)
        return out.transpose(0, 1)[None]


def window_attention(module, query, key, value, attention_mask=None, scaling=None, cu_seq_lens_q=None, **kwargs):
    """Attention of ``query``, ``key``, ``value`` ``[1, heads, n, head_dim]`` within the
    windows ``cu_seq_lens_q`` lays out (``Windows``), or over all of them (``(0, n)``), as
    ``[1, n, heads, head_dim]``."""
    if isinstance(cu_seq_lens_q, Windows):
        return cu_seq_lens_q.attend(query, key, value, scaling), None
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, scale=scaling)
    return out.transpose(1, 2), None


AttentionInterface.register(ATTENTION, window_attention)
