"""A multilayer perceptron for regression (the sinusoid model of paper 003, Sec. 5.1).

``MLP(hidden=(40, 40), out=1)`` is the paper's 1-40-40-1 ReLU network. It takes ONE input
example (shape ``[d_in]``, or a scalar, read as ``[1]``) and returns ``[out]``; a batch
``[n, d_in]`` returns ``[n, out]`` (``nn.Dense`` acts on the last axis). fedco problems are
per-example functions, so either form works under ``jax.vmap``.
"""

from __future__ import annotations

from typing import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp


class MLP(nn.Module):
  """Fully connected network ``d_in -> hidden[0] -> ... -> hidden[-1] -> out``.

  Attributes:
    hidden: widths of the hidden layers (paper 003: ``(40, 40)``); ``()`` is a linear model.
    out: output width.
    activation: the hidden non-linearity (default ReLU).
  """

  hidden: Sequence[int] = (40, 40)
  out: int = 1
  activation: Callable[[jax.Array], jax.Array] = nn.relu

  @nn.compact
  def __call__(self, x):
    x = jnp.asarray(x)
    if x.ndim == 0:
      x = x[None]
    for i, width in enumerate(self.hidden):
      x = self.activation(nn.Dense(int(width), name=f"hidden_{i}")(x))
    return nn.Dense(int(self.out), name="out")(x)


def init_mlp(model: MLP, in_features: int = 1, seed: int = 0):
  """Parameters of ``model`` for inputs with ``in_features`` features."""
  return jax.jit(model.init)(jax.random.PRNGKey(seed), jnp.zeros((in_features,), jnp.float32))
