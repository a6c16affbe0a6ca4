"""ComFedL (papers 000/001, Algorithm 1): local-inner compositional FedAvg.

Each sampled client starts from the server model and, for ``tau`` local steps, draws a batch
``B`` for ``g`` and ``B~`` for ``f`` and steps

    y = g_k(x; B),    u = J_g(x; B)^T grad f_k(y; B~) + grad h_k(x),    x = x - eta u;

the server averages the sampled clients' models (uniformly; by data size with
``weighting="samples"``). The inner value is fresh every step (no tracker), so ComFedL is
biased for a fixed batch and relies on ``b`` for accuracy.
With the client-level KL-DRO outer ``f = exp(./gamma)`` (deterministic), ``u`` reduces to
``exp(l_B(x)/gamma)/gamma * grad l_B(x)``. Named variants ComFedL-MAML and ComFedL-DAMAML are
this algorithm on the MAML and DA-MAML problems.

**Normalised client weights** (``normalized=True``, an inference from the papers' text, not
their printed algorithm). On the client-level KL-DRO exp form the literal step weighs client
``k``'s gradient by ``exp(f_k/gamma)/gamma``, which is about 5e5 at ``gamma = 0.2`` on E1 and
diverges at round 1. Paper 001 treats the exp form (its eq. 6) and the log form
``gamma log(1/n sum_i exp(f_i/gamma))`` (eq. 5) as interchangeable and reports the method
"pretty robust with different values of gamma" over [0.1, 0.5, 1, 5] and that clients with
easier distributions get a smaller rate; both fit the log form's gradient, whose client
weights are ``n softmax(f/gamma)_k`` (mean 1 over clients). So with ``normalized=True``:
each round every sampled client reports its loss at the server model on a fresh batch,
``f_k(x_bar)``, the server broadcasts the log-normaliser ``L = log(1/m sum_k
exp(f_k(x_bar)/gamma))`` (log-sum-exp, stable for any ``f/gamma``), and clients step

    y = g_k(x; B),    u = exp(y/gamma - L) J_g(x; B)^T,    x = x - eta u,

i.e. ``exp((f - c)/gamma)/Z`` with the shift ``c`` folded into ``L``. On client-level
KL-DRO the inner value is the client's scalar loss ``f``; the problem's outer function is
not used (its temperature is ``gamma``). On a problem whose outer carries an ``outer_link``
(ComFedL-DAMAML: ``exp((L_k(y) - shift)/gamma)`` around the query loss ``L_k`` of the adapted
model ``y = g_k(x)``) the loss is the one inside the link: clients report ``L_k`` at the
adapted server model on fresh support and query batches (the plan's
``round_start_value="pre_link"``) and step

    y = g_k(x; B),    u = exp(L_k(y; B~)/gamma - L) J_g(x; B)^T grad L_k(y; B~),

the gradient of ``gamma log(1/m sum_k exp(L_k/gamma))`` with the normaliser frozen for the
round (the link's shift cancels in the normalisation). One more float per client per round
goes up (the loss) and down (``L``). The weight ``exp(y/gamma - L)`` uses each local step's
own batch loss ``y`` (ComFedL tracks nothing): against a batch at the client's round-start
loss ``f_k``, the step is ``exp((y - f_k)/gamma)`` times larger, about 20 for a batch 0.6
above it at ``gamma = 0.2``. On E1 with real MNIST and ``weighting="samples"`` at
learning rate 0.01 that diverges on 4 of 10 seeds; at ``gamma = 0.5`` those 4 finish
(README, "On real MNIST").

**The prior over clients** (``weighting``). The papers' problem centres the KL ball at the
uniform ``1/K``: the server averages uniformly and ``L`` is the uniform mean. With
``weighting="samples"`` the centre is the clients' data mixture ``p_k = n_k / N``: the server
averages with ``p_k`` and ``L = log(sum_k p_k exp(f_k/gamma))``, so the rounds follow
``gamma log sum_k p_k exp(f_k/gamma)``, which tends to FedAvg's objective ``sum_k p_k f_k`` as
``gamma`` grows (the uniform prior tends to uniformly weighted FedAvg instead). On the
literal step the same weights turn the exp form into ``sum_k p_k exp(f_k/gamma)``. The
problem's reported ``objective`` stays its own uniform mean over clients (as for FedAvg by
data size).

References:
  Wu, Huang et al., "Federated compositional optimization / ComFedL" (papers 000 and 001).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedco import _validate, estimators
from fedco.algorithms import base


class ComFedLState(NamedTuple):
  count: jnp.ndarray
  opt_state: optax.OptState


class NormalizedComFedLState(NamedTuple):
  """``log_normalizer``: this round's ``L``, set by the server before the local steps."""

  count: jnp.ndarray
  log_normalizer: jnp.ndarray
  opt_state: optax.OptState


@base.register(settings={"comfedl": dict(learning_rate=0.1)})
@base.factory(static=("local_steps", "optimizer", "normalized", "gamma", "weighting"))
def comfedl(
  learning_rate: Optional[base.ScalarOrSchedule] = None,
  local_steps: int = 5,
  *,
  normalized: bool = False,
  gamma: Optional[float] = None,
  weighting: str = "uniform",
  optimizer: base.Optimizer = None,
) -> base.Algorithm:
  """ComFedL.

  Args:
    learning_rate: ``eta > 0`` or a schedule; ``None``: 0.01 (paper 001's E1).
    local_steps: ``tau``, local steps per round.
    normalized: step with the normalised client weights ``exp(f/gamma - L)`` (see the
      module) instead of the literal ``exp(f/gamma)/gamma``; needs ``gamma``.
    gamma: the KL temperature of the client-level DRO problem (``normalized`` only).
    weighting: the prior of the client-level problem and the server's averaging weights:
      ``"uniform"`` (``1/K``, the papers') or ``"samples"`` (the data sizes ``n_k / N``;
      see the module).
    optimizer: the parameter step: ``None`` (``optax.sgd(eta)``), a factory of the learning
      rate (``optax.adam``) or an optax transform with its own rate (then no
      ``learning_rate``).

  Returns:
    An :class:`~fedco.algorithms.base.Algorithm` (local-inner; sends ``d`` floats up and
    down per sampled client per round, one more each way when normalised). In a user's own
    loop with ``normalized=True`` the caller plays the server: set ``log_normalizer`` with
    ``fedco.algorithms.set_fields`` before a round's updates.
  """
  opt = base.param_optimizer(learning_rate, optimizer, default=0.01)
  if not isinstance(normalized, bool):
    raise ValueError(f"normalized must be a bool, got {normalized!r}")
  if normalized:
    gamma = _validate.positive("gamma", gamma)
  elif gamma is not None:
    raise ValueError(
      f"gamma={gamma!r} is only used with normalized=True (the literal step "
      "reads the temperature from the problem's outer function)"
    )
  if not normalized:
    plan = base.make_plan(local_steps, weighting=weighting)
  else:

    def log_normalizer(losses, weights):
      """``log(sum_k w_k exp(f_k/gamma))`` over the surviving clients (``w`` sums to 1)."""
      return jax.nn.logsumexp(losses / gamma, b=weights)

    plan = base.make_plan(
      local_steps,
      round_start=("log_normalizer",),
      at_init=(),
      round_start_reduce=log_normalizer,
      round_start_value="pre_link",
      weighting=weighting,
    )

  def init(params, *, inner_value=None):
    del inner_value
    if normalized:
      return NormalizedComFedLState(
        jnp.zeros([], jnp.int32), jnp.zeros([], jnp.result_type(float)), opt.init(params)
      )
    return ComFedLState(jnp.zeros([], jnp.int32), opt.init(params))

  def update(
    updates, state, params=None, *, inner_fn=None, outer_fn=None, unlinked_outer_fn=None, **unused
  ):
    del unused
    inner_fn, outer_fn, _ = base.oracles("comfedl", inner_fn, outer_fn)
    sample, pullback = estimators.inner_vjp(inner_fn, params)
    if normalized and unlinked_outer_fn is not None:  # the loss inside the problem's link
      loss, grad_y = jax.value_and_grad(unlinked_outer_fn)(sample)
      weight = jnp.exp(loss / gamma - state.log_normalizer).astype(loss.dtype)
      z = base.add_grads(pullback(jax.tree.map(lambda g: weight * g, grad_y)), updates)
      step, opt_state = opt.update(z, state.opt_state, params)
      return step, state._replace(count=state.count + 1, opt_state=opt_state)
    if normalized:
      leaves = jax.tree.leaves(sample)
      if (
        len(leaves) != 1 or jax.tree.structure(sample).num_nodes != 1 or jnp.shape(leaves[0]) != ()
      ):
        raise ValueError(
          "comfedl(normalized=True) needs a scalar inner value (the client's "
          "loss, as in fedco.problems.client_kl_dro) or a problem with an "
          "outer_link (DA-MAML), got an inner value of shapes "
          f"{jax.tree.map(jnp.shape, sample)} and no link"
        )
      weight = jnp.exp(sample / gamma - state.log_normalizer)
      z = base.add_grads(pullback(weight.astype(sample.dtype)), updates)
      step, opt_state = opt.update(z, state.opt_state, params)
      return step, state._replace(count=state.count + 1, opt_state=opt_state)
    z = base.add_grads(estimators.compositional_grad(pullback, outer_fn, sample), updates)
    step, opt_state = opt.update(z, state.opt_state, params)
    return step, ComFedLState(state.count + 1, opt_state)

  return base.Algorithm(init, update, plan, base.averaging_server(), "comfedl", "local")
