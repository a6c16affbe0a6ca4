"""Four-block convolutional networks: ``CNN4`` (CIFAR-10, paper 001) and ``OmniglotCNN``;
and ``EmnistCNN``, the two-convolution EMNIST network of Reddi et al. 2021 (its own layout,
see its docstring).

``CNN4`` and ``OmniglotCNN`` follow the "Conv-4" layout of MAML (Finn et al. 2017, Sec. 5.2), which paper 001
(Sec. 5.2, "a 4-layer CNN used in [7]", [7] = MAML) and paper 003 (Sec. 5.2, Omniglot) use.
Neither paper describes the network beyond that, so the layout is MAML's: four blocks of

    conv 3x3 (``filters`` channels, stride 1, SAME padding) -> normalization -> ReLU
    -> 2x2 max-pool (stride 2, VALID, as in MAML's reference code)

then a flatten and one ``Dense`` to the logits. A 32x32 CIFAR image shrinks to 2x2 (128
features with 32 filters); a 28x28 Omniglot image to 1x1 (64 features).

Convolutions and pools go through ``fedco.models.layers`` (``conv_impl``): on a CPU or GPU
an im2col matrix-product form that stays fast inside the simulator's vmapped ``lax.scan``
loops, on other backends ``lax.conv_general_dilated``; the parameters are ``nn.Conv``'s
either way.

The two models differ only in the normalization, because they serve different problems:

* ``CNN4`` is for per-example problems (paper 001's DRO and DA-MAML on CIFAR-10): fedco
  vmaps the model over SINGLE images, so it must not use batch statistics. It uses
  GroupNorm (``fedco.models.layers.GroupNorm``: ``nn.GroupNorm``'s parameters and values,
  computed from per-channel moments) with ``group_count(filters)`` groups (8 groups of 4
  channels at the default ``filters=32``): statistics over one image's (H, W,
  channels-of-the-group), so the output for an image does not depend on the rest of the
  batch, and its learnable scale and bias cost the same ``2 * filters`` parameters per
  block as batch norm's. GroupNorm (Wu & He 2018) is the usual batch-free replacement;
  LayerNorm is its one-group case and does worse on convolutional nets. ``norm="none"``
  drops normalization (convolutions then carry a bias). ``filters=32`` is MAML's
  MiniImagenet width (64 is its Omniglot width).
* ``OmniglotCNN`` is for MAML on Omniglot (paper 003), where the "example" is a whole task
  and the model sees the task's images together. It is MAML's network exactly: 64 filters
  and batch normalization with the statistics of the batch it is called on, ALWAYS,
  training and evaluation alike, as MAML's reference code does (``tf.contrib.layers.
  batch_norm`` with no moving averages used: "batch statistics per task"). ``TaskBatchNorm``
  implements it without running averages, so ``model.apply(params, x)`` is a pure function
  of ``(params, x)`` (no mutable ``batch_stats`` collection; ``jax.grad`` and second-order
  MAML differentiate through the statistics). Convolutions carry no bias: batch norm
  subtracts the per-channel mean, so a bias would be a parameter with zero gradient.

Shapes: ``CNN4`` takes one image ``[H, W, C]`` -> ``[num_classes]`` or a batch
``[n, H, W, C]`` -> ``[n, num_classes]`` (each image independently). ``OmniglotCNN`` takes
one task's images ``[n, 28, 28, 1]`` -> ``[n, num_classes]`` (normalized together); a single
image ``[28, 28, 1]`` is a task of one and returns ``[num_classes]``, like the other models.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedco import _validate
from fedco.models.layers import CONV_IMPLS, Conv, GroupNorm, max_pool_2x2

NORMS = ("group", "none")
MAX_GROUPS = 8  # GroupNorm groups: gcd(channels, 8), i.e. 8 for any multiple of 8 channels


def group_count(channels: int) -> int:
  """GroupNorm's number of groups for ``channels``: ``gcd(channels, 8)`` (it divides them)."""
  return math.gcd(int(channels), MAX_GROUPS)


def _as_float(x) -> jax.Array:
  x = jnp.asarray(x)
  return x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.float32)


def image_batch(x, name: str) -> tuple[jax.Array, bool]:
  """``x`` as ``[n, H, W, C]``, and whether it was one image ``[H, W, C]``."""
  x = _as_float(x)
  if x.ndim == 3:
    return x[None], True
  if x.ndim == 4:
    return x, False
  raise ValueError(
    f"{name} takes one image [H, W, C] or a batch [n, H, W, C], got shape {tuple(x.shape)}"
  )


class TaskBatchNorm(nn.Module):
  """Batch normalization with the statistics of the current batch, always.

  ``y = scale * (x - mean) / sqrt(var + eps) + bias``, with ``mean`` and the biased ``var``
  per channel (last axis) over ALL other axes of ``x`` (for ``[n, H, W, C]``: the ``n``
  images and their pixels). There are no running averages: training and evaluation both use
  the batch's own statistics (MAML's "batch statistics per task"), so the module is pure.

  Parameters ``scale`` (ones) and ``bias`` (zeros), shape ``[C]``.

  Attributes:
    epsilon: added to the variance, ``> 0`` (default ``1e-5``, as in PyTorch and MAML's
      TensorFlow code).

  Examples:
    Each channel of a batch of three comes out with mean 0 and standard deviation 1:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> norm = fedco.models.TaskBatchNorm()
    >>> x = jnp.array([[1.0, 10.0], [2.0, 20.0], [3.0, 60.0]])  # [n=3, C=2]
    >>> params = norm.init(jax.random.PRNGKey(0), x)
    >>> y = norm.apply(params, x)
    >>> [round(float(v), 4) for v in y.mean(0)], [round(float(v), 3) for v in y.std(0)]
    ([0.0, 0.0], [1.0, 1.0])
  """

  epsilon: float = 1e-5

  def __post_init__(self):
    _validate.positive("epsilon", self.epsilon)
    super().__post_init__()

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    x = _as_float(x)
    features = x.shape[-1]
    scale = self.param("scale", nn.initializers.ones, (features,), x.dtype)
    bias = self.param("bias", nn.initializers.zeros, (features,), x.dtype)
    axes = tuple(range(x.ndim - 1))
    mean = jnp.mean(x, axis=axes)
    var = jnp.mean(jnp.square(x - mean), axis=axes)
    return (x - mean) * jax.lax.rsqrt(var + self.epsilon) * scale + bias


def _conv_block(
  x: jax.Array,
  filters: int,
  norm: Callable[[Any], Any],
  use_bias: bool,
  index: int,
  impl: str,
) -> jax.Array:
  x = Conv(filters, (3, 3), padding="SAME", use_bias=use_bias, impl=impl, name=f"conv_{index}")(x)
  x = nn.relu(norm(x))
  return max_pool_2x2(x, impl)


class CNN4(nn.Module):
  """MAML's Conv-4 with per-example GroupNorm, for CIFAR-10 (paper 001, Sec. 5.2).

  Four blocks of [conv 3x3 with ``filters`` channels, GroupNorm (``group_count(filters)``
  groups) or nothing, ReLU, 2x2 max-pool], flatten, ``Dense(num_classes)``. No batch
  statistics: one image ``[H, W, C]`` gives ``[num_classes]`` and a batch ``[n, H, W, C]``
  gives ``[n, num_classes]``, equal to vmapping over its images. ``H`` and ``W`` must be at
  least 16 (four halvings). At the defaults on CIFAR-10: 30,058 parameters with GroupNorm.

  Attributes:
    num_classes: number of logits.
    filters: channels of every convolution (MAML: 32 on MiniImagenet, 64 on Omniglot).
    norm: ``"group"`` (GroupNorm) or ``"none"`` (no normalization; convolutions with bias).
    conv_impl: ``"auto"`` (default), ``"matmul"`` or ``"xla"``: how convolutions and pools
      are computed (``fedco.models.layers``; the parameters are the same for all three).

  Raises:
    ValueError: if ``num_classes`` or ``filters`` is not a positive int, or ``norm`` or
      ``conv_impl`` is not one of its values.

  Examples:
    Parameter count and output shapes on CIFAR-10 images (``jax.eval_shape`` gives the
    shapes without computing anything; :func:`init_cnn` makes the parameters):

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> model = fedco.models.CNN4(num_classes=10)
    >>> image = jnp.zeros((32, 32, 3))
    >>> params = jax.eval_shape(model.init, jax.random.PRNGKey(0), image)
    >>> sum(p.size for p in jax.tree.leaves(params))
    30058
    >>> jax.eval_shape(model.apply, params, image).shape  # one image
    (10,)
    >>> jax.eval_shape(model.apply, params, jnp.zeros((8, 32, 32, 3))).shape  # a batch
    (8, 10)
  """

  num_classes: int = 10
  filters: int = 32
  norm: str = "group"
  conv_impl: str = "auto"

  def __post_init__(self):
    _validate.positive_int("num_classes", self.num_classes)
    _validate.positive_int("filters", self.filters)
    _validate.one_of("norm", self.norm, NORMS)
    _validate.one_of("conv_impl", self.conv_impl, CONV_IMPLS)
    super().__post_init__()

  @nn.compact
  def __call__(self, x) -> jax.Array:
    x, single = image_batch(x, "CNN4")
    for i in range(4):
      norm: Callable[[Any], Any]
      if self.norm == "group":
        norm = GroupNorm(num_groups=group_count(self.filters), epsilon=1e-5, name=f"norm_{i}")
      else:
        norm = lambda h: h
      x = _conv_block(x, self.filters, norm, self.norm == "none", i, self.conv_impl)
    x = nn.Dense(self.num_classes, name="logits")(x.reshape((x.shape[0], -1)))
    return x[0] if single else x


class OmniglotCNN(nn.Module):
  """MAML's Omniglot network (Finn et al. 2017; paper 003, Sec. 5.2) with task batch norm.

  Four blocks of [conv 3x3 with ``filters`` channels (no bias), ``TaskBatchNorm``, ReLU,
  2x2 max-pool], flatten, ``Dense(num_classes)``. Takes ONE task's images ``[n, 28, 28, 1]``
  and returns ``[n, num_classes]``; batch norm uses that batch's statistics (also at
  evaluation), so an image's logits depend on the other images of its task, never on other
  tasks (``jax.vmap`` over a leading task axis keeps tasks apart). ``[28, 28, 1]`` is a task
  of one image and returns ``[num_classes]``. 112,005 parameters at the defaults.

  Attributes:
    num_classes: ways N of N-way classification (5 in paper 003).
    filters: channels of every convolution (64, MAML's Omniglot width).
    conv_impl: ``"auto"`` (default), ``"matmul"`` or ``"xla"`` (as in ``CNN4``).

  Raises:
    ValueError: if ``num_classes`` or ``filters`` is not a positive int, or ``conv_impl``
      is not one of its values.

  Examples:
    A 5-way task of 5 images (``jax.eval_shape`` gives the shapes without computing
    anything; :func:`init_cnn` makes the parameters):

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> model = fedco.models.OmniglotCNN(num_classes=5)
    >>> task = jnp.zeros((5, 28, 28, 1))
    >>> params = jax.eval_shape(model.init, jax.random.PRNGKey(0), task)
    >>> sum(p.size for p in jax.tree.leaves(params))
    112005
    >>> jax.eval_shape(model.apply, params, task).shape
    (5, 5)
    >>> jax.eval_shape(model.apply, params, jnp.zeros((28, 28, 1))).shape  # a task of one
    (5,)
  """

  num_classes: int = 5
  filters: int = 64
  conv_impl: str = "auto"

  def __post_init__(self):
    _validate.positive_int("num_classes", self.num_classes)
    _validate.positive_int("filters", self.filters)
    _validate.one_of("conv_impl", self.conv_impl, CONV_IMPLS)
    super().__post_init__()

  @nn.compact
  def __call__(self, x) -> jax.Array:
    x, single = image_batch(x, "OmniglotCNN")
    for i in range(4):
      x = _conv_block(x, self.filters, TaskBatchNorm(name=f"norm_{i}"), False, i, self.conv_impl)
    x = nn.Dense(self.num_classes, name="logits")(x.reshape((x.shape[0], -1)))
    return x[0] if single else x


class EmnistCNN(nn.Module):
  """The EMNIST CNN of Reddi et al. 2021 ("Adaptive Federated Optimization", App. C).

  conv 3x3 32 (VALID) -> ReLU -> conv 3x3 64 (VALID) -> ReLU -> 2x2 max-pool -> dropout
  0.25 -> flatten -> ``Dense(128)`` -> ReLU -> dropout 0.5 -> ``Dense(num_classes)``, as
  TFF's ``create_conv_dropout_model`` and FedJAX's ``emnist.create_conv_model`` build it.
  A 28x28 image shrinks to 26, 24 and 12 pixels (9,216 features). 1,206,590 parameters at
  the defaults (62 classes), the published count; 1,199,882 with ``num_classes=10``.

  One image ``[28, 28, 1]`` gives ``[num_classes]``; a batch ``[n, 28, 28, 1]`` gives
  ``[n, num_classes]``, each image on its own. No batch statistics.

  Dropout: with ``deterministic=True`` (the default) it is the identity, and the model is
  a pure function of ``(params, x)``. fedco's problems and simulator pass no random key to
  a model, so that is how they train it: without dropout (decision 100). With
  ``deterministic=False``, ``apply`` needs ``rngs={"dropout": key}``; under ``jax.vmap``
  over single images give each image its own key (one key gives every image the same mask).

  Attributes:
    num_classes: logits (62: digits and both cases; 10: digits only).
    deterministic: ``True`` (default): no dropout; ``False``: dropout, with a ``"dropout"`` rng.
    conv_impl: ``"auto"`` (default), ``"matmul"`` or ``"xla"`` (as in ``CNN4``).

  Raises:
    ValueError: if ``num_classes`` is not a positive int, ``deterministic`` not a bool, or
      ``conv_impl`` not one of its values.

  Examples:
    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> model = fedco.models.EmnistCNN()
    >>> image = jnp.zeros((28, 28, 1))
    >>> params = jax.eval_shape(model.init, jax.random.PRNGKey(0), image)
    >>> sum(p.size for p in jax.tree.leaves(params))
    1206590
    >>> jax.eval_shape(model.apply, params, image).shape
    (62,)
  """

  num_classes: int = 62
  deterministic: bool = True
  conv_impl: str = "auto"

  def __post_init__(self):
    _validate.positive_int("num_classes", self.num_classes)
    if not isinstance(self.deterministic, bool):
      raise ValueError(f"deterministic must be True or False, got {self.deterministic!r}")
    _validate.one_of("conv_impl", self.conv_impl, CONV_IMPLS)
    super().__post_init__()

  @nn.compact
  def __call__(self, x) -> jax.Array:
    x, single = image_batch(x, "EmnistCNN")
    impl = self.conv_impl
    x = nn.relu(Conv(32, (3, 3), padding="VALID", impl=impl, name="conv_0")(x))
    x = nn.relu(Conv(64, (3, 3), padding="VALID", impl=impl, name="conv_1")(x))
    x = max_pool_2x2(x, impl)
    x = nn.Dropout(0.25, deterministic=self.deterministic)(x)
    x = nn.relu(nn.Dense(128, name="hidden")(x.reshape((x.shape[0], -1))))
    x = nn.Dropout(0.5, deterministic=self.deterministic)(x)
    x = nn.Dense(self.num_classes, name="logits")(x)
    return x[0] if single else x


def init_cnn(model: nn.Module, input_shape: Sequence[int], seed: int = 0):
  """Parameters of ``model`` (``CNN4``, ``OmniglotCNN``, ``ResNet20``, ``EmnistCNN``) for an input.

  ``model.init`` on zeros of ``input_shape``, compiled with ``jax.jit``. ``input_shape`` is
  one image's ``(H, W, C)`` or a batch's ``(n, H, W, C)``; the parameters do not depend on
  ``n``.

  Args:
    model: a Flax module taking images, e.g. :class:`CNN4`, :class:`OmniglotCNN` or
      :class:`ResNet20`.
    input_shape: a tuple of positive ints, ``(H, W, C)`` or ``(n, H, W, C)``.
    seed: the seed of the initializers' PRNG key (default ``0``).

  Returns:
    The variables ``{"params": {layer: {"kernel": ..., ...}}}`` as ``model.init`` returns
    them.

  Raises:
    ValueError: if ``input_shape`` is not a non-empty tuple of positive ints.

  Examples:
    ``params = init_cnn(model, (32, 32, 3))`` makes the parameters of a CIFAR-10 model; here
    ``jax.eval_shape`` only traces the call, to show their shapes without compiling:

    >>> import jax
    >>> import fedco
    >>> model = fedco.models.CNN4(num_classes=10)
    >>> params = jax.eval_shape(lambda: fedco.models.init_cnn(model, (32, 32, 3), seed=1))
    >>> params["params"]["conv_0"]["kernel"].shape  # 3x3, 3 channels in, 32 out
    (3, 3, 3, 32)
    >>> params["params"]["logits"]["kernel"].shape  # 2x2 pixels x 32 channels after pooling
    (128, 10)
  """
  shape = tuple(input_shape)
  bad = lambda d: isinstance(d, bool) or not isinstance(d, numbers.Integral) or d < 1
  if not shape or any(bad(d) for d in shape):
    raise ValueError(f"input_shape must be a tuple of positive ints, got {input_shape!r}")
  shape = tuple(int(d) for d in shape)
  return jax.jit(model.init)(jax.random.PRNGKey(seed), jnp.zeros(shape, jnp.float32))
