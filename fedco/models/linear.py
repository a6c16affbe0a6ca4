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
  """Parameters for one example's input shape."""
  return model.init(jax.random.PRNGKey(seed), jnp.asarray(example_x))


def cross_entropy(logits: jax.Array, label: jax.Array) -> jax.Array:
  """``logsumexp(logits) - logits[label]`` for one example: ``logits [C]``, ``label`` an
  integer class in ``[0, C)``.

  A label outside ``[0, C)`` never stands for another class (NumPy's ``logits[-1]`` would be
  class ``C - 1``): a concrete one is a ``ValueError``, a traced one gives NaN, which a
  simulation's finite checks stop at. While a simulation checks its params, and in
  ``fedco.metrics.per_client_mean``, a traced label read straight from the data's examples
  (``example["y"]``) is checked against the data's values: a ``ValueError`` before the run.
  :func:`accuracy` treats labels the same way.
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

  Labels outside ``[0, C)`` are refused (concrete) or give NaN (traced), as in
  :func:`cross_entropy`.
  """
  logits = jnp.asarray(logits)
  classes = logits.shape[-1]
  _labels.check(label, classes, "accuracy")
  label = jnp.asarray(label)
  valid = (label >= 0) & (label < classes)
  return jnp.where(valid, (jnp.argmax(logits) == label).astype(jnp.float32), jnp.nan)
