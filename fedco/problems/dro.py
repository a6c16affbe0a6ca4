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
import numpy as np

from fedco import _validate
from fedco.problems import base


def kl_dro_value(losses: jax.Array, gamma: float) -> jax.Array:
  r"""The KL-DRO value :math:`\gamma \log(\frac{1}{n} \sum_i \exp(\ell_i / \gamma))`.

  By KL duality (SPEC 4.1) this is the worst case over reweightings of the losses,

  .. math::

    \max_{r \in \Delta_n} \sum_i r_i \ell_i - \gamma\, \mathrm{KL}(r \,\|\, 1/n)
    = \gamma \log \frac{1}{n} \sum_{i=1}^n \exp(\ell_i / \gamma),

  which lies between the mean loss (:math:`\gamma \to \infty`) and the largest
  (:math:`\gamma \to 0`). Computed by log-sum-exp, so it never overflows (finite for
  :math:`\ell / \gamma` of 1e4 and beyond). Use it to report client-level DRO: the value of
  the log form, and :math:`\gamma \log` of ComFedL's exp form.

  Args:
    losses: ``[..., n]`` losses :math:`\ell_i` (e.g. the clients' mean losses :math:`f_k`);
      reduced over the last axis.
    gamma: the KL regularisation :math:`\gamma > 0` (not checked here).

  Returns:
    A ``[...]`` array: the value for each leading index (a scalar for ``[n]`` losses).

  Examples:
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> losses = jnp.array([1.0, 3.0])
    >>> for gamma in (0.1, 1.0, 100.0):  # from near the max (3) to near the mean (2)
    ...   print(gamma, round(float(fedco.problems.kl_dro_value(losses, gamma)), 4))
    0.1 2.9307
    1.0 2.4338
    100.0 2.005
    >>> print(round(float(fedco.problems.kl_dro_value(jnp.array([1e4, 0.0]), 1.0)), 1))
    9999.3
  """
  n = losses.shape[-1]
  return gamma * (jax.nn.logsumexp(losses / gamma, axis=-1) - jnp.log(n))


def kl_dro_weights(losses: jax.Array, gamma: float, prior=None) -> jax.Array:
  r"""The worst-case client weights :math:`r = \mathrm{softmax}(\ell / \gamma)` of KL-DRO.

  The maximiser of :math:`\sum_k r_k \ell_k - \gamma\, \mathrm{KL}(r \,\|\, \pi)` over the
  simplex is :math:`r_k \propto \pi_k \exp(\ell_k / \gamma)`: with the uniform centre
  :math:`\pi = 1/n` (the default) it is :math:`\mathrm{softmax}(\ell / \gamma)`, the gradient
  of :func:`kl_dro_value` (SPEC 4.1 asks to report it as a metric). The worst clients get
  the most weight, and the more so the smaller :math:`\gamma`.

  Args:
    losses: ``[..., n]`` losses :math:`\ell_k` (the clients' mean losses); the softmax runs
      over the last axis.
    gamma: the KL regularisation :math:`\gamma > 0` (not checked here).
    prior: optional ``[n]`` (or broadcastable) nonnegative centre :math:`\pi` of the KL
      ball, e.g. the clients' data sizes; normalised here. ``None``: uniform.

  Returns:
    A ``[..., n]`` array of weights, each row summing to 1.

  Examples:
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> losses = jnp.array([0.5, 1.0, 2.0])
    >>> r = fedco.problems.kl_dro_weights(losses, 0.5)
    >>> print([round(float(v), 3) for v in r])  # the worst client gets the most weight
    [0.042, 0.114, 0.844]
    >>> r = fedco.problems.kl_dro_weights(losses, 0.5, prior=[8, 1, 1])
    >>> print([round(float(v), 3) for v in r])
    [0.26, 0.088, 0.652]
  """
  logits = losses / gamma
  if isinstance(prior, (list, tuple, np.ndarray)):  # concrete: checked (a traced one is not)
    values = np.asarray(prior, np.float64)
    if not np.all(np.isfinite(values)) or np.any(values < 0) or not np.all(values.sum(-1) > 0):
      raise ValueError(f"prior must be finite, >= 0 and not all 0, got {prior!r}")
  if prior is not None:
    prior = jnp.asarray(prior, logits.dtype)
    logits = logits + jnp.log(prior / jnp.sum(prior, axis=-1, keepdims=True))
  return jax.nn.softmax(logits, axis=-1)


def log_exp_form_value(losses: jax.Array, gamma: float) -> jax.Array:
  r"""The log of ComFedL's exp-form objective, computed without overflow.

  That is :math:`\log(\frac{1}{n} \sum_i \exp(\ell_i / \gamma))`. The exp form
  :math:`\frac{1}{n} \sum_i \exp(\ell_i / \gamma)` that :func:`client_kl_dro` minimises
  overflows float32 once :math:`\ell_i / \gamma` passes about 88; its log,
  :func:`kl_dro_value` divided by :math:`\gamma`, is computed by log-sum-exp and stays
  finite.

  Args:
    losses: ``[..., n]`` losses :math:`\ell_i`; reduced over the last axis.
    gamma: :math:`\gamma > 0` (not checked here).

  Returns:
    A ``[...]`` array (a scalar for ``[n]`` losses).

  Examples:
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> print(round(float(fedco.problems.log_exp_form_value(jnp.array([0.0, 5.0]), 1.0)), 4))
    4.3136
    >>> print(round(float(fedco.problems.log_exp_form_value(jnp.array([0.0, 1e4]), 1.0)), 1))
    9999.3
  """
  return kl_dro_value(losses, gamma) / gamma


def client_kl_dro(loss, gamma: float):
  r"""ComFedL's client-level KL-DRO in the exp form (SPEC 4.1), a local-inner problem.

  Client-level KL-DRO (papers 000/001, eq. 4-6) is

  .. math::

    \min_x \max_{r \in \Delta_K} \sum_k r_k f_k(x) - \gamma\, \mathrm{KL}(r \,\|\, 1/K)
    = \min_x \gamma \log \Big( \frac{1}{K} \sum_{k=1}^K \exp(f_k(x) / \gamma) \Big),
    \qquad f_k(x) = \mathbb{E}_{\xi \sim D_k} \ell(x; \xi),

  and ComFedL minimises the monotone transform :math:`\frac{1}{K} \sum_k \exp(f_k(x) /
  \gamma)`, which has the same minimisers: local-inner with :math:`g_k(x) = f_k(x)` (the
  client's mean loss, :math:`p = 1`) and outer :math:`f(y) = \exp(y / \gamma)`, so the
  compositional step is :math:`\exp(f_k/\gamma)/\gamma \cdot \nabla f_k` (SPEC 2.1). The exp
  form's own value and step overflow float32 once :math:`f_k/\gamma` passes about 88;
  report the value with :func:`kl_dro_value` on the per-client losses (it never overflows),
  the worst-case weights with :func:`kl_dro_weights`, or use the log form
  :func:`client_kl_dro_log`.

  Args:
    loss: ``loss(params, example) -> scalar``, the per-example loss :math:`\ell(x; \xi)`.
    gamma: the KL regularisation :math:`\gamma > 0`; smaller is more robust (closer to the
      worst client's loss).

  Returns:
    A local-inner :class:`Problem` named ``"client_kl_dro"`` with ``inner = loss`` and a
    deterministic outer ``exp(y / gamma)``.

  Raises:
    ValueError: if ``gamma`` is not a finite number ``> 0`` or ``loss`` is not callable.

  Examples:
    Two clients with mean losses 0 and 5 at ``x = 0``; :math:`\gamma \log` of the objective
    is the KL-DRO value:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> problem = fedco.problems.client_kl_dro(lambda x, ex: (x - ex["t"]) ** 2, gamma=1.0)
    >>> examples = {"t": jnp.array([0.0, 0.0, 1.0, 3.0])}
    >>> owner, weights = jnp.array([0, 0, 1, 1]), jnp.full((4,), 0.5)
    >>> evaluate = jax.jit(problem.evaluate, static_argnames="num_clients")
    >>> objective, _ = evaluate(jnp.array(0.0), examples, owner, weights, num_clients=2)
    >>> print(round(float(objective), 2), round(float(jnp.log(objective)), 4))
    74.71 4.3136
    >>> print(round(float(fedco.problems.kl_dro_value(jnp.array([0.0, 5.0]), 1.0)), 4))
    4.3136
  """
  gamma = _validate.interval("gamma", gamma, 0)
  return base.Problem(loss, lambda y: jnp.exp(y / gamma), None, "local", False, "client_kl_dro")


def client_kl_dro_log(loss, gamma: float, num_clients: int, *, client_key: str = "client"):
  r"""Client-level KL-DRO in the log form (SPEC 4.1), a global-inner problem.

  The objective is the KL-DRO value itself,

  .. math::

    \min_x \gamma \log \Big( \frac{1}{K} \sum_{k=1}^K \exp(f_k(x) / \gamma) \Big),
    \qquad f_k(x) = \mathbb{E}_{\xi \sim D_k} \ell(x; \xi),

  written as :math:`f(g(x))` over the vector of client mean losses: an example :math:`\xi`
  of client :math:`k` (its examples carry ``k`` under ``client_key``; see
  :meth:`fedco.FederatedData.with_owner`) maps to :math:`g(x; \xi) = K \ell(x; \xi) e_k`,
  so :math:`g(x) = \frac{1}{K} \sum_k g_k(x) = (f_1(x), \dots, f_K(x))` and the inner
  dimension is :math:`p = K`. The outer :math:`f(v) = \gamma (\mathrm{logsumexp}(v /
  \gamma) - \log K)` is stable for :math:`f/\gamma` up to 1e4 and beyond, and its gradient
  :math:`\mathrm{softmax}(v / \gamma)` is the worst-case weights :math:`r`
  (:func:`kl_dro_weights`), so the step :math:`\sum_k r_k \nabla f_k` stays bounded where
  :func:`client_kl_dro`'s exp form overflows. A per-client value :math:`f(g_k(x))` (the
  ``client_losses`` of :meth:`Problem.evaluate`) is not client :math:`k`'s loss. Since the
  inner value has :math:`K` entries, an algorithm that tracks and averages it (FedDRO's
  ``y``) uploads :math:`K` floats per client and exchange besides the model; at large
  :math:`K`, :func:`client_kl_dro` (the exp form, whose inner value is each client's own
  scalar loss: Local-SCGD, ComFedL) uploads at most one float more.

  Args:
    loss: ``loss(params, example) -> scalar``, the per-example loss :math:`\ell(x; \xi)`.
    gamma: the KL regularisation :math:`\gamma > 0`.
    num_clients: :math:`K \ge 1`; a simulation checks it against its data's clients.
    client_key: the example field holding the owning client's index (an ``int`` in
      ``[0, K)``); default ``"client"``.

  Returns:
    A global-inner :class:`Problem` named ``"client_kl_dro_log"`` with
    ``num_clients = K``.

  Raises:
    ValueError: if ``gamma`` is not a finite number ``> 0`` or ``num_clients`` is not a
      positive integer.

  Examples:
    Where the exp form overflows (:math:`f_k/\gamma = 500`), the log form gives the value:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> loss = lambda x, ex: (x - ex["t"]) ** 2
    >>> owner, weights = jnp.array([0, 0, 1, 1]), jnp.full((4,), 0.5)
    >>> examples = {"t": jnp.array([0.0, 0.0, 1.0, 3.0]), "client": owner}
    >>> problem = fedco.problems.client_kl_dro_log(loss, 0.01, num_clients=2)
    >>> evaluate = jax.jit(problem.evaluate, static_argnames="num_clients")
    >>> objective, _ = evaluate(jnp.array(0.0), examples, owner, weights, num_clients=2)
    >>> print(round(float(objective), 4))
    4.9931
    >>> problem = fedco.problems.client_kl_dro(loss, 0.01)  # the exp form overflows
    >>> evaluate = jax.jit(problem.evaluate, static_argnames="num_clients")
    >>> print(float(evaluate(jnp.array(0.0), examples, owner, weights, num_clients=2)[0]))
    inf
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
  r"""Sample-level KL-DRO (SPEC 4.2, paper 004 eq. 4), a global-inner problem.

  The objective over all :math:`m` examples of the federation is

  .. math::

    \min_x \log \Big( \frac{1}{m} \sum_{i=1}^m \exp(\ell_i(x) / \lambda) \Big)
    = f(g(x)), \qquad
    g(x; \zeta) = \exp\big((\ell(x; \zeta) - s) / \lambda\big), \qquad
    f(y) = s / \lambda + \log y,

  the same function for every constant shift :math:`s`. Being global-inner,
  :math:`g = \frac{1}{K} \sum_k g_k` weighs client :math:`k`'s examples by
  :math:`1/(K n_k)`: the plain mean over examples when the clients are of equal size.
  ``exp`` overflows float32 once :math:`(\ell - s)/\lambda` passes about 88, and ``g``
  underflows to 0 (:math:`f = -\infty`) once every :math:`(\ell - s)/\lambda` is below
  about -87, so set ``shift`` near the largest loss you expect (for losses in
  :math:`[0, L]`, :math:`s = L` keeps ``g`` in :math:`(0, 1]`). Report the value with
  :func:`sample_kl_dro_value`, which is exact for any :math:`\ell / \lambda`.

  Args:
    loss: ``loss(params, example) -> scalar``, the per-example loss :math:`\ell(x; \zeta)`.
    lam: the temperature :math:`\lambda > 0`; smaller is more robust (closer to the largest
      loss).
    shift: the constant :math:`s` (a finite real); default 0.

  Returns:
    A global-inner :class:`Problem` named ``"sample_kl_dro"``.

  Raises:
    ValueError: if ``lam`` is not a finite number ``> 0`` or ``shift`` not a finite real.

  Examples:
    Losses ``[0, 0, 1, 9]`` on two equal clients; the objective matches
    :func:`sample_kl_dro_value`:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> problem = fedco.problems.sample_kl_dro(lambda x, ex: (x - ex["t"]) ** 2, 2.0, shift=9.0)
    >>> examples = {"t": jnp.array([0.0, 0.0, 1.0, 3.0])}
    >>> owner, weights = jnp.array([0, 0, 1, 1]), jnp.full((4,), 0.5)
    >>> evaluate = jax.jit(problem.evaluate, static_argnames="num_clients")
    >>> objective, _ = evaluate(jnp.array(0.0), examples, owner, weights, num_clients=2)
    >>> print(round(float(objective), 4))
    3.1534
    >>> print(round(float(fedco.problems.sample_kl_dro_value(jnp.array([0.0, 0, 1, 9]), 2.0)), 4))
    3.1534
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
  r"""The sample-level KL-DRO value :math:`\log(\frac{1}{m} \sum_i \exp(\ell_i / \lambda))`.

  The objective of :func:`sample_kl_dro`, computed by log-sum-exp: exact and finite for any
  :math:`\ell / \lambda` (it is :func:`kl_dro_value` divided by :math:`\lambda`).

  Args:
    losses: ``[..., m]`` per-example losses :math:`\ell_i`; reduced over the last axis.
    lam: :math:`\lambda > 0` (not checked here).

  Returns:
    A ``[...]`` array (a scalar for ``[m]`` losses).

  Examples:
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> losses = jnp.array([0.0, 0.0, 1.0, 9.0])
    >>> print(round(float(fedco.problems.sample_kl_dro_value(losses, 2.0)), 4))
    3.1534
    >>> print(round(float(fedco.problems.sample_kl_dro_value(1000 * losses, 2.0)), 1))
    4498.6
  """
  return kl_dro_value(losses, lam) / lam


def sample_chi2_dro(loss, lam: float):
  r"""Sample-level :math:`\chi^2`-regularised DRO (SPEC 4.3), a global-inner problem.

  The worst case over reweightings :math:`p` of the :math:`m` examples,

  .. math::

    \max_{p \in \Delta_m} \sum_i p_i \ell_i - \frac{\lambda m}{2} \sum_i (p_i - 1/m)^2
    = \mathbb{E}[\ell] + \frac{\mathrm{Var}(\ell)}{2 \lambda} = h(x) + f(g(x)),

  (while the maximiser :math:`p_i = 1/m + (\ell_i - \bar\ell)/(\lambda m)` stays in the
  simplex), with

  .. math::

    h(x; \xi) = \ell(x; \xi) + \frac{\ell(x; \xi)^2}{2 \lambda}, \qquad
    g(x; \zeta) = \ell(x; \zeta), \qquad f(g) = -\frac{g^2}{2 \lambda}.

  **Deviation from the printed eq. 5 of paper 004 (and SPEC 4.3):** the printed
  :math:`-\frac{1}{2 \lambda m} \sum_i \ell_i^2 + \frac{\bar\ell^2}{2 \lambda}` equals
  :math:`-\mathrm{Var}(\ell)/(2 \lambda)`, whose minimiser *maximises* the loss variance and
  drops the mean loss; the dual derivation above gives the signs used here. The
  compositional structure (a squared mean plus a mean of squares) is the paper's. As for
  every global-inner problem, the means weigh client :math:`k`'s examples by
  :math:`1/(K n_k)`.

  Args:
    loss: ``loss(params, example) -> scalar``, the per-example loss :math:`\ell(x; \xi)`.
    lam: the regularisation :math:`\lambda > 0`; smaller penalises the variance more.

  Returns:
    A global-inner :class:`Problem` named ``"sample_chi2_dro"`` (``inner = loss``, a
    deterministic outer and the ``extra`` term :math:`h`).

  Raises:
    ValueError: if ``lam`` is not a finite number ``> 0``.

  Examples:
    Losses ``[0, 0, 1, 9]`` (mean 2.5, variance 14.25) on two equal clients; the objective
    matches :func:`chi2_dro_value`:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> problem = fedco.problems.sample_chi2_dro(lambda x, ex: (x - ex["t"]) ** 2, lam=10.0)
    >>> examples = {"t": jnp.array([0.0, 0.0, 1.0, 3.0])}
    >>> owner, weights = jnp.array([0, 0, 1, 1]), jnp.full((4,), 0.5)
    >>> evaluate = jax.jit(problem.evaluate, static_argnames="num_clients")
    >>> objective, _ = evaluate(jnp.array(0.0), examples, owner, weights, num_clients=2)
    >>> print(round(float(objective), 4))
    3.2125
  """
  lam = _validate.interval("lam", lam, 0)

  def extra(params, example):
    l = loss(params, example)
    return l + l * l / (2.0 * lam)

  return base.Problem(
    loss, lambda g: -g * g / (2.0 * lam), extra, "global", False, "sample_chi2_dro"
  )


def chi2_dro_value(losses: jax.Array, lam: float) -> jax.Array:
  r"""The :math:`\chi^2`-DRO value :math:`\bar\ell + \mathrm{Var}(\ell) / (2 \lambda)`.

  The objective of :func:`sample_chi2_dro`: the :math:`\chi^2`-regularised worst case while
  its maximiser is interior (every :math:`\ell_i \ge \bar\ell - \lambda`). The variance is
  the population one (divided by :math:`m`).

  Args:
    losses: ``[..., m]`` per-example losses :math:`\ell_i`; reduced over the last axis.
    lam: :math:`\lambda > 0` (not checked here).

  Returns:
    A ``[...]`` array (a scalar for ``[m]`` losses).

  Examples:
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> losses = jnp.array([0.0, 0.0, 1.0, 9.0])
    >>> print(round(float(fedco.problems.chi2_dro_value(losses, 10.0)), 4))
    3.2125
  """
  return jnp.mean(losses, -1) + jnp.var(losses, -1) / (2.0 * lam)
