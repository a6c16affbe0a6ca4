"""Multinomial logistic regression, and per-example classification loss and accuracy."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp


class LogisticRegression(nn.Module):
  """``logits = W vec(x) + b`` for ONE example (any shape; it is flattened).

  fedco problems are per-example functions, so models take one example; ``jax.vmap`` makes
  the batch. Weights start at zero (every class equally likely).
  """
  num_classes: int

  @nn.compact
  def __call__(self, x):
    return nn.Dense(self.num_classes, kernel_init=nn.initializers.zeros)(jnp.reshape(x, (-1,)))


def init_params(model: nn.Module, example_x, seed: int = 0):
  """Parameters for one example's input shape."""
  return model.init(jax.random.PRNGKey(seed), jnp.asarray(example_x))


def cross_entropy(logits: jax.Array, label: jax.Array) -> jax.Array:
  """``logsumexp(logits) - logits[label]`` for one example."""
  return jax.nn.logsumexp(logits) - jnp.take(logits, label)


def accuracy(logits: jax.Array, label: jax.Array) -> jax.Array:
  return (jnp.argmax(logits) == label).astype(jnp.float32)
