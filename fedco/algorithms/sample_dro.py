r"""Sample-level DRO baselines (SPEC 3, E5): FastDRO and primal-dual SGD.

Both reweight the *examples* of a plain per-example loss ``l_i(x)`` (the problem's ``h``)
and step on the weighted loss. In the federated runtime they read the outer batch's
per-example losses through the ``example_losses_fn`` oracle and its weights through
``example_weights`` (see :func:`fedco.oracle_args`).

FastDRO (Levy, Carmon, Duchi, Sidford 2020)
-------------------------------------------
Per mini-batch, the best response of the uncertainty set around the batch's empirical
distribution ``w`` (``w_i = 1/b``; 0 on padding)::

    p* = argmax_{p in U(w)} sum_i p_i l_i,       z = grad_x sum_i p*_i l_i(x)   (p* held fixed)

* ``geometry="chi2"``, ``size = rho``: ``U = {p in simplex : 1/2 sum_i w_i (p_i/w_i - 1)^2
  <= rho}``. The maximiser is ``p_i(eta) = w_i (l_i - eta)_+ / sum_j w_j (l_j - eta)_+`` with
  ``eta`` chosen so the divergence equals ``rho`` (the divergence grows with ``eta``), found
  by bisection on ``[min l - std/sqrt(2 rho), max l]``. If even the one-point distribution on
  the largest loss stays inside the ball, ``p*`` is that point (ties share it).
* ``geometry="cvar"``, ``size = alpha`` in ``(0, 1]``: ``U = {p in simplex : p_i <= w_i /
  alpha}``. The maximiser fills the largest losses to their cap: ``p_i = w_i / alpha`` for
  ``l_i > eta``, the remainder on the examples at ``eta``, where ``eta`` is the
  ``(1 - alpha)``-quantile, found by bisection on the mass ``sum_{l_i > eta} w_i / alpha``
  (the dual's optimality condition). ``alpha = 1`` is the mean loss (ERM).

*Parallel form* (paper 004's centralised baselines, SPEC E5): every client computes the
best response on its own mini-batch, the step is averaged by the server every
``local_steps`` steps (default 1: data-parallel FastDRO with the per-client batch).

Primal-dual SGD for DRO
-----------------------
Weights ``p`` on the simplex over *all* ``N`` training examples (uniform at first), the
saddle problem ``min_x max_p sum_i p_i l_i(x) - reg/2 * N sum_i (p_i - 1/N)^2``. A step, on
client ``k`` with mini-batch ``B_k`` of rows ``i_1 .. i_b``::

    z_k = grad_x  N/b sum_j p_{i_j} l_{i_j}(x)          (importance weights N p_i; = ERM at p = 1/N)
    v_k = n_k/b sum_j l_{i_j}(x) e_{i_j}                  (unbiased for client k's rows of l)

(``v_k`` summed over the round's steps, as DRFA's ``tau v``) and the server, after the
round's ``local_steps`` steps, averages the models weighted by
data size (``weighting="samples"``, so ``sum_k n_k/N z_k`` is unbiased for the full
gradient) and ascends::

    p = Proj_simplex(p + weights_lr * (K/m sum_{k in S} v_k - reg N (p - 1/N)))

``reg = 0`` is SPEC 3's plain projected ascent. Clients hold ``p`` (``N`` floats, sent down
every round) and report ``v_k`` (sent up as an ``N``-vector; only ``b * local_steps`` of its
entries are non-zero). The examples' ids are the runtime's ``example_rows`` (rows of the
data's ``examples``), so ``num_examples`` is the number of those rows.

References:
  Levy et al., "Large-scale methods for distributionally robust optimization", NeurIPS 2020.
  Namkoong and Duchi, "Stochastic gradient methods for distributionally robust optimization
  with f-divergences", NeurIPS 2016 (primal-dual). Paper 004 Sec. 6 (the E5 baselines).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedco import _validate, extend

GEOMETRIES = ("chi2", "cvar")


def _uniform_weights(losses, weights):
  if weights is None:
    return jnp.full(losses.shape, 1.0 / losses.shape[0], losses.dtype)
  return jnp.asarray(weights, losses.dtype)


def chi2_divergence(p: jax.Array, weights: jax.Array) -> jax.Array:
  """``1/2 sum_i w_i (p_i / w_i - 1)^2`` over the rows with ``w_i > 0``."""
  safe = jnp.where(weights > 0, weights, 1.0)
  return 0.5 * jnp.sum(jnp.where(weights > 0, weights * (p / safe - 1.0) ** 2, 0.0))


def _chi2_at(eta, losses, weights):
  excess = weights * jnp.maximum(losses - eta, 0.0)
  total = jnp.sum(excess)
  return excess / jnp.where(total > 0, total, 1.0), total


def chi2_best_response(
  losses: jax.Array, rho: float, weights: Optional[jax.Array] = None, *, iterations: int = 60
) -> jax.Array:
  """The chi^2-ball best response ``p*`` (see the module docstring), by bisection on ``eta``."""
  losses = jnp.asarray(losses)
  w = _uniform_weights(losses, weights)
  real = w > 0
  big = jnp.finfo(losses.dtype).max
  top = jnp.max(jnp.where(real, losses, -big))
  low_l = jnp.min(jnp.where(real, losses, big))
  mean = jnp.sum(w * losses)
  std = jnp.sqrt(jnp.maximum(jnp.sum(w * (losses - mean) ** 2), 0.0))
  lo = low_l - std / jnp.sqrt(2.0 * rho) - 1e-6 * (1.0 + jnp.abs(low_l))
  hi = top

  def body(_, bounds):
    lo, hi = bounds
    mid = 0.5 * (lo + hi)
    p, total = _chi2_at(mid, losses, w)
    inside = (total > 0) & (chi2_divergence(p, w) <= rho)
    return jnp.where(inside, mid, lo), jnp.where(inside, hi, mid)

  lo, hi = jax.lax.fori_loop(0, iterations, body, (lo, hi))
  p, total = _chi2_at(lo, losses, w)
  # Degenerate cases: all losses equal (any eta gives w), or the ball holds the vertex.
  at_top = jnp.where(real & (losses >= top), w, 0.0)
  vertex = at_top / jnp.sum(at_top)
  vertex_inside = chi2_divergence(vertex, w) <= rho
  p = jnp.where(total > 0, p, w)
  return jax.lax.stop_gradient(jnp.where(vertex_inside, vertex, p))


def cvar_best_response(
  losses: jax.Array, alpha: float, weights: Optional[jax.Array] = None, *, iterations: int = 60
) -> jax.Array:
  """The CVaR_alpha best response ``p*`` (see the module docstring), by bisection on ``eta``."""
  losses = jnp.asarray(losses)
  w = _uniform_weights(losses, weights)
  real = w > 0
  big = jnp.finfo(losses.dtype).max
  top = jnp.max(jnp.where(real, losses, -big))
  low_l = jnp.min(jnp.where(real, losses, big))
  mass = lambda eta: jnp.sum(jnp.where(real & (losses > eta), w, 0.0)) / alpha
  # Invariant: mass(lo) >= 1 > mass(hi).
  lo, hi = low_l - 1.0 - jnp.abs(low_l), top

  def body(_, bounds):
    lo, hi = bounds
    mid = 0.5 * (lo + hi)
    enough = mass(mid) >= 1.0
    return jnp.where(enough, mid, lo), jnp.where(enough, hi, mid)

  lo, hi = jax.lax.fori_loop(0, iterations, body, (lo, hi))
  full = real & (losses > hi)
  boundary = real & (losses > lo) & ~full
  capped = jnp.where(full, w / alpha, 0.0)
  rest = jnp.maximum(1.0 - jnp.sum(capped), 0.0)
  share = jnp.where(boundary, w, 0.0)
  share_total = jnp.sum(share)
  p = capped + rest * share / jnp.where(share_total > 0, share_total, 1.0)
  return jax.lax.stop_gradient(p / jnp.sum(p))


def best_response(losses, geometry: str, size: float, weights=None, *, iterations: int = 60):
  """The FastDRO weights for ``geometry`` in ``("chi2", "cvar")`` and its ``size``."""
  if geometry == "chi2":
    return chi2_best_response(losses, size, weights, iterations=iterations)
  return cvar_best_response(losses, size, weights, iterations=iterations)


class FastDROState(NamedTuple):
  count: jnp.ndarray  # type: ignore[assignment]  # NamedTuple field shadows tuple.count
  opt_state: optax.OptState


def _check_size(geometry: str, size) -> float:
  _validate.one_of("geometry", geometry, GEOMETRIES)
  if geometry == "chi2":
    return _validate.positive("size", size)
  return _validate.open_unit("size", size, closed_right=True)


def _example_losses(example_losses_fn, name):
  return extend.require(
    "example_losses_fn (per-example losses of the batch)", example_losses_fn, name
  )


# sample reweighting on the one-"example" loss [Phi(x)]: p* = [1], i.e. GD on Phi
@extend.register(settings={"fastdro": dict(learning_rate=0.1, geometry="cvar", size=0.5)})
@extend.factory(static=("local_steps", "iterations", "optimizer"))
def fastdro(
  learning_rate: Optional[extend.ScalarOrSchedule] = None,
  local_steps: int = 1,
  *,
  geometry: str = "chi2",
  size: float = 1.0,
  iterations: int = 60,
  optimizer: extend.Optimizer = None,
) -> extend.Algorithm:
  r"""FastDRO (Levy, Carmon, Duchi, Sidford 2020): mini-batch DRO by best-response weights.

  The FastDRO baseline of SPEC 3 (paper 004's imbalanced-CIFAR experiment, E5) for
  sample-level DRO on a plain per-example loss :math:`\ell_i(x)` (the problem's ``h``,
  read through the ``example_losses_fn`` oracle). Per step, on the client's mini-batch
  with empirical weights :math:`w_i` (``example_weights``: :math:`1/b`, 0 on padding):

  .. math::

     p^\star = \mathop{\arg\max}_{p \in U(w)} \sum_i p_i \ell_i(x), \qquad
     x \leftarrow x - \eta\, \nabla_x \sum_i p^\star_i \ell_i(x)
       \quad (p^\star \text{ held fixed}),

  with the uncertainty set, found by ``iterations`` steps of bisection on the dual
  variable (see the module docstring):

  * ``geometry="chi2"``, ``size`` :math:`= \rho`:
    :math:`U = \{p \in \Delta : \frac{1}{2} \sum_i w_i (p_i / w_i - 1)^2 \le \rho\}`;
  * ``geometry="cvar"``, ``size`` :math:`= \alpha`:
    :math:`U = \{p \in \Delta : p_i \le w_i / \alpha\}`, the mean of the largest
    :math:`\alpha` fraction of the losses (:math:`\alpha = 1` is ERM).

  *Parallel form* (paper 004's centralised baselines, SPEC E5): every client computes the
  best response on its own mini-batch, and the server averages the models (uniformly) every
  ``local_steps`` steps; with the default 1 this is data-parallel FastDRO with the
  per-client batch.

  Communication: only the parameters, ``d`` floats each way per sampled client per round.
  Client state ``FastDROState(count, opt_state)``: nothing beyond the optimizer.

  Args:
    learning_rate: the SGD rate :math:`\eta > 0` or an optax schedule; ``None``: 0.01
      (paper 004's grid: :math:`\{0.001, 0.01, 0.05, 0.1\}`).
    local_steps: steps between model averages, a positive int (1, the default: the
      paper's data-parallel baseline).
    geometry: ``"chi2"`` (default; :math:`\chi^2` ball of radius ``size`` :math:`= \rho`)
      or ``"cvar"`` (CVaR at level ``size`` :math:`= \alpha`).
    size: the uncertainty set's size: :math:`\rho > 0` for ``"chi2"``, :math:`\alpha \in
      (0, 1]` for ``"cvar"``; default 1.0.
    iterations: bisection steps, a positive int (the default 60 halves the bracket to
      float precision).
    optimizer: the parameter step: ``None`` (``optax.sgd(learning_rate)``), a factory of the
      learning rate (``optax.adam``) or an optax transform with its own rate (then no
      ``learning_rate``).

  Returns:
    A :class:`fedco.Algorithm` (``problem_kind="plain"``) named ``"fastdro_chi2"`` or
    ``"fastdro_cvar"``.

  Raises:
    ValueError: ``geometry`` is not one of the two, ``size`` is outside its range,
      ``iterations`` is not a positive int, the learning rate is not positive, or both
      ``learning_rate`` and an optax transform ``optimizer`` are given; from ``update``, a
      problem without a per-example loss (no ``example_losses_fn``).

  Examples:
    Four examples :math:`\ell_i(x) = \frac{1}{2}\|x - a_i\|^2` with losses
    :math:`(0.5, 0.5, 2, 8)` at :math:`x = 0`: CVaR at :math:`\alpha = 0.5` puts all the
    weight on the two largest, so the step is :math:`0.1 \cdot (a_3 + a_4) / 2` (ERM's,
    :math:`\alpha = 1`, would be :math:`0.1 \cdot (0.75, 1.25)`, the mean of all four):

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> problem = fedco.problems.plain(lambda x, e: 0.5 * jnp.sum((x - e["a"]) ** 2))
    >>> batch = {"a": jnp.array([[1.0, 0.0], [0.0, 1.0], [2.0, 0.0], [0.0, 4.0]])}
    >>> _, oracles = fedco.oracle_args(problem, batch, batch)
    >>> alg = fedco.fastdro(0.1, geometry="cvar", size=0.5)
    >>> alg.name, alg.plan.local_steps
    ('fastdro_cvar', 1)
    >>> step_fn = jax.jit(lambda x: alg.update(None, alg.init(x), x, **oracles))
    >>> updates, _ = step_fn(jnp.zeros(2))
    >>> [round(v, 3) for v in updates.tolist()]
    [0.1, 0.2]
  """
  size = _check_size(geometry, size)
  iterations = _validate.positive_int("iterations", iterations)
  opt = extend.param_optimizer(learning_rate, optimizer, default=0.01)
  plan = extend.make_plan(local_steps)
  name = f"fastdro_{geometry}"

  def init(params, *, inner_value=None):
    del inner_value
    return FastDROState(jnp.zeros([], jnp.int32), opt.init(params))

  def update(
    updates, state, params=None, *, example_losses_fn=None, example_weights=None, **unused
  ):
    del updates, unused
    losses_fn = _example_losses(example_losses_fn, name)
    p = best_response(losses_fn(params), geometry, size, example_weights, iterations=iterations)
    z = jax.grad(lambda x: jnp.sum(p * losses_fn(x)))(params)
    step, opt_state = opt.update(z, state.opt_state, params)
    return step, FastDROState(state.count + 1, opt_state)

  return extend.Algorithm(init, update, plan, extend.averaging_server(), name, "plain")


class PrimalDualState(NamedTuple):
  """Client state: the server's example weights ``p`` and this round's loss report ``v``."""

  count: jnp.ndarray  # type: ignore[assignment]  # NamedTuple field shadows tuple.count
  p: jnp.ndarray
  ascent: jnp.ndarray
  opt_state: optax.OptState


# N p_i-weighted steps on 130 rows: more than one local step diverges at this rate
@extend.register(
  settings={"primal_dual_dro": dict(learning_rate=0.1, local_steps=1, weights_lr=0.01)}
)
@extend.factory(static=("local_steps", "num_examples", "optimizer"))
def primal_dual_dro(
  learning_rate: Optional[extend.ScalarOrSchedule] = None,
  local_steps: int = 1,
  *,
  num_examples: int,
  weights_lr: float = 0.01,
  reg: float = 0.0,
  optimizer: extend.Optimizer = None,
) -> extend.Algorithm:
  r"""Primal-dual SGD for sample-level DRO (Namkoong and Duchi 2016), federated.

  The primal-dual SGD baseline of SPEC 3 (paper 004's imbalanced-CIFAR experiment, E5) on
  a plain per-example loss :math:`\ell_i(x)` (the problem's ``h``): weights :math:`p` on the
  simplex over *all* :math:`N` training examples (uniform at first) and the saddle problem
  :math:`\min_x \max_{p \in \Delta_N} \sum_i p_i \ell_i(x) - \frac{r N}{2}
  \sum_i (p_i - 1/N)^2`. A step on client :math:`k`, with mini-batch rows
  :math:`i_1, \dots, i_b` (the runtime's ``example_rows``):

  .. math::

     x &\leftarrow x - \eta\, \nabla_x \frac{N}{b} \sum_j p_{i_j} \ell_{i_j}(x)
       \quad \text{(importance weights } N p_i \text{; ERM at } p = 1/N \text{)}, \\
     v_k &\mathrel{+}= \frac{1}{b} \sum_j \ell_{i_j}(x)\, e_{i_j}
       \quad \text{(summed over the round's steps, reset at its start)}.

  After the round's ``local_steps`` steps the server averages the models weighted by data
  size (``weighting="samples"``, so the mean step is unbiased for the full gradient) and
  ascends, with :math:`S` the round's :math:`m` of :math:`K` clients and :math:`n_k`
  their sizes:

  .. math::

     p \leftarrow \mathrm{Proj}_{\Delta_N}\Big(p + \eta_p \Big(\frac{K}{m} \sum_{k \in S}
       n_k v_k - r N (p - 1/N)\Big)\Big).

  :math:`r = 0` (``reg``) is SPEC 3's plain projected ascent.

  Communication: clients hold :math:`p` (``N`` floats, sent down every round and at
  initialisation: the plan's ``every_round=("p",)``, ``at_init=("p",)``; as an
  ``every_round`` field it also travels up, and the ledger counts those ``N`` floats,
  though the server does not read them) and report :math:`v_k` (``report=("ascent",)``,
  an ``N``-vector of which only ``b * local_steps`` entries are non-zero). Client state
  ``PrimalDualState(count, p, ascent, opt_state)``.

  Args:
    learning_rate: the model SGD rate :math:`\eta > 0` or an optax schedule; ``None``: 0.01
      (paper 004's grid: :math:`\{0.001, 0.01, 0.05, 0.1\}`).
    local_steps: steps between synchronisations of the model and :math:`p`, a positive int
      (1, the default: parallel SGD as in paper 004).
    num_examples: :math:`N`, required: the number of rows of the training data's
      ``examples`` (every row owned by a client); :math:`p` has one weight per row.
    weights_lr: the ascent rate :math:`\eta_p > 0` on :math:`p`; default 0.01.
    reg: the :math:`\chi^2` penalty :math:`r \ge 0` on :math:`p`; default 0 (SPEC 3's plain
      projected ascent).
    optimizer: the parameter step: ``None`` (``optax.sgd(learning_rate)``), a factory of the
      learning rate (``optax.adam``) or an optax transform with its own rate (then no
      ``learning_rate``).

  Returns:
    A :class:`fedco.Algorithm` (``problem_kind="plain"``) whose ``server`` is a
    :class:`fedco.algorithms.ServerAggregator` that steps the model and :math:`p`.

  Raises:
    ValueError: ``num_examples`` or ``local_steps`` is not a positive int, ``weights_lr``
      or the learning rate is not positive, ``reg`` is negative, or both ``learning_rate``
      and an optax transform ``optimizer`` are given; from ``update``, a problem without a
      per-example loss or a call without ``example_rows``.

  Examples:
    One step of a client holding rows 1 and 3 of :math:`N = 4` examples, with
    :math:`\ell_i(x) = \frac{1}{2}\|x - a_i\|^2`: at uniform :math:`p` the step is ERM's,
    and the report holds :math:`\ell_i / b` on the batch's rows only:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> problem = fedco.problems.plain(lambda x, e: 0.5 * jnp.sum((x - e["a"]) ** 2))
    >>> batch = {"a": jnp.array([[1.0, 0.0], [0.0, 2.0]])}  # losses 0.5 and 2 at x = 0
    >>> _, oracles = fedco.oracle_args(problem, batch, batch)
    >>> alg = fedco.primal_dual_dro(0.1, num_examples=4, weights_lr=0.1)
    >>> alg.plan.every_round, alg.plan.report
    (('p',), ('ascent',))
    >>> step_fn = jax.jit(lambda x: alg.update(None, alg.init(x), x,
    ...                                        example_rows=jnp.array([1, 3]), **oracles))
    >>> updates, state = step_fn(jnp.zeros(2))
    >>> [round(v, 3) for v in updates.tolist()]  # -0.1 * mean_i (x - a_i)
    [0.05, 0.1]
    >>> [round(v, 3) for v in state.ascent.tolist()]
    [0.0, 0.25, 0.0, 1.0]
  """
  n_total = _validate.positive_int("num_examples", num_examples)
  eta_p = _validate.positive("weights_lr", weights_lr)
  reg = _validate.positive("reg", reg, allow_zero=True)
  opt = extend.param_optimizer(learning_rate, optimizer, default=0.01)
  period = _validate.positive_int("local_steps", local_steps)
  plan = extend.make_plan(
    period, every_round=("p",), report=("ascent",), weighting="samples", at_init=("p",)
  )

  def init(params, *, inner_value=None):
    del inner_value
    p = jnp.full((n_total,), 1.0 / n_total, jnp.float32)
    return PrimalDualState(
      jnp.zeros([], jnp.int32), p, jnp.zeros((n_total,), jnp.float32), opt.init(params)
    )

  def update(
    updates,
    state,
    params=None,
    *,
    example_losses_fn=None,
    example_weights=None,
    example_rows=None,
    local_step=None,
    **unused,
  ):
    del updates, unused
    losses_fn = _example_losses(example_losses_fn, "primal_dual_dro")
    rows = extend.require(
      "example_rows (global ids of the batch's examples)", example_rows, "primal_dual_dro"
    )
    rows = jnp.asarray(rows, jnp.int32)
    w = _uniform_weights(jnp.zeros(rows.shape, jnp.float32), example_weights)
    importance = jax.lax.stop_gradient(n_total * state.p[rows] * w)
    losses, vjp = jax.vjp(losses_fn, params)
    (z,) = vjp(importance.astype(losses.dtype))
    step, opt_state = opt.update(z, state.opt_state, params)
    first = extend.at_round_start(local_step, state.count, period)
    ascent = jnp.where(first, 0.0, state.ascent)
    ascent = ascent.at[rows].add(jax.lax.stop_gradient(w * losses).astype(ascent.dtype))
    return step, PrimalDualState(state.count + 1, state.p, ascent, opt_state)

  def server_init(server, counts):
    del server, counts
    return ()

  def server_update(server, state, client_values, info):
    alive = info.alive_mask.astype(jnp.float32)
    params = extend.weighted_client_mean(client_values["params"], info.weights)
    scale = (info.num_clients / info.ids.shape[0]) * alive * info.counts.astype(jnp.float32)
    v = jnp.tensordot(scale, client_values["ascent"], axes=1)
    p = server["p"]
    p = extend.project_simplex(p + eta_p * (v - reg * n_total * (p - 1.0 / n_total)))
    anyone = jnp.any(info.alive_mask)
    return {"params": params, "p": jnp.where(anyone, p, server["p"])}, state

  return extend.Algorithm(
    init,
    update,
    plan,
    extend.ServerAggregator(server_init, server_update),
    "primal_dual_dro",
    "plain",
  )
