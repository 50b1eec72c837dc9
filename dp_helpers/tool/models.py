"""The source article's SimpleModel, an MLP and a BatchNorm net ending in a sigmoid for BCE, and the digits CNN (every notebook)."""

from __future__ import annotations

import torch
from torch import nn

MODELS = ("linear", "mlp", "bn", "cnn")  # what --model may name


class SimpleModel(nn.Module):
    """The source article's model: one linear layer and a sigmoid."""

    def __init__(self, input_dim: int):
        super().__init__()
        self.fc = nn.Linear(input_dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Probabilities of shape (batch, 1)."""
        return torch.sigmoid(self.fc(x))


class MLP(nn.Module):
    """A ReLU MLP with `depth` hidden layers of width `hidden` and a sigmoid output."""

    def __init__(self, input_dim: int, hidden: int = 64, depth: int = 2):
        super().__init__()
        layers: list[nn.Module] = []
        width = input_dim
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Probabilities of shape (batch, 1)."""
        return torch.sigmoid(self.net(x))


class BNNet(nn.Module):
    """Linear -> BatchNorm1d -> ReLU -> Linear -> sigmoid: a model whose forward depends on the whole batch."""

    def __init__(self, input_dim: int, hidden: int = 16):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(input_dim, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Probabilities of shape (batch, 1)."""
        return torch.sigmoid(self.net(x))


class DigitsCNN(nn.Module):
    """Two 3x3 convolutions, each followed by 2x2 max-pooling, and a linear layer: 10 logits for an 8x8 digit image."""

    def __init__(self, channels: int = 16):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 8x8 -> 4x4
            nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 4x4 -> 2x2
            nn.Flatten(), nn.Linear(2 * channels * 4, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of shape (batch, 10): cross-entropy applies the softmax itself."""
        return self.net(x)


def build_model(name: str, input_dim: int, seed: int) -> nn.Module:
    """A freshly initialised model, its weights fixed by `seed` alone (same on every rank)."""
    if name not in MODELS:  # a ValueError of its own: models sit below the request's checks, which use them
        raise ValueError(f"model must be one of {', '.join(MODELS)}, got {name!r}.")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if name == "cnn":  # its input is fixed: 8x8 images
            return DigitsCNN()
        return {"linear": SimpleModel, "mlp": MLP, "bn": BNNet}[name](input_dim)
