"""ResNet-20 for CIFAR (He et al. 2016, Sec. 4.2) with per-example normalization.

Layout (``width = 16`` gives the paper's 16/32/64 channels):

    conv 3x3 (width) -> norm -> ReLU
    stage 1: 3 basic blocks, width channels,      stride 1
    stage 2: 3 basic blocks, 2 * width channels,  stride 2 in the first block
    stage 3: 3 basic blocks, 4 * width channels,  stride 2 in the first block
    global average pool -> Dense(num_classes)

A basic block is ``relu(norm(conv3x3(relu(norm(conv3x3_s(x))))) + shortcut(x))`` with the
identity shortcut, or, where the shape changes (first block of stages 2 and 3), a projection
``norm(conv1x1_s(x))`` (He et al.'s option B, not option A's zero-padded identity). 3x3
convolutions pad one pixel on each side (PyTorch's ``padding=1``, so a stride-2 layer keeps
pixels 0, 2, 4, ... like the 1x1 projection). Convolution kernels use He initialization.
With ``num_classes=10`` and ``norm="group"`` the model has 272,474 parameters (0.27M, the
paper's count; the two projections add 2,752 to the 269,722 of option A).

Normalization (``norm``):

* ``"group"`` (default): GroupNorm (``fedco.models.layers.GroupNorm``, equal to
  ``nn.GroupNorm``) with ``group_count(channels)`` = ``gcd(channels, 8)`` groups, i.e. 8
  groups at 16, 32 and 64 channels (2, 4 and 8 channels per group). Its statistics are
  over one image's pixels and the channels of a group, so an image's output does not
  depend on the batch: the model takes ONE image ``[H, W, C]`` -> ``[num_classes]`` (what
  fedco's per-example problems vmap over) or a batch ``[n, H, W, C]`` -> ``[n,
  num_classes]``, the two agreeing. Its learnable scale and bias have exactly batch norm's
  parameter count, so the 0.27M total is unchanged.
* ``"none"``: no normalization; convolutions carry a bias, and the last convolution of each
  residual branch starts at zero, so every block starts as the identity (the SkipInit/Fixup
  remedy, De & Smith 2020, Zhang et al. 2019, for the variance growth of un-normalized
  residual nets).

Why not BatchNorm: fedco's problems are per-example functions, vmapped over single images,
where batch statistics do not exist (a batch of one would normalize every activation to the
bias); mini-batch statistics would also make an example's loss depend on the other examples
sampled with it. Batch norm is also known to hurt federated training on non-iid clients,
whose batch statistics differ, and GroupNorm recovers most of the loss (Hsieh et al. 2020,
"The Non-IID Data Quagmire of Decentralized Machine Learning").
"""

from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedco import _validate
from fedco.models.cnn import NORMS, group_count, image_batch
from fedco.models.layers import CONV_IMPLS, Conv, GroupNorm

_PAD1 = ((1, 1), (1, 1))


class _BasicBlock(nn.Module):
  """Two 3x3 convolutions and a shortcut (identity, or 1x1 projection on a shape change)."""

  channels: int
  stride: int
  norm: str
  conv_impl: str

  def _norm(self, name: str) -> Callable[[jax.Array], jax.Array]:
    if self.norm == "group":
      return GroupNorm(num_groups=group_count(self.channels), epsilon=1e-5, name=name)
    return lambda h: h

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    bias = self.norm == "none"
    strides = (self.stride, self.stride)
    last_init = nn.initializers.zeros if bias else nn.initializers.he_normal()
    y = Conv(
      self.channels,
      (3, 3),
      strides=strides,
      padding=_PAD1,
      use_bias=bias,
      kernel_init=nn.initializers.he_normal(),
      impl=self.conv_impl,
      name="conv_0",
    )(x)
    y = nn.relu(self._norm("norm_0")(y))
    y = Conv(
      self.channels,
      (3, 3),
      padding=_PAD1,
      use_bias=bias,
      kernel_init=last_init,
      impl=self.conv_impl,
      name="conv_1",
    )(y)
    y = self._norm("norm_1")(y)
    shortcut = x
    if self.stride != 1 or x.shape[-1] != self.channels:
      shortcut = Conv(
        self.channels,
        (1, 1),
        strides=strides,
        padding="VALID",
        use_bias=bias,
        kernel_init=nn.initializers.he_normal(),
        impl=self.conv_impl,
        name="proj_conv",
      )(x)
      shortcut = self._norm("proj_norm")(shortcut)
    return nn.relu(y + shortcut)


class ResNet20(nn.Module):
  """CIFAR ResNet-20 (He et al. 2016) with GroupNorm or no normalization.

  A 3x3 stem convolution, three stages of three basic blocks (``width``, ``2 * width`` and
  ``4 * width`` channels; stages 2 and 3 halve the resolution, with a 1x1 projection
  shortcut), global average pooling and ``Dense(num_classes)``. A basic block is
  ``relu(norm(conv3x3(relu(norm(conv3x3_s(x))))) + shortcut(x))``. ``norm="group"`` uses
  GroupNorm with ``gcd(channels, 8)`` groups, so an image's output does not depend on the
  batch: one image ``[H, W, C]`` -> ``[num_classes]``, a batch ``[n, H, W, C]`` -> ``[n,
  num_classes]``. ``norm="none"`` has no normalization, convolutions with a bias, and the
  last convolution of each residual branch starting at zero (every block starts as the
  identity). 272,474 parameters at the defaults (the paper's 0.27M). Batch norm is not
  offered: per-example problems have no batch statistics (the module ``fedco.models.resnet``
  says more).

  Attributes:
    num_classes: number of logits.
    norm: ``"group"`` (GroupNorm, 8 groups at the default width) or ``"none"``.
    width: channels of stage 1 (16 in the paper); stages 2 and 3 have 2x and 4x.
    conv_impl: ``"auto"`` (default), ``"matmul"`` or ``"xla"``: how convolutions are
      computed (``fedco.models.layers``; the parameters are the same for all three).

  Raises:
    ValueError: if ``num_classes`` or ``width`` is not a positive int, or ``norm`` or
      ``conv_impl`` is not one of its values.

  Examples:
    The parameter count, and the projection shortcut into stage 2 (``jax.eval_shape``
    gives the shapes without computing anything; :func:`init_cnn` makes the parameters):

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> model = fedco.models.ResNet20(num_classes=10)
    >>> image = jnp.zeros((32, 32, 3))
    >>> params = jax.eval_shape(model.init, jax.random.PRNGKey(0), image)
    >>> sum(p.size for p in jax.tree.leaves(params))
    272474
    >>> params["params"]["stage2_block0"]["proj_conv"]["kernel"].shape
    (1, 1, 16, 32)
    >>> jax.eval_shape(model.apply, params, image).shape
    (10,)
  """

  num_classes: int = 10
  norm: str = "group"
  width: int = 16
  conv_impl: str = "auto"

  def __post_init__(self):
    _validate.positive_int("num_classes", self.num_classes)
    _validate.one_of("norm", self.norm, NORMS)
    _validate.positive_int("width", self.width)
    _validate.one_of("conv_impl", self.conv_impl, CONV_IMPLS)
    super().__post_init__()

  @nn.compact
  def __call__(self, x) -> jax.Array:
    x, single = image_batch(x, "ResNet20")
    bias = self.norm == "none"
    x = Conv(
      self.width,
      (3, 3),
      padding=_PAD1,
      use_bias=bias,
      kernel_init=nn.initializers.he_normal(),
      impl=self.conv_impl,
      name="stem_conv",
    )(x)
    if self.norm == "group":
      x = GroupNorm(num_groups=group_count(self.width), epsilon=1e-5, name="stem_norm")(x)
    x = nn.relu(x)
    for stage in range(3):
      for block in range(3):
        stride = 2 if stage > 0 and block == 0 else 1
        x = _BasicBlock(
          self.width * 2**stage,
          stride,
          self.norm,
          self.conv_impl,
          name=f"stage{stage + 1}_block{block}",
        )(x)
    x = jnp.mean(x, axis=(1, 2))
    x = nn.Dense(self.num_classes, name="logits")(x)
    return x[0] if single else x
