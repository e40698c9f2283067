"""Vision models in the shapes that matter on MLX's CPU, written here so that nothing is
downloaded and neither torchvision nor timm is needed: a MobileNetV2-style network
(depthwise 3x3 convolutions), a ConvNeXt-style one (depthwise 7x7, LayerNorm over a
channels-last view, pooling of a channels-last result) and a Swin-style one (shifted
window attention, ``torch.roll``). Random weights; ``etmlx export
examples/vision.py:convnext`` exports one.

Each factory returns ``(module, example_inputs, dynamic_shapes)`` like
``examples/models.py``.
"""

import torch
import torch.nn.functional as F
from torch import nn


class InvertedResidual(nn.Module):
    """MobileNetV2's block: expand 1x1, depthwise 3x3, project 1x1."""

    def __init__(self, channels: int, out: int, stride: int, expand: int = 4):
        super().__init__()
        hidden = channels * expand
        self.residual = stride == 1 and channels == out
        self.layers = nn.Sequential(
            nn.Conv2d(channels, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, out, 1, bias=False), nn.BatchNorm2d(out),
        )

    def forward(self, x):
        return x + self.layers(x) if self.residual else self.layers(x)


class MobileNet(nn.Module):
    def __init__(self, width: int = 16, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 2, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU6())
        self.blocks = nn.Sequential(
            InvertedResidual(width, width, 1), InvertedResidual(width, 2 * width, 2),
            InvertedResidual(2 * width, 2 * width, 1), InvertedResidual(2 * width, 4 * width, 2),
            InvertedResidual(4 * width, 4 * width, 1),
        )
        self.head = nn.Linear(4 * width, classes)

    def forward(self, x):
        return self.head(F.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1).flatten(1))


class ConvNeXtBlock(nn.Module):
    """Depthwise 7x7, then LayerNorm and the MLP over a channels-last view, layer-scaled."""

    def __init__(self, channels: int):
        super().__init__()
        self.depthwise = nn.Conv2d(channels, channels, 7, padding=3, groups=channels)
        self.norm = nn.LayerNorm(channels)
        self.mlp = nn.Sequential(nn.Linear(channels, 4 * channels), nn.GELU(), nn.Linear(4 * channels, channels))
        self.scale = nn.Parameter(torch.full((channels,), 0.5))

    def forward(self, x):
        y = self.depthwise(x).permute(0, 2, 3, 1)
        return x + (self.scale * self.mlp(self.norm(y))).permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    def __init__(self, width: int = 32, classes: int = 10):
        super().__init__()
        self.stem = nn.Conv2d(3, width, 4, stride=4)
        self.stage1 = nn.Sequential(ConvNeXtBlock(width), ConvNeXtBlock(width))
        self.down = nn.Conv2d(width, 2 * width, 2, stride=2)
        self.stage2 = nn.Sequential(ConvNeXtBlock(2 * width), ConvNeXtBlock(2 * width))
        self.norm = nn.LayerNorm(2 * width)
        self.head = nn.Linear(2 * width, classes)

    def forward(self, x):
        x = self.stage2(self.down(self.stage1(self.stem(x))))
        x = self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)  # a channels-last result, pooled
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


class WindowAttentionBlock(nn.Module):
    """Swin's block: attention within windows of ``window`` x ``window`` tokens, the
    windows shifted by half a window (``torch.roll``) when ``shift``."""

    def __init__(self, channels: int, heads: int, window: int, shift: bool):
        super().__init__()
        self.window, self.shift, self.heads = window, window // 2 if shift else 0, heads
        self.norm1, self.norm2 = nn.LayerNorm(channels), nn.LayerNorm(channels)
        self.qkv, self.proj = nn.Linear(channels, 3 * channels), nn.Linear(channels, channels)
        self.mlp = nn.Sequential(nn.Linear(channels, 4 * channels), nn.GELU(), nn.Linear(4 * channels, channels))

    def forward(self, x):  # (B, H, W, C)
        batch, height, width, channels = x.shape
        w = self.window
        y = self.norm1(x)
        if self.shift:
            y = torch.roll(y, (-self.shift, -self.shift), (1, 2))
        windows = y.view(batch, height // w, w, width // w, w, channels).permute(0, 1, 3, 2, 4, 5).reshape(-1, w * w, channels)
        q, k, v = self.qkv(windows).view(-1, w * w, 3, self.heads, channels // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(-1, w * w, channels)
        y = self.proj(attended).view(batch, height // w, width // w, w, w, channels).permute(0, 1, 3, 2, 4, 5)
        y = y.reshape(batch, height, width, channels)
        if self.shift:
            y = torch.roll(y, (self.shift, self.shift), (1, 2))
        x = x + y
        return x + self.mlp(self.norm2(x))


class Swin(nn.Module):
    def __init__(self, width: int = 32, classes: int = 10):
        super().__init__()
        self.embed = nn.Conv2d(3, width, 4, stride=4)
        self.blocks = nn.Sequential(WindowAttentionBlock(width, 2, 4, False), WindowAttentionBlock(width, 2, 4, True))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        x = self.norm(self.blocks(self.embed(x).permute(0, 2, 3, 1)))
        return self.head(F.adaptive_avg_pool2d(x.permute(0, 3, 1, 2), 1).flatten(1))


def _randomized(module: nn.Module) -> nn.Module:
    """Eval mode, with batch norms' statistics away from the identity."""
    torch.manual_seed(0)
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    return module.eval()


def mobilenet(size: int = 64):
    torch.manual_seed(0)
    return _randomized(MobileNet()), (torch.randn(1, 3, size, size),), None


def convnext(size: int = 64):
    torch.manual_seed(0)
    return _randomized(ConvNeXt()), (torch.randn(1, 3, size, size),), None


def swin(size: int = 64):
    torch.manual_seed(0)
    return _randomized(Swin()), (torch.randn(1, 3, size, size),), None
