"""Multinomial logistic regression, and per-example classification loss and accuracy."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedco import _labels


class LogisticRegression(nn.Module):
  """``logits = W vec(x) + b`` for ONE example (any shape; it is flattened).

  fedco problems are per-example functions, so models take one example; ``jax.vmap`` makes
  the batch. Weights start at zero (every class equally likely).

  The parameters are ``{"kernel": [num_classes, d], "bias": [num_classes]}``: the weight is
  stored output-major, as PyTorch's ``nn.Linear`` stores it, not input-major as
  ``nn.Dense`` does. The values are the same; the layout is for speed. With the weight's
  long input axis last, XLA:CPU computes the batched weight gradient ``dL/dW = g^T x``
  straight into the parameter's layout; with ``[d, num_classes]`` it runs a transposed
  contraction that is about 1.8x slower, and a whole federated round of the E1 workload is
  1.35-1.56x slower (``benchmarks/README.md``, "Weight layout").

  Non-float inputs are cast to float32; the parameters are float32.

  Attributes:
    num_classes: the number of classes ``C`` (logits).

  Examples:
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> model = fedco.models.LogisticRegression(num_classes=3)
    >>> params = fedco.models.init_params(model, jnp.zeros((2, 2)))  # 2x2 inputs, flattened
    >>> params["params"]["kernel"].shape, params["params"]["bias"].shape
    ((3, 4), (3,))
    >>> model.apply(params, jnp.ones((2, 2))).tolist()  # zero weights: equal logits
    [0.0, 0.0, 0.0]
  """

  num_classes: int

  @nn.compact
  def __call__(self, x):
    x = jnp.reshape(x, (-1,))
    if not jnp.issubdtype(x.dtype, jnp.floating):
      x = x.astype(jnp.float32)
    kernel = self.param(
      "kernel", nn.initializers.zeros, (self.num_classes, x.shape[0]), jnp.float32
    )
    bias = self.param("bias", nn.initializers.zeros, (self.num_classes,), jnp.float32)
    return kernel @ x + bias


def init_params(model: nn.Module, example_x, seed: int = 0):
  """Parameters of ``model`` for one example's input.

  ``model.init`` on ``example_x`` (not compiled; cheap for the linear model).

  Args:
    model: a Flax module taking one example, e.g. :class:`LogisticRegression`.
    example_x: one example's input (its shape and dtype are what matter).
    seed: the seed of the initializers' PRNG key (default ``0``).

  Returns:
    The variables ``{"params": ...}`` as ``model.init`` returns them.

  Examples:
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> model = fedco.models.LogisticRegression(num_classes=10)
    >>> params = fedco.models.init_params(model, jnp.zeros((28, 28)))
    >>> params["params"]["kernel"].shape
    (10, 784)
  """
  return model.init(jax.random.PRNGKey(seed), jnp.asarray(example_x))


def cross_entropy(logits: jax.Array, label: jax.Array) -> jax.Array:
  r"""The cross-entropy loss of one example, ``logsumexp(logits) - logits[label]``.

  .. math::

    \ell(z, y) = \log \sum_{c=0}^{C-1} e^{z_c} - z_y

  for logits :math:`z \in \mathbb R^C` and an integer class :math:`y \in [0, C)`.

  A label outside ``[0, C)`` never stands for another class (NumPy's ``logits[-1]`` would be
  class ``C - 1``): a concrete one is a ``ValueError``, a traced one gives NaN, which a
  simulation's finite checks stop at. While a simulation checks its params, and in
  ``fedco.metrics.per_client_mean``, a traced label read straight from the data's examples
  (``example["y"]``) is checked against the data's values: a ``ValueError`` before the run.
  :func:`accuracy` treats labels the same way.

  Args:
    logits: one example's logits, ``[C]``.
    label: its class, an integer scalar in ``[0, C)``.

  Returns:
    The loss, a float scalar (NaN for a traced label outside ``[0, C)``).

  Raises:
    ValueError: if a concrete ``label`` is not a class index in ``[0, C)``.

  Examples:
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> print(round(float(fedco.models.cross_entropy(jnp.zeros(3), 1)), 4))  # log 3
    1.0986
    >>> logits = jnp.array([2.0, 0.0, 0.0])
    >>> [round(float(fedco.models.cross_entropy(logits, y)), 4) for y in (0, 1)]
    [0.2395, 2.2395]
  """
  logits = jnp.asarray(logits)
  classes = logits.shape[-1]
  _labels.check(label, classes, "cross_entropy")
  label = jnp.asarray(label)
  valid = (label >= 0) & (label < classes)
  loss = jax.nn.logsumexp(logits) - jnp.take(logits, jnp.clip(label, 0, classes - 1))
  return jnp.where(valid, loss, jnp.nan)


def accuracy(logits: jax.Array, label: jax.Array) -> jax.Array:
  """``1.0`` if ``argmax(logits) == label`` else ``0.0``, for one example (``logits [C]``).

  Its mean over a batch (``jax.vmap``) is the batch's accuracy. Labels outside ``[0, C)``
  are refused (concrete) or give NaN (traced), as in :func:`cross_entropy`.

  Args:
    logits: one example's logits, ``[C]``.
    label: its class, an integer scalar in ``[0, C)``.

  Returns:
    A float32 scalar: ``1.0`` or ``0.0`` (NaN for a traced label outside ``[0, C)``).

  Raises:
    ValueError: if a concrete ``label`` is not a class index in ``[0, C)``.

  Examples:
    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> logits = jnp.array([[2.0, 0.0], [0.0, 2.0], [1.0, 3.0]])
    >>> hits = jax.vmap(fedco.models.accuracy)(logits, jnp.array([0, 0, 1]))
    >>> hits.tolist(), float(hits.mean())
    ([1.0, 0.0, 1.0], 0.6666666865348816)
  """
  logits = jnp.asarray(logits)
  classes = logits.shape[-1]
  _labels.check(label, classes, "accuracy")
  label = jnp.asarray(label)
  valid = (label >= 0) & (label < classes)
  return jnp.where(valid, (jnp.argmax(logits) == label).astype(jnp.float32), jnp.nan)
