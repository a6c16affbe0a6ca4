"""``fedco.models.CNN4`` in ``torch.nn`` (NCHW), for every PyTorch side of the benchmarks
(``torch_conv.py`` and the Flower and pfl programs, which run without fedco or JAX)."""

import torch


class TorchCNN4(torch.nn.Module):
  """Four blocks of conv 3x3 (``filters`` channels, no bias), GroupNorm (``groups``; fedco's
  ``group_count(32) = 8``), ReLU, 2x2 max-pool; then a dense layer. torch's own init."""

  def __init__(self, filters=32, num_classes=10, in_channels=3, size=32, groups=8):
    super().__init__()
    layers, c = [], in_channels
    for _ in range(4):
      layers += [
        torch.nn.Conv2d(c, filters, 3, padding=1, bias=False),
        torch.nn.GroupNorm(groups, filters, eps=1e-5),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
      ]
      c = filters
    self.features = torch.nn.Sequential(*layers)
    self.logits = torch.nn.Linear(filters * (size // 16) ** 2, num_classes)

  def forward(self, x):
    return self.logits(torch.flatten(self.features(x), 1))
