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

from fedco import _validate
from fedco.algorithms import base

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
  count: jnp.ndarray
  opt_state: optax.OptState


def _check_size(geometry: str, size) -> float:
  _validate.one_of("geometry", geometry, GEOMETRIES)
  if geometry == "chi2":
    return _validate.positive("size", size)
  return _validate.open_unit("size", size, closed_right=True)


def _example_losses(example_losses_fn, name):
  return base.require(
    "example_losses_fn (per-example losses of the batch)", example_losses_fn, name
  )


# sample reweighting on the one-"example" loss [Phi(x)]: p* = [1], i.e. GD on Phi
@base.register(settings={"fastdro": dict(learning_rate=0.1, geometry="cvar", size=0.5)})
@base.factory(static=("local_steps", "iterations", "optimizer"))
def fastdro(
  learning_rate: Optional[base.ScalarOrSchedule] = None,
  local_steps: int = 1,
  *,
  geometry: str = "chi2",
  size: float = 1.0,
  iterations: int = 60,
  optimizer: base.Optimizer = None,
) -> base.Algorithm:
  """FastDRO in parallel form (see the module docstring).

  Args:
    learning_rate: SGD rate ``> 0`` or a schedule; ``None``: 0.01.
    local_steps: steps between model averages (1: the paper's data-parallel baseline).
    geometry: ``"chi2"`` (chi^2 ball of radius ``size = rho > 0``) or ``"cvar"`` (CVaR at
      level ``size = alpha`` in ``(0, 1]``).
    size: the uncertainty set's size, as above.
    iterations: bisection steps (60 halve the bracket to float precision).
    optimizer: the parameter step: ``None`` (``optax.sgd(learning_rate)``), a factory of the
      learning rate (``optax.adam``) or an optax transform with its own rate (then no
      ``learning_rate``).
  """
  size = _check_size(geometry, size)
  iterations = _validate.positive_int("iterations", iterations)
  opt = base.param_optimizer(learning_rate, optimizer, default=0.01)
  plan = base.make_plan(local_steps)
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

  return base.Algorithm(init, update, plan, base.averaging_server(), name, "plain")


class PrimalDualState(NamedTuple):
  """Client state: the server's example weights ``p`` and this round's loss report ``v``."""

  count: jnp.ndarray
  p: jnp.ndarray
  ascent: jnp.ndarray
  opt_state: optax.OptState


# N p_i-weighted steps on 130 rows: more than one local step diverges at this rate
@base.register(
  settings={"primal_dual_dro": dict(learning_rate=0.1, local_steps=1, weights_lr=0.01)}
)
@base.factory(static=("local_steps", "num_examples", "optimizer"))
def primal_dual_dro(
  learning_rate: Optional[base.ScalarOrSchedule] = None,
  local_steps: int = 1,
  *,
  num_examples: int,
  weights_lr: float = 0.01,
  reg: float = 0.0,
  optimizer: base.Optimizer = None,
) -> base.Algorithm:
  """Primal-dual SGD for sample-level DRO (see the module docstring).

  Args:
    learning_rate: model SGD rate ``> 0`` or a schedule; ``None``: 0.01.
    local_steps: steps between synchronisations of the model and ``p`` (1: parallel SGD).
    num_examples: ``N``, the number of rows of the training data's ``examples`` (every row
      owned by a client); ``p`` has one weight per row.
    weights_lr: ascent rate on ``p``, ``> 0``.
    reg: chi^2 penalty ``>= 0`` on ``p`` (0: SPEC 3's plain projected ascent).
    optimizer: the parameter step: ``None`` (``optax.sgd(learning_rate)``), a factory of the
      learning rate (``optax.adam``) or an optax transform with its own rate (then no
      ``learning_rate``).
  """
  n_total = _validate.positive_int("num_examples", num_examples)
  eta_p = _validate.positive("weights_lr", weights_lr)
  reg = _validate.positive("reg", reg, allow_zero=True)
  opt = base.param_optimizer(learning_rate, optimizer, default=0.01)
  period = _validate.positive_int("local_steps", local_steps)
  plan = base.make_plan(
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
    rows = base.require(
      "example_rows (global ids of the batch's examples)", example_rows, "primal_dual_dro"
    )
    rows = jnp.asarray(rows, jnp.int32)
    w = _uniform_weights(jnp.zeros(rows.shape, jnp.float32), example_weights)
    importance = jax.lax.stop_gradient(n_total * state.p[rows] * w)
    losses, vjp = jax.vjp(losses_fn, params)
    (z,) = vjp(importance.astype(losses.dtype))
    step, opt_state = opt.update(z, state.opt_state, params)
    first = base.at_round_start(local_step, state.count, period)
    ascent = jnp.where(first, 0.0, state.ascent)
    ascent = ascent.at[rows].add(jax.lax.stop_gradient(w * losses).astype(ascent.dtype))
    return step, PrimalDualState(state.count + 1, state.p, ascent, opt_state)

  def server_init(server, counts):
    del server, counts
    return ()

  def server_update(server, state, client_values, info):
    alive = info.alive_mask.astype(jnp.float32)
    params = base.weighted_client_mean(client_values["params"], info.weights)
    scale = (info.num_clients / info.ids.shape[0]) * alive * info.counts.astype(jnp.float32)
    v = jnp.tensordot(scale, client_values["ascent"], axes=1)
    p = server["p"]
    p = base.project_simplex(p + eta_p * (v - reg * n_total * (p - 1.0 / n_total)))
    anyone = jnp.any(info.alive_mask)
    return {"params": params, "p": jnp.where(anyone, p, server["p"])}, state

  return base.Algorithm(
    init,
    update,
    plan,
    base.ServerAggregator(server_init, server_update),
    "primal_dual_dro",
    "plain",
  )
