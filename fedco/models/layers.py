"""Convolution and pooling that stay fast inside fedco's compiled, vmapped loops.

fedco's simulator runs every local step inside ``lax.scan`` (an XLA ``while`` loop). On
XLA:CPU the convolutions of a gradient inside a ``while`` body keep non-canonical dimension
labels and run on a slow generic path, about 10x slower than the same step outside a loop
(jax-ml/jax#12868, open), and vmapping a convolution over the clients' weights turns it into
a grouped convolution, slower again. ``nn.max_pool``'s gradient (a select-and-scatter) is
another 9x on the CPU. ``benchmarks/torch_conv.py`` measured CNN4 FedAvg at 0.036x a
PyTorch loop this way.

The ``"matmul"`` implementation here avoids all three. A convolution is written as im2col:
the ``kh * kw`` shifted (and strided) windows of the padded input are concatenated on the
channel axis and multiplied by the kernel reshaped to ``[kh * kw * C_in, C_out]``:

    y[n, i, j, :] = sum_{a, b, c} xpad[n, s_h i + a, s_w j + b, c] kernel[a, b, c, :]
                  = concat_{a, b}(window_{a, b}(xpad))[n, i, j, :] @ kernel.reshape(-1, C_out)

so the model holds no convolution at all: its derivatives of every order are pads, slices,
concatenations and matrix products, and vmapping over client weights gives batched matrix
products. The 2x2 max-pool is a reshape and a ``max`` over the window axes. The results equal
``lax.conv_general_dilated`` / ``nn.max_pool`` up to float summation order; the one
difference is at an exact tie inside a pooling window, where ``jnp.max`` shares the gradient
among the tied inputs and ``nn.max_pool`` gives it to one.

:class:`GroupNorm` is ``nn.GroupNorm`` (same parameters, same fast-variance statistics)
computed as per-channel moments first: ``E[x]`` and ``E[x^2]`` per image and channel (one
pass over the activations, reducing over the pixels with the channels contiguous), then the
small ``[n, C]`` moments are pooled per group, and the output is one fused multiply-add
``x * a + b`` with ``a = scale / sqrt(var + eps)`` and ``b = bias - mean * a`` per image and
channel. Its gradient reduces ``dy`` and ``dy * x`` the same way. On the CPU this takes
about 10-15% off a CNN4 FedAvg round against ``nn.GroupNorm``, which reduces over the
(pixels, channels-of-a-group) axes of a reshaped tensor.

``"xla"`` is ``lax.conv_general_dilated`` and ``nn.max_pool`` (cuDNN on a GPU), and
``"auto"`` (the models' default) picks ``"matmul"`` when JAX's default backend is the CPU or a
GPU and ``"xla"`` otherwise (a TPU: not measured). On a GPU too, fedco's per-client vmapped
convolutions run faster as matrix products: a cross-device FedAvg round (50 clients, 5 local
steps of batch 10) took 5.2 ms with ``"matmul"`` and 23.3 ms with ``"xla"`` for CNN4, 48 and
179 ms for ResNet20, on an NVIDIA H200 (``benchmarks/accelerator.py``, decision 87). Parameters are the same for every implementation (``kernel`` is HWIO
as in ``nn.Conv``, same initializer), so a checkpoint moves between them.
"""

from __future__ import annotations

import numbers
from typing import Callable, Sequence, Tuple, Union

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fedco import _validate

CONV_IMPLS = ("auto", "matmul", "xla")
_DIMS = ("NHWC", "HWIO", "NHWC")

Padding = Union[str, Sequence[Tuple[int, int]]]


def resolve_impl(impl: str) -> str:
  """``"matmul"`` or ``"xla"`` for ``impl`` (``"auto"``: matmul on a CPU or GPU backend)."""
  _validate.one_of("conv_impl", impl, CONV_IMPLS)
  if impl == "auto":
    return "matmul" if jax.default_backend() in ("cpu", "gpu") else "xla"
  return impl


def _pairs(name: str, value, rank: int = 2) -> Tuple[int, ...]:
  try:
    value = (value,) * rank if isinstance(value, numbers.Integral) else tuple(value)
  except TypeError:
    raise ValueError(
      f"{name} must be a positive int or {rank} positive ints, got {value!r}"
    ) from None
  if len(value) != rank or any(
    isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral) or v < 1 for v in value
  ):
    raise ValueError(f"{name} must be a positive int or {rank} positive ints, got {value!r}")
  return tuple(int(v) for v in value)


def conv2d(
  x: jax.Array, kernel: jax.Array, strides=(1, 1), padding: Padding = "SAME", impl: str = "auto"
) -> jax.Array:
  """2-D convolution, NHWC input ``[n, H, W, C_in]`` and HWIO kernel ``[kh, kw, C_in, C_out]``.

  Equals ``lax.conv_general_dilated(x, kernel, strides, padding, dimension_numbers=("NHWC",
  "HWIO", "NHWC"))``; ``padding`` is ``"SAME"``, ``"VALID"`` or explicit ``((lo, hi), (lo,
  hi))``. ``impl`` is one of :data:`CONV_IMPLS` (see the module docstring).
  """
  impl = resolve_impl(impl)
  strides = _pairs("strides", strides)
  if x.ndim != 4 or kernel.ndim != 4 or x.shape[-1] != kernel.shape[2]:
    raise ValueError(
      f"conv2d takes x [n, H, W, C] and kernel [kh, kw, C, C_out] with the same "
      f"C, got x {tuple(x.shape)} and kernel {tuple(kernel.shape)}"
    )
  if impl == "xla":
    return jax.lax.conv_general_dilated(x, kernel, strides, padding, dimension_numbers=_DIMS)
  n, h, w, c = x.shape
  kh, kw, _, out = kernel.shape
  pads: Sequence[Tuple[int, ...]]
  if isinstance(padding, str):
    pads = jax.lax.padtype_to_pads((h, w), (kh, kw), strides, padding)
  else:
    pads = [tuple(int(v) for v in p) for p in padding]
  xp = jnp.pad(x, ((0, 0), tuple(pads[0]), tuple(pads[1]), (0, 0)))
  sh, sw = strides
  ho = (xp.shape[1] - kh) // sh + 1
  wo = (xp.shape[2] - kw) // sw + 1
  if ho < 1 or wo < 1:
    raise ValueError(
      f"conv2d: kernel {kh}x{kw} does not fit the padded input {xp.shape[1]}x{xp.shape[2]}"
    )
  windows = [
    xp[:, a : a + sh * (ho - 1) + 1 : sh, b : b + sw * (wo - 1) + 1 : sw]
    for a in range(kh)
    for b in range(kw)
  ]
  cols = windows[0] if len(windows) == 1 else jnp.concatenate(windows, axis=-1)
  y = cols.reshape(n * ho * wo, kh * kw * c) @ kernel.reshape(kh * kw * c, out)
  return y.reshape(n, ho, wo, out)


def max_pool_2x2(x: jax.Array, impl: str = "auto") -> jax.Array:
  """2x2 max-pool with stride 2 and VALID padding on NHWC ``x`` (an odd last row or column is
  dropped), as ``nn.max_pool(x, (2, 2), strides=(2, 2), padding="VALID")``."""
  if resolve_impl(impl) == "xla":
    return nn.max_pool(x, (2, 2), strides=(2, 2), padding="VALID")
  n, h, w, c = x.shape
  x = x[:, : h // 2 * 2, : w // 2 * 2]
  return x.reshape(n, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))


class Conv(nn.Module):
  """A drop-in for ``nn.Conv`` on NHWC images with a choice of implementation.

  Same parameters as ``nn.Conv`` (``kernel`` HWIO, ``bias`` when ``use_bias``) and the same
  default initializers (LeCun normal, zeros), so ``init`` with the same key gives the same
  values. ``impl``: ``"auto"``, ``"matmul"`` (im2col, fast in vmapped loops) or
  ``"xla"`` (``lax.conv_general_dilated``).
  """

  features: int
  kernel_size: Tuple[int, int] = (3, 3)
  strides: Tuple[int, int] = (1, 1)
  padding: Padding = "SAME"
  use_bias: bool = True
  kernel_init: Callable = nn.initializers.lecun_normal()
  bias_init: Callable = nn.initializers.zeros
  impl: str = "auto"

  def __post_init__(self):
    _validate.positive_int("features", self.features)
    _pairs("kernel_size", self.kernel_size)
    _pairs("strides", self.strides)
    _validate.one_of("conv_impl", self.impl, CONV_IMPLS)
    super().__post_init__()

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    kh, kw = _pairs("kernel_size", self.kernel_size)
    kernel = self.param(
      "kernel", self.kernel_init, (kh, kw, x.shape[-1], self.features), jnp.float32
    )
    dtype = jnp.promote_types(x.dtype, kernel.dtype)  # as nn.Conv with dtype=None
    y = conv2d(x.astype(dtype), kernel.astype(dtype), self.strides, self.padding, self.impl)
    if self.use_bias:
      y = y + self.param("bias", self.bias_init, (self.features,), jnp.float32).astype(dtype)
    return y


class GroupNorm(nn.Module):
  """``nn.GroupNorm`` for ``[n, ..., C]`` inputs, computed from per-channel moments.

  ``y = scale * (x - mean_g) / sqrt(var_g + epsilon) + bias`` where ``mean_g`` and ``var_g``
  are over one example's (first axis) pixels and the ``C / num_groups`` channels of the
  group, ``var_g = max(E[x^2] - E[x]^2, 0)`` (``nn.GroupNorm``'s default fast variance).
  Parameters ``scale`` (ones) and ``bias`` (zeros), shape ``[C]``, as in ``nn.GroupNorm``.
  """

  num_groups: int = 32
  epsilon: float = 1e-6

  def __post_init__(self):
    _validate.positive_int("num_groups", self.num_groups)
    _validate.positive("epsilon", self.epsilon)
    super().__post_init__()

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    c, g = x.shape[-1], self.num_groups
    if x.ndim < 2 or c % g:
      raise ValueError(
        f"GroupNorm takes [n, ..., C] with C divisible by num_groups={g}, got "
        f"shape {tuple(x.shape)}"
      )
    scale = self.param("scale", nn.initializers.ones, (c,), jnp.float32)
    bias = self.param("bias", nn.initializers.zeros, (c,), jnp.float32)
    dtype = jnp.promote_types(x.dtype, scale.dtype)
    x = x.astype(dtype)
    axes = tuple(range(1, x.ndim - 1))
    lead = (x.shape[0],)
    # per (example, channel) moments, then pooled over the channels of each group
    m1 = jnp.mean(x, axis=axes).reshape(lead + (g, c // g)).mean(-1)
    m2 = jnp.mean(jnp.square(x), axis=axes).reshape(lead + (g, c // g)).mean(-1)
    inv = jax.lax.rsqrt(jnp.maximum(m2 - jnp.square(m1), 0.0) + self.epsilon)
    a = jnp.repeat(inv, c // g, axis=-1) * scale.astype(dtype)
    b = bias.astype(dtype) - jnp.repeat(m1, c // g, axis=-1) * a
    shape = lead + (1,) * len(axes) + (c,)
    return x * a.reshape(shape) + b.reshape(shape)
