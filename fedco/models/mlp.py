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

  ``nn.Dense`` layers (``hidden_0``, ``hidden_1``, ..., ``out``) with ``activation`` after
  every hidden one and none after the last. Takes one example ``[d_in]`` (a scalar is read
  as ``[1]``) -> ``[out]``, or a batch ``[n, d_in]`` -> ``[n, out]``.

  Attributes:
    hidden: widths of the hidden layers (default ``(40, 40)``, paper 003); ``()`` is a
      linear model.
    out: output width (default 1).
    activation: the hidden non-linearity (default ReLU).

  Examples:
    Paper 003's 1-40-40-1 sinusoid regressor on one input and on a batch
    (``jax.eval_shape`` gives the shapes without computing anything; :func:`init_mlp`
    makes the parameters):

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> model = fedco.models.MLP(hidden=(40, 40), out=1)
    >>> params = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros(1))
    >>> jax.eval_shape(model.apply, params, 0.5).shape
    (1,)
    >>> jax.eval_shape(model.apply, params, jnp.zeros((8, 1))).shape
    (8, 1)
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
  """Parameters of ``model`` for inputs with ``in_features`` features.

  ``model.init`` on one example ``zeros([in_features])``, compiled with ``jax.jit``.

  Args:
    model: an :class:`MLP` (or any Flax module taking a vector).
    in_features: the input width ``d_in`` (default 1, the sinusoid's ``x``).
    seed: the seed of the initializers' PRNG key (default ``0``).

  Returns:
    The variables ``{"params": {"hidden_0": {"kernel", "bias"}, ..., "out": ...}}``.

  Examples:
    >>> import jax
    >>> import fedco
    >>> params = fedco.models.init_mlp(fedco.models.MLP(hidden=(40, 40)), in_features=1)
    >>> sum(p.size for p in jax.tree.leaves(params))  # 80 + 1640 + 41
    1761
  """
  return jax.jit(model.init)(jax.random.PRNGKey(seed), jnp.zeros((in_features,), jnp.float32))
