r"""Compositional problems :math:`f(\mathbb{E}[g(x)])` as pure per-example functions.

A compositional problem nests an expectation inside a nonlinear function (SPEC section 0),

.. math::

  \min_x \; f\big(\mathbb{E}_\zeta[g(x; \zeta)]\big) + \mathbb{E}_\xi[h(x; \xi)],

so an unbiased gradient needs the *value* of the inner expectation, not one sample of it. fedco
takes the three functions per example, as pure JAX functions:

* ``inner(params, example) -> pytree``: the inner map :math:`g(x; \zeta)` (any pytree of
  arrays; its size is SPEC's ``p``);
* ``outer(y) -> scalar`` or, with ``outer_uses_data=True``, ``outer(y, example) -> scalar``:
  the outer function :math:`f(y)` or :math:`f(y; \xi)`;
* ``extra(params, example) -> scalar`` (optional): the non-compositional term :math:`h(x; \xi)`.

Every mini-batch value is a weighted mean over examples, :math:`g(x; B) = \sum_i w_i
g(x; \zeta_i)` with :math:`\sum_i w_i = 1` (:func:`weighted_mean`); a data-dependent outer is
averaged the same way. Where the clients' data come in (a federation of :math:`K` clients
with inner maps :math:`g_k`) there are two problem classes, and every algorithm says which
one it solves:

* **local-inner** (:func:`local_inner`; ComFedL, Local-SCGD(M), MAML, client-level DRO):
  :math:`F(x) = \frac{1}{K} \sum_k [f_k(g_k(x)) + h_k(x)]`: each client composes its own
  inner value, so local steps need no communication of ``g``;
* **global-inner** (:func:`global_inner`; FedDRO, DS-FedDRO, sample-level DRO, fairness):
  :math:`\Phi(x) = h(x) + f(g(x))` with :math:`g = \frac{1}{K} \sum_k g_k` and
  :math:`h = \frac{1}{K} \sum_k h_k`: the outer sees the *federation's* mean inner value,
  which no client can compute alone.

:func:`plain` builds an ordinary (non-compositional) problem :math:`\frac{1}{K} \sum_k
\mathbb{E}\,\ell(x; \xi)` for FedAvg and the other ERM baselines. All three return a
:class:`Problem`.

The problems of SPEC section 4, and the constructor of each:

* 4.1 client-level KL-DRO: :func:`client_kl_dro` (ComFedL's exp form, local-inner) and
  :func:`client_kl_dro_log` (the log form, global-inner); report with :func:`kl_dro_value`,
  :func:`kl_dro_weights`, :func:`log_exp_form_value`;
* 4.2 sample-level KL-DRO: :func:`sample_kl_dro` (global-inner); report with
  :func:`sample_kl_dro_value`;
* 4.3 sample-level :math:`\chi^2`-DRO: :func:`sample_chi2_dro` (global-inner); report with
  :func:`chi2_dro_value`;
* 4.4 MAML: :func:`maml` (episodes of several tasks per client; building blocks in
  :class:`MAML`) and :func:`personalized_maml` (one task per client), both local-inner;
* 4.5 DA-MAML: :func:`da_maml` and ``personalized_maml(..., gamma=...)``; report with
  :func:`da_maml_value`;
* 4.6 fairness with noisy protected groups: :func:`fairness_problem` (global-inner);
  metrics on the true groups by :func:`fairness_metrics`;
* 4.7 mean-variance portfolio: :func:`portfolio` (global-inner by default), solved exactly by
  :func:`portfolio_stationary_point`.
"""

from fedco.problems.base import Problem, global_inner, local_inner, plain, weighted_mean
from fedco.problems.dro import (
  chi2_dro_value,
  client_kl_dro,
  client_kl_dro_log,
  kl_dro_value,
  kl_dro_weights,
  log_exp_form_value,
  sample_chi2_dro,
  sample_kl_dro,
  sample_kl_dro_value,
)
from fedco.problems.fairness import fairness_problem
from fedco.problems.fairness import group_metrics as fairness_metrics
from fedco.problems.maml import MAML, da_maml, da_maml_value, maml
from fedco.problems.personalized import personalized_maml
from fedco.problems.portfolio import portfolio
from fedco.problems.portfolio import stationary_point as portfolio_stationary_point
from fedco.problems.precision import mixed_precision

__all__ = [
  "mixed_precision",
  "personalized_maml",
  "MAML",
  "da_maml",
  "da_maml_value",
  "maml",
  "fairness_problem",
  "fairness_metrics",
  "Problem",
  "global_inner",
  "local_inner",
  "plain",
  "weighted_mean",
  "client_kl_dro",
  "client_kl_dro_log",
  "kl_dro_value",
  "kl_dro_weights",
  "log_exp_form_value",
  "sample_kl_dro",
  "sample_kl_dro_value",
  "sample_chi2_dro",
  "chi2_dro_value",
  "portfolio",
  "portfolio_stationary_point",
]
