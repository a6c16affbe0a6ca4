"""Distributionally robust objectives (SPEC 4.1-4.3).

Client-level KL-DRO (papers 000/001, eq. 4-6)::

    min_w max_{r in simplex} sum_i r_i f_i(w) - gamma KL(r || 1/n)
        = gamma log(1/n sum_i exp(f_i(w) / gamma)),

with maximiser ``r = softmax(f / gamma)``. Two forms ship:

* the *exp form* ComFedL minimises, ``1/n sum_i exp(f_i / gamma)`` (local-inner: ``g_k`` is
  client ``k``'s mean loss, ``f = exp(. / gamma)``);
* the *log form* itself as a global-inner problem over the vector of client losses:
  ``g(x) = (f_1(x), ..., f_K(x))`` (each example of client ``k`` contributes ``K l e_k``, so
  the mean over clients of the ``g_k`` is that vector) and
  ``f(v) = gamma (logsumexp(v / gamma) - log K)``. Its gradient is the softmax-weighted
  ``sum_k r_k grad f_k``: bounded, and computed by log-sum-exp for any ``f / gamma``.

Sample-level KL-DRO (paper 004 eq. 4), ``log(1/m sum_i exp(l_i / lambda))``: global-inner with
``g = mean_i exp((l_i - shift) / lambda)`` and ``f(y) = shift / lambda + log y``.

Sample-level chi^2-DRO (paper 004 eq. 5): see :func:`sample_chi2_dro` for the form used.

Values and weights are reported through log-sum-exp (:func:`kl_dro_value`,
:func:`kl_dro_weights`), which never overflow.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedco import _validate
from fedco.problems import base


def kl_dro_value(losses: jax.Array, gamma: float) -> jax.Array:
  """``gamma log(1/n sum_i exp(l_i / gamma))`` via log-sum-exp (never overflows)."""
  n = losses.shape[-1]
  return gamma * (jax.nn.logsumexp(losses / gamma, axis=-1) - jnp.log(n))


def kl_dro_weights(losses: jax.Array, gamma: float, prior=None) -> jax.Array:
  """The worst-case client weights ``r = softmax(l / gamma)``, or with a ``prior`` (the KL
  ball's centre, e.g. the data sizes; normalised here) ``r_k ~ prior_k exp(l_k / gamma)``."""
  logits = losses / gamma
  if prior is not None:
    prior = jnp.asarray(prior, logits.dtype)
    logits = logits + jnp.log(prior / jnp.sum(prior, axis=-1, keepdims=True))
  return jax.nn.softmax(logits, axis=-1)


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
  gamma = _validate.interval("gamma", gamma, 0)
  return base.Problem(loss, lambda y: jnp.exp(y / gamma), None, "local", False, "client_kl_dro")


def client_kl_dro_log(loss, gamma: float, num_clients: int, *, client_key: str = "client"):
  """The log form ``gamma log(1/K sum_k exp(f_k / gamma))`` as a global-inner problem.

  ``g(x)`` is the vector of client mean losses: an example of client ``k`` (its examples
  carry ``k`` under ``client_key``; see :meth:`fedco.FederatedData.with_owner`) maps to
  ``K l(x; e) e_k``, so ``1/K sum_k g_k(x) = (f_1(x), ..., f_K(x))`` and the inner dimension
  is ``p = K``. The outer is ``gamma (logsumexp(v / gamma) - log K)``: stable for ``f/gamma``
  up to 1e4 and beyond, with gradient ``softmax(v / gamma)`` (the worst-case weights ``r``).

  Args:
    loss: per-example loss ``(params, example) -> scalar``.
    gamma: ``gamma > 0``.
    num_clients: ``K``; a simulation checks it against its data's clients.
    client_key: the example field holding the owning client's index.
  """
  gamma = _validate.interval("gamma", gamma, 0)
  num_clients = _validate.positive_int("num_clients", num_clients)

  def inner(params, example):
    onehot = jax.nn.one_hot(example[client_key], num_clients, dtype=jnp.float32)
    return num_clients * loss(params, example) * onehot

  def outer(v):
    return kl_dro_value(v, gamma)

  return base.Problem(
    inner, outer, None, "global", False, "client_kl_dro_log", num_clients=num_clients
  )


def sample_kl_dro(loss, lam: float, *, shift: float = 0.0):
  """Sample-level KL-DRO ``log(1/m sum_i exp(l_i / lam))`` (paper 004 eq. 4), global-inner.

  ``g(x; zeta) = exp((l(x; zeta) - shift) / lam)`` and ``f(y) = shift / lam + log y``: the
  same function for every constant ``shift``. ``exp`` overflows float32 once
  ``(l - shift)/lam`` passes about 88 and ``g`` underflows to 0 (``f = -inf``) once every
  ``(l - shift)/lam`` is below about -87, so set ``shift`` near the largest loss you expect
  (for losses in ``[0, L]``, ``shift = L`` keeps ``g`` in ``(0, 1]``). Report the value with
  :func:`sample_kl_dro_value`, which is exact for any ``l / lam``.

  Args:
    loss: per-example loss ``(params, example) -> scalar``.
    lam: ``lambda > 0``.
    shift: the constant above.
  """
  lam = _validate.interval("lam", lam, 0)
  shift = _validate.real("shift", shift)
  return base.Problem(
    lambda p, e: jnp.exp((loss(p, e) - shift) / lam),
    lambda y: shift / lam + jnp.log(y),
    None,
    "global",
    False,
    "sample_kl_dro",
  )


def sample_kl_dro_value(losses: jax.Array, lam: float) -> jax.Array:
  """``log(1/m sum_i exp(l_i / lam))`` by log-sum-exp."""
  return kl_dro_value(losses, lam) / lam


def sample_chi2_dro(loss, lam: float):
  """Sample-level chi^2-regularised DRO, global-inner.

  ``max_{p in simplex} sum_i p_i l_i - lam m/2 sum_i (p_i - 1/m)^2`` equals, while the
  maximiser ``p_i = 1/m + (l_i - mean l)/(lam m)`` stays in the simplex,

      E[l] + Var(l) / (2 lam) = h(x) + f(g(x)),
      h(x) = E[l + l^2 / (2 lam)],   g(x) = E[l],   f(g) = -g^2 / (2 lam).

  **Deviation from the printed eq. 5 of paper 004 (and SPEC 4.3):** the printed
  ``-1/(2 lam m) sum l_i^2 + (mean l)^2/(2 lam)`` equals ``-Var(l)/(2 lam)``, whose minimiser
  *maximises* the loss variance and drops the mean loss; the dual derivation above gives the
  signs used here. The compositional structure (a squared mean plus a mean of squares) is
  the paper's.

  Args:
    loss: per-example loss ``(params, example) -> scalar``.
    lam: ``lambda > 0``.
  """
  lam = _validate.interval("lam", lam, 0)

  def extra(params, example):
    l = loss(params, example)
    return l + l * l / (2.0 * lam)

  return base.Problem(
    loss, lambda g: -g * g / (2.0 * lam), extra, "global", False, "sample_chi2_dro"
  )


def chi2_dro_value(losses: jax.Array, lam: float) -> jax.Array:
  """``mean(l) + Var(l) / (2 lam)`` (the chi^2-regularised worst case, interior maximiser)."""
  return jnp.mean(losses, -1) + jnp.var(losses, -1) / (2.0 * lam)
