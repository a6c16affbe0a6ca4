"""Client-level KL distributionally robust learning (SPEC 4.1, paper 001 eq. 4-6).

    min_w max_{r in simplex} sum_i r_i f_i(w) - gamma KL(r || 1/n)
        = gamma log(1/n sum_i exp(f_i(w) / gamma)),

with maximiser ``r = softmax(f / gamma)``. ComFedL minimises the monotone transform
``1/n sum_i exp(f_i / gamma)`` (the *exp form*, local-inner: ``g_k`` is client ``k``'s loss and
``f = exp(. / gamma)``). Values and weights are reported through log-sum-exp so they never
overflow, whatever ``f / gamma`` is.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedco.problems import base


def kl_dro_value(losses: jax.Array, gamma: float) -> jax.Array:
  """``gamma log(1/n sum_i exp(l_i / gamma))`` via log-sum-exp (never overflows)."""
  n = losses.shape[-1]
  return gamma * (jax.nn.logsumexp(losses / gamma, axis=-1) - jnp.log(n))


def kl_dro_weights(losses: jax.Array, gamma: float) -> jax.Array:
  """The worst-case client weights ``r = softmax(l / gamma)``."""
  return jax.nn.softmax(losses / gamma, axis=-1)


def log_exp_form_value(losses: jax.Array, gamma: float) -> jax.Array:
  """``log(1/n sum_i exp(l_i / gamma))``: the log of ComFedL's exp-form objective."""
  return kl_dro_value(losses, gamma) / gamma


def client_kl_dro(loss, gamma: float):
  """ComFedL's client-level KL-DRO, the exp form ``1/K sum_k exp(f_k / gamma)`` (local-inner).

  ``g_k(x) = f_k(x)`` is client ``k``'s mean loss and ``f = exp(. / gamma)``, so the
  compositional step is ``exp(f_k/gamma)/gamma * grad f_k`` (SPEC 2.1). The minimiser equals
  that of the log form ``gamma log(1/K sum_k exp(f_k/gamma))`` (a monotone transform); report
  the value with :func:`kl_dro_value` on the per-client losses, which never overflows. The
  exp form's own value and step overflow float32 once ``f_k/gamma`` passes about 88.

  Args:
    loss: per-example loss ``(params, example) -> scalar``.
    gamma: the KL regularisation ``gamma > 0``.
  """
  if not (isinstance(gamma, (int, float)) and gamma > 0):
    raise ValueError(f"gamma must be a number > 0, got {gamma!r}")
  return base.Problem(loss, lambda y: jnp.exp(y / gamma), None, "local", False,
                      "client_kl_dro")
