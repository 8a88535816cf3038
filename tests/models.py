"""Small models the backend tests compile: each is a kind of graph users run."""

from __future__ import annotations

import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from demo import Block  # noqa: E402  (the demo's block is the one tests exercise)


class MLP(nn.Module):
    def __init__(self, width: int = 64, hidden: int = 128, out: int = 10) -> None:
        super().__init__()
        self.l1, self.l2 = nn.Linear(width, hidden), nn.Linear(hidden, out)

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x)))


class GPTBlock(Block):
    """The demo's pre-norm block with causal scaled_dot_product_attention, at test size."""

    def __init__(self, dim: int = 64, heads: int = 4) -> None:
        super().__init__(dim, heads)


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        return self.fc(self.pool(F.relu(self.bn(self.conv(x)))).flatten(1))


class LSTMHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(16, 32, batch_first=True)
        self.fc = nn.Linear(32, 4)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.fc(out[:, -1])


def encoder_layer() -> nn.TransformerEncoderLayer:
    return nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
