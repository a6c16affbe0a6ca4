r"""Fair classification with noisy protected groups (SPEC 4.6; paper 004 Sec. 6, GCIVR setup).

Logistic regression ``z = w^T x + b`` with per-example loss ``l = BCE(z, y) =
softplus(z) - y z``. For each *proxy* group ``k`` of ``G`` an equal-opportunity constraint

    c_k(w) = BCE(positive rows of proxy group k) - BCE(all rows) - eps          (eps = 0.01)

enters through the smooth penalty (alpha = 0.1, gamma = 0.1)

    P(w) = sum_k 1/(G+1) (1/G + exp(alpha c_k(w) / gamma)),

and the objective is ``Phi(w) = BCE(w) + log P(w)``.

**As a global-inner fedco problem.** fedco forms every inner value as a mean over examples,
but ``BCE(positive rows of group k)`` is a *ratio* of two means. With ``p_i = y_i`` and
``o_ik = 1[proxy_i = k]``, over any (weighted) set of rows ``E``

    BCE(pos rows of group k) = E[p o_k l] / E[p o_k],      BCE(all rows) = E[l],

so the per-example inner map is the vector (``p = 2G + 1`` entries)

    g(w; i) = ( p_i o_i1 l_i, ..., p_i o_iG l_i,   p_i o_i1, ..., p_i o_iG,   l_i )
              \______________ a (G) ______________/ \______ n (G) _______/   m

whose mean ``(a, n, m)`` holds every average the penalty needs (``n`` does not depend on
``w``), and the nonlinear parts sit in the outer function

    c_k = a_k / n_k - m - eps,    s_k = alpha c_k / gamma,
    f(a, n, m) = log P = -log(G + 1) + logsumexp(0, s_1, ..., s_G)

(using ``sum_k 1/G = 1``, so ``P = (1 + sum_k exp(s_k)) / (G + 1)``; the log-sum-exp form
never overflows). The non-compositional term is ``h(w; i) = l_i``. Then
``Phi(w) = h(w) + f(g(w))`` exactly, with ``g`` and ``h`` means over all rows, and a
mini-batch gives ``f`` of the batch means, i.e. the batch's own objective. Gradient:
``grad Phi = grad h + J_g^T grad f`` with

    df/da_k = pi_k (alpha/gamma) / n_k,   df/dn_k = -pi_k (alpha/gamma) a_k / n_k^2,
    df/dm = -(alpha/gamma) sum_k pi_k,    pi_k = exp(s_k) / (1 + sum_j exp(s_j)).

A group with no positive row in the estimate (``n_k <= 0``, possible in a small mini-batch)
is given the neutral value ``c_k = -eps`` (its group loss is taken to equal the overall
loss), with zero gradient through ``a_k`` and ``n_k``.

**Metrics** use the TRUE groups (race): the true positive rate ``TPR(S)`` is the fraction
of positive rows of ``S`` predicted positive (``z > 0``), and

    max group violation = max_k [TPR(all) - TPR(true group k) - eps]

(GCIVR's ``violation``; an empty group has TPR 0 there and here).
"""

from __future__ import annotations

from typing import Dict, Union

import jax
import jax.numpy as jnp

from fedco import _validate
from fedco.problems.base import Problem, global_inner, plain

EPS, ALPHA, GAMMA = 0.01, 0.1, 0.1


def init_params(num_features: int) -> Dict[str, jax.Array]:
  """Zero logistic-regression parameters ``{"w": [d], "b": []}``."""
  num_features = _validate.positive_int("num_features", num_features)
  return {"w": jnp.zeros((num_features,), jnp.float32), "b": jnp.zeros((), jnp.float32)}


def logit(params, x):
  """``w^T x + b`` for one example (or a batch: ``x`` of shape ``[..., d]``)."""
  return x @ params["w"] + params["b"]


def bce(z, y):
  """Binary cross-entropy with logits, ``softplus(z) - y z`` (stable for any ``z``)."""
  return jax.nn.softplus(z) - y * z


def example_loss(params, example):
  """``h(w; i) = BCE`` of one example ``{"x", "y", ...}``."""
  return bce(logit(params, example["x"]), example["y"])


def _check(num_groups, eps, alpha, gamma):
  num_groups = _validate.positive_int("num_groups", num_groups)
  _validate.positive("eps", eps, allow_zero=True)
  _validate.positive("alpha", alpha)
  _validate.positive("gamma", gamma)
  return num_groups


def inner_map(num_groups: int):
  """``(params, example) -> [2G + 1]`` vector ``(p o l, p o, l)`` (module docstring)."""

  def inner(params, example):
    l = example_loss(params, example)
    pos_in_group = example["y"] * jax.nn.one_hot(example["proxy"], num_groups)
    return jnp.concatenate([pos_in_group * l, pos_in_group, l[None]])

  return inner


def outer_map(num_groups: int, eps=EPS, alpha=ALPHA, gamma=GAMMA):
  """``[2G + 1] -> log P``: ratios, exponentials and the log (module docstring)."""
  G = num_groups

  def outer(v):
    a, n, m = v[:G], v[G : 2 * G], v[2 * G]
    present = n > 0
    ratio = jnp.where(present, a / jnp.where(present, n, 1.0), m)
    s = alpha * (ratio - m - eps) / gamma
    return jax.nn.logsumexp(jnp.concatenate([jnp.zeros((1,), s.dtype), s])) - jnp.log(G + 1.0)

  return outer


def fairness_problem(num_groups: int = 3, eps=EPS, alpha=ALPHA, gamma=GAMMA) -> Problem:
  r"""Fair logistic regression with noisy protected groups (SPEC 4.6), a global-inner problem.

  Logistic regression :math:`z = w^\top x + b` with the per-example loss
  :math:`\ell = \mathrm{BCE}(z, y)` and an equal-opportunity constraint per *proxy* group
  :math:`k` of :math:`G`, entering through a smooth penalty (paper 004 Sec. 6, GCIVR's setup):

  .. math::

    \Phi(w) = \mathrm{BCE}(w) + \log P(w), \qquad
    P(w) = \sum_{k=1}^G \frac{1}{G+1} \Big(\frac{1}{G} + e^{\alpha c_k(w) / \gamma}\Big),

    c_k(w) = \mathrm{BCE}(\text{positive rows of proxy group } k) - \mathrm{BCE}(\text{all rows})
    - \epsilon.

  The group loss is a ratio of two means, so the per-example inner map is the
  :math:`2G + 1` vector :math:`g(w; i) = \big((y_i o_{ik} \ell_i)_k, (y_i o_{ik})_k, \ell_i\big)`
  (:math:`o_{ik} = 1[\mathrm{proxy}_i = k]`), the outer :math:`f` forms the ratios and
  :math:`\log P` by log-sum-exp (never overflows), and :math:`h(w; i) = \ell_i`; see
  :mod:`fedco.problems.fairness` for the derivation and the gradient. A group with no
  positive row in a (mini-batch) estimate gets the neutral :math:`c_k = -\epsilon`. Being
  global-inner, every mean weighs client :math:`k`'s rows by :math:`1/(K n_k)`.

  Args:
    num_groups: the number of proxy groups :math:`G \ge 1`; default 3 (race in {White,
      Black, Other}).
    eps: the constraint slack :math:`\epsilon \ge 0`; default 0.01.
    alpha: the penalty scale :math:`\alpha > 0`; default 0.1.
    gamma: the penalty temperature :math:`\gamma > 0`; default 0.1.

  Returns:
    A global-inner :class:`Problem` named ``"fair_logistic"``. Its examples are dicts
    ``{"x": float [d], "y": float 0/1, "proxy": int in [0, G)}``; its parameters are
    ``{"w": [d], "b": []}`` (``fedco.problems.fairness.init_params(d)`` gives zeros).

  Raises:
    ValueError: if ``num_groups`` is not a positive integer, ``eps`` is negative, or
      ``alpha`` or ``gamma`` is not ``> 0``.

  Examples:
    Six rows on two clients; at :math:`w = 0` every loss is :math:`\log 2`, so
    :math:`c_k = -\epsilon` and :math:`\Phi = \log 2 + \log((1 + 3 e^{-0.01}) / 4)`:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> problem = fedco.problems.fairness_problem(num_groups=3)
    >>> x = jnp.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.0], [0.5, -1.0], [0.0, -1.0]])
    >>> y = jnp.array([1.0, 1.0, 1.0, 0.0, 1.0, 0.0])
    >>> rows = {"x": x, "y": y, "proxy": jnp.array([0, 1, 2, 0, 1, 2])}
    >>> owner, weights = jnp.array([0, 0, 0, 1, 1, 1]), jnp.full((6,), 1 / 3)
    >>> evaluate = jax.jit(problem.evaluate, static_argnames="num_clients")
    >>> for w in ([0.0, 0.0], [1.0, 1.0]):
    ...   params = {"w": jnp.array(w), "b": jnp.array(0.0)}
    ...   objective, _ = evaluate(params, rows, owner, weights, num_clients=2)
    ...   print(w, round(float(objective), 4))
    [0.0, 0.0] 0.6857
    [1.0, 1.0] 0.379
  """
  G = _check(num_groups, eps, alpha, gamma)
  return global_inner(
    inner_map(G), outer_map(G, eps, alpha, gamma), example_loss, name="fair_logistic"
  )


def unconstrained() -> Problem:
  """The plain BCE problem (the unconstrained parallel-SGD baseline)."""
  return plain(example_loss, name="bce")


def objective(params, x, y, proxy, num_groups: int = 3, eps=EPS, alpha=ALPHA, gamma=GAMMA):
  """``Phi(w)`` on a set of rows, written directly from SPEC 4.6 (no composition): mean BCE
  plus the log of the penalty over proxy groups. Used to check the composition."""
  l = bce(logit(params, x), y)
  overall = jnp.mean(l)
  penalty: Union[float, jax.Array] = 0.0
  for k in range(num_groups):
    mask = (y > 0) & (proxy == k)
    group = jnp.sum(jnp.where(mask, l, 0.0)) / jnp.sum(mask)
    penalty = penalty + (1.0 / num_groups + jnp.exp(alpha * (group - overall - eps) / gamma))
  return overall + jnp.log(penalty / (num_groups + 1))


def group_metrics(params, x, y, groups, num_groups: int = 3, eps=EPS):
  r"""Accuracy, TPRs and equal-opportunity violations of a logistic model on given groups.

  The metrics of SPEC 4.6, computed on the TRUE groups (race), not the proxies the problem
  trains on: the true positive rate :math:`\mathrm{TPR}(S)` is the fraction of the positive
  rows of :math:`S` predicted positive (:math:`z = w^\top x + b > 0`), and

  .. math::

    \text{max group violation} = \max_k \big[\mathrm{TPR}(\text{all}) -
    \mathrm{TPR}(\text{group } k) - \epsilon\big]

  (GCIVR's ``violation``). A group without positive rows has TPR 0, as in GCIVR's
  evaluation.

  Args:
    params: ``{"w": [d], "b": []}``, the logistic-regression parameters.
    x: ``[n, d]`` features.
    y: ``[n]`` labels, 0 or 1 (a row is positive when ``y > 0``).
    groups: ``int [n]``, each row's group in ``[0, num_groups)``.
    num_groups: the number of groups :math:`G`; default 3.
    eps: the slack :math:`\epsilon` subtracted from every violation; default 0.01.

  Returns:
    A dict of scalar arrays ``"acc"``, ``"tpr"`` (over all rows) and ``"max_violation"``,
    and ``[G]`` arrays ``"group_tpr"`` and ``"violations"`` with
    ``violations[k] = TPR(all) - TPR(group k) - eps``.

  Examples:
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> x = jnp.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.0], [0.5, -1.0], [0.0, -1.0]])
    >>> y = jnp.array([1.0, 1.0, 1.0, 0.0, 1.0, 0.0])
    >>> groups = jnp.array([0, 0, 1, 1, 2, 2])
    >>> params = {"w": jnp.array([1.0, 1.0]), "b": jnp.array(0.0)}
    >>> m = fedco.problems.fairness_metrics(params, x, y, groups, num_groups=3)
    >>> print(m["group_tpr"].tolist(), round(float(m["max_violation"]), 4))
    [1.0, 1.0, 0.0] 0.74
  """
  pred = (logit(params, x) > 0).astype(jnp.float32)
  pos = (y > 0).astype(jnp.float32)
  acc = jnp.mean((pred == pos).astype(jnp.float32))
  tpr = jnp.sum(pred * pos) / jnp.maximum(jnp.sum(pos), 1.0)
  member = jax.nn.one_hot(groups, num_groups) * pos[:, None]
  group_tpr = (pred @ member) / jnp.maximum(jnp.sum(member, axis=0), 1.0)
  violations = tpr - group_tpr - eps
  return {
    "acc": acc,
    "tpr": tpr,
    "group_tpr": group_tpr,
    "violations": violations,
    "max_violation": jnp.max(violations),
  }
