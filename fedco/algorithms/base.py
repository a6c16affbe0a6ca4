"""The algorithm contract: an optax-style client transform, a communication plan, a server.

Every fedco algorithm is an :class:`Algorithm`, a ``NamedTuple`` whose first two fields are
the optax pair, so it drops into a user's own loop like any optax optimizer::

    opt = fedco.local_scgdm(learning_rate=1.0, beta=0.01, alpha=0.8, gamma=0.7)
    state = opt.init(params, inner_value=g(params, batch0))
    updates, state = opt.update(grad_h, state, params,
                                inner_fn=lambda x: g(x, batch),
                                outer_fn=lambda y: f(y, batch_f))
    params = optax.apply_updates(params, updates)

``update(updates, state, params, *, inner_fn, outer_fn, next_inner_fn, **unused)``:

* ``updates`` is the gradient of the non-compositional term ``grad h(x; xi)`` (or ``None``
  when there is none); plain FedAvg steps on it alone.
* ``inner_fn(x)`` evaluates ``g(x; zeta)`` on this step's inner sample ``zeta`` at any point
  ``x``; the algorithm differentiates it with one ``jax.vjp``.
* ``outer_fn(y)`` evaluates ``f(y; xi)``; the algorithm takes its gradient.
* ``next_inner_fn(x)`` evaluates ``g(x; zeta')`` on an independent sample, used to refresh
  trackers at the new iterate (FedDRO, DS-FedDRO, FedAvg-CO). Defaults to ``inner_fn``.
* ``extra_fn(x)`` evaluates ``h(x; xi)`` (the loss value plain baselines report).
* ``round_key`` is a PRNG key shared by all clients of the round (DRFA's snapshot step).
* ``local_step`` is the step's index within the round, ``0 .. local_steps - 1`` (Ditto
  anchors its personal model to the model the round started from at step 0).
* ``example_losses_fn(x)`` gives the per-example values ``h(x; xi_i)`` of the outer batch
  and ``example_weights`` their batch weights; ``example_rows`` are the outer batch's
  global example ids (sample-reweighting baselines: FastDRO, primal-dual DRO).
* Unknown keyword arguments are accepted and ignored (optax's extra-args contract).

``init(params, *, inner_value=None)`` is optax's ``init`` plus the first inner sample
``g(x_0; zeta_0)``: trackers need its pytree structure and value. It is the one departure
from optax's signature; algorithms without trackers ignore it.

The *communication plan* tells the federated runtime what to average and when; the
*server* is an optax transformation applied to pseudo-gradients
``server_value - mean_k client_value`` of the parameters and the round-synchronised state,
so plain averaging is ``optax.sgd(1.0)`` and DS-FedDRO's two-sided rates are server SGD.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
import optax

from fedco import _validate

PyTree = Any


class CommPlan(NamedTuple):
  """What the runtime communicates, and when.

  Attributes:
    local_steps: steps per round (``I``, ``tau`` or ``p`` in the papers); the parameters and
      the ``every_round`` state fields are aggregated after every ``local_steps`` steps.
    every_step: state fields averaged over the round's clients after every step (FedDRO's
      ``y``). The mean is plain, never passed through the server transform.
    every_round: state fields aggregated with the parameters at the end of every round,
      through the server transform (Local-SCGDM's ``u`` and ``m``, DS-FedDRO's ``y``).
    at_init: state fields averaged over all clients once, after ``init`` (every client starts
      from the same ``y_bar_0``). ``None`` means ``every_step + every_round``.
    round_start: state fields that hold an inner value and are recomputed at the start of
      every round: each of the round's clients evaluates ``g_k(x_bar; zeta)`` at the server
      model on a fresh batch and the field becomes their mean (MBSGD's ``y_bar``).
    round_start_loss: state fields set, at the start of every round, to each client's own
      exact loss (whole training data) at the server model (q-FedAvg's and AFL's ``F_k``).
    report: state fields each client sends up at the end of a round for the server's
      aggregator to read (not broadcast back): DRFA's snapshot model, q-FedAvg's ``F_k``.
    weighting: ``"uniform"`` (each client counts equally) or ``"samples"`` (weights
      proportional to client data sizes; FedAvg's default).
  """
  local_steps: int
  every_step: Tuple[str, ...] = ()
  every_round: Tuple[str, ...] = ()
  at_init: Optional[Tuple[str, ...]] = None
  weighting: str = "uniform"
  round_start: Tuple[str, ...] = ()
  round_start_loss: Tuple[str, ...] = ()
  report: Tuple[str, ...] = ()

  @property
  def init_fields(self) -> Tuple[str, ...]:
    if self.at_init is not None:
      return tuple(self.at_init)
    return tuple(self.every_step) + tuple(self.every_round)


class Algorithm(NamedTuple):
  """An optax-style client transform plus what the federated runtime needs.

  Attributes:
    init: ``(params, *, inner_value=None) -> state``.
    update: ``(updates, state, params=None, **extra_args) -> (updates, state)``.
    plan: the :class:`CommPlan`.
    server: an optax transformation on pseudo-gradient dicts ``{"params": ..., field: ...}``,
      or a :class:`ServerAggregator` for servers that need every client's values.
    name: a short label for logs and metrics.
    problem_kind: the problem class it solves: ``"local"``, ``"global"`` or ``"plain"``.
  """
  init: Callable[..., Any]
  update: Callable[..., Tuple[PyTree, Any]]
  plan: CommPlan
  server: Any
  name: str
  problem_kind: str


def make_plan(local_steps, *, every_step=(), every_round=(), at_init=None,
              weighting="uniform", round_start=(), round_start_loss=(), report=()) -> CommPlan:
  """A validated :class:`CommPlan`."""
  _validate.positive_int("local_steps", local_steps)
  _validate.one_of("weighting", weighting, ("uniform", "samples"))
  return CommPlan(int(local_steps), tuple(every_step), tuple(every_round),
                  None if at_init is None else tuple(at_init), weighting, tuple(round_start),
                  tuple(round_start_loss), tuple(report))


class RoundInfo(NamedTuple):
  """What a server aggregator may read about the round that just ended.

  Attributes:
    ids: ``int32 [m]``, the round's clients (sorted).
    weights: ``[m]``, the plan's averaging weights for them (uniform or by data size).
    counts: ``int32 [m]``, their data sizes.
    num_clients: ``K``, all clients.
    key: a PRNG key for the server's own randomness.
    client_losses: ``(params, ids, key) -> [len(ids)]``: each listed client's loss of
      ``params`` on one fresh mini-batch of its data (DRFA's loss queries).
    alive: ``bool [m]``: which of them survived the round (client dropout); dropped
      clients' values must not count. Their ``weights`` are already 0.
  """
  ids: jax.Array
  weights: jax.Array
  counts: jax.Array
  num_clients: int
  key: jax.Array
  client_losses: Callable[..., jax.Array]
  alive: Optional[jax.Array] = None

  @property
  def alive_mask(self) -> jax.Array:
    return jnp.ones(self.ids.shape, bool) if self.alive is None else self.alive


class ServerAggregator(NamedTuple):
  """A server that sees every client's values, not only their mean.

  Attributes:
    init: ``(server_values, counts[K]) -> state``; ``server_values`` is
      ``{"params": x, field: ...}`` for the plan's ``every_round`` fields.
    update: ``(server_values, state, client_values, info: RoundInfo) ->
      (server_values, state)``; ``client_values`` holds the round's clients' ``params``,
      ``every_round`` and ``report`` fields, stacked on a leading ``[m]`` axis.
  """
  init: Callable[..., Any]
  update: Callable[..., Tuple[Any, Any]]


def weighted_client_mean(tree: PyTree, weights: jax.Array) -> PyTree:
  """``sum_i w_i v_i`` over the leading clients axis."""
  return jax.tree.map(lambda a: jnp.tensordot(weights.astype(a.dtype), a, axes=1), tree)


def optax_aggregator(tx: optax.GradientTransformation) -> ServerAggregator:
  """The usual server: ``tx`` applied to ``server - weighted mean of the clients``."""

  def init(server, counts):
    del counts
    return tx.init(server)

  def update(server, state, client_values, info):
    means = weighted_client_mean({k: client_values[k] for k in server}, info.weights)
    pseudo_grad = jax.tree.map(jnp.subtract, server, means)
    updates, state = tx.update(pseudo_grad, state, server)
    return optax.apply_updates(server, updates), state

  return ServerAggregator(init, update)


def as_aggregator(server) -> ServerAggregator:
  """An :class:`Algorithm`'s ``server`` as an aggregator (optax transforms are wrapped)."""
  if isinstance(server, ServerAggregator):
    return server
  return optax_aggregator(server)


def project_simplex(v: jax.Array) -> jax.Array:
  """Euclidean projection onto the probability simplex (sort-based; Duchi et al. 2008)."""
  n = v.shape[-1]
  u = jnp.sort(v)[::-1]
  css = jnp.cumsum(u) - 1.0
  ks = jnp.arange(1, n + 1, dtype=v.dtype)
  rho = jnp.max(jnp.where(u - css / ks > 0, ks, 0.0))
  theta = jnp.take(css, rho.astype(jnp.int32) - 1) / rho
  return jnp.maximum(v - theta, 0.0)


def averaging_server() -> optax.GradientTransformation:
  """Plain model averaging: ``server = server - 1.0 * (server - mean_k client)``."""
  return optax.sgd(1.0)


def param_optimizer(learning_rate, optimizer: Optional[optax.GradientTransformation]):
  """The parameter step: the given optax transform, or the paper's SGD with this rate."""
  if optimizer is not None:
    if not (hasattr(optimizer, "init") and hasattr(optimizer, "update")):
      raise ValueError(f"optimizer must be an optax GradientTransformation, got {optimizer!r}")
    return optimizer
  _validate.positive("learning_rate", learning_rate)
  return optax.sgd(learning_rate)


def require(name: str, value, algorithm: str):
  """Raise a clear error when a compositional algorithm is called without its oracle."""
  if value is None:
    raise ValueError(
        f"{algorithm}.update needs the keyword argument {name}; pass a callable "
        f"(see fedco.oracle_args), got None")
  return value


def oracles(name: str, inner_fn, outer_fn, next_inner_fn=None):
  """The checked ``(inner_fn, outer_fn, next_inner_fn)``; ``next_inner_fn`` defaults to
  ``inner_fn`` (one sample for everything)."""
  require("inner_fn", inner_fn, name)
  require("outer_fn", outer_fn, name)
  return inner_fn, outer_fn, inner_fn if next_inner_fn is None else next_inner_fn


def add_grads(z: PyTree, grad_h: Optional[PyTree]) -> PyTree:
  """``z + grad h`` where ``grad h`` may be ``None`` (no non-compositional term)."""
  return z if grad_h is None else jax.tree.map(jnp.add, z, grad_h)


def select(pred, on_true: PyTree, on_false: PyTree) -> PyTree:
  """Leafwise ``jnp.where(pred, on_true, on_false)``."""
  return jax.tree.map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


def require_inner_value(inner_value, algorithm: str):
  if inner_value is None:
    raise ValueError(
        f"{algorithm}.init needs inner_value=g(params, batch): its trackers take that "
        "pytree's structure and first value")
  return jax.tree.map(jnp.asarray, inner_value)
