"""Example models that ship with etmlx.

Each factory returns ``(module, example_inputs, dynamic_shapes)``; this is the
shape ``etmlx export FILE.py:FACTORY`` expects. The models are small on purpose:
they cover the op families etmlx lowers, not a benchmark of scale.
"""

import math

import torch
from torch import nn
from torch.export import Dim


class MLP(nn.Module):
    def __init__(self, features=64, hidden=128, classes=10):
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.head(x)


class SmallCNN(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, stride=1, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.head = nn.Linear(32 * 8 * 8, classes)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = nn.functional.avg_pool2d(torch.relu(self.bn2(self.conv2(x))), 2)
        return self.head(torch.flatten(x, 1))


class EncoderBlock(nn.Module):
    """Pre-norm transformer encoder block with attention written out by hand."""

    def __init__(self, dim=64, heads=4, vocab=256, mlp_ratio=4):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.embed = nn.Embedding(vocab, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, mlp_ratio * dim)
        self.gate = nn.Linear(dim, mlp_ratio * dim)
        self.down = nn.Linear(mlp_ratio * dim, dim)

    def attention(self, x):
        batch, seq, _ = x.shape
        qkv = self.qkv(x).reshape(batch, seq, 3, self.heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        out = torch.softmax(scores, dim=-1) @ v
        return self.proj(out.transpose(1, 2).reshape(batch, seq, self.heads * self.head_dim))

    def forward(self, tokens):
        x = self.embed(tokens)
        x = x + self.attention(self.norm1(x))
        h = self.norm2(x)
        x = x + self.down(nn.functional.gelu(self.up(h)) * nn.functional.silu(self.gate(h)))
        return x


def mlp(batch=4):
    model = MLP().eval()
    return model, (torch.randn(batch, 64),), None


def mlp_dynamic_batch(batch=4):
    model, inputs, _ = mlp(batch)
    return model, inputs, ({0: Dim("batch", min=1, max=64)},)


def cnn(batch=2):
    model = SmallCNN().eval()
    with torch.no_grad():  # non-trivial running statistics, so batch norm is not an identity
        for bn in (model.bn1, model.bn2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 1.5)
    return model, (torch.randn(batch, 3, 32, 32),), None


def encoder_block(batch=2, seq=16):
    model = EncoderBlock().eval()
    return model, (torch.randint(0, 256, (batch, seq)),), None


def encoder_block_dynamic_seq(batch=2, seq=16):
    model, inputs, _ = encoder_block(batch, seq)
    return model, inputs, ({1: Dim("seq", min=2, max=128)},)
