"""ComFedL (papers 000/001, Algorithm 1): local-inner compositional FedAvg.

Each sampled client starts from the server model and, for ``tau`` local steps, draws a batch
``B`` for ``g`` and ``B~`` for ``f`` and steps

    y = g_k(x; B),    u = J_g(x; B)^T grad f_k(y; B~) + grad h_k(x),    x = x - eta u;

the server averages the sampled clients' models (unweighted). The inner value is fresh every
step (no tracker), so ComFedL is biased for a fixed batch and relies on ``b`` for accuracy.
With the client-level KL-DRO outer ``f = exp(./gamma)`` (deterministic), ``u`` reduces to
``exp(l_B(x)/gamma)/gamma * grad l_B(x)``. Named variants ComFedL-MAML and ComFedL-DAMAML are
this algorithm on the MAML and DA-MAML problems.

References:
  Wu, Huang et al., "Federated compositional optimization / ComFedL" (papers 000 and 001).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax.numpy as jnp
import optax

from fedco import estimators
from fedco.algorithms import base


class ComFedLState(NamedTuple):
  count: jnp.ndarray
  opt_state: optax.OptState


@base.factory(static=("local_steps", "optimizer"))
def comfedl(learning_rate: Optional[base.ScalarOrSchedule] = None, local_steps: int = 5, *,
            optimizer: base.Optimizer = None) -> base.Algorithm:
  """ComFedL.

  Args:
    learning_rate: ``eta > 0`` or a schedule; ``None``: 0.01 (paper 001's E1).
    local_steps: ``tau``, local steps per round.
    optimizer: the parameter step: ``None`` (``optax.sgd(eta)``), a factory of the learning
      rate (``optax.adam``) or an optax transform with its own rate (then no
      ``learning_rate``).

  Returns:
    An :class:`~fedco.algorithms.base.Algorithm` (local-inner; sends ``d`` floats up and
    down per sampled client per round).
  """
  opt = base.param_optimizer(learning_rate, optimizer, default=0.01)
  plan = base.make_plan(local_steps)

  def init(params, *, inner_value=None):
    del inner_value
    return ComFedLState(jnp.zeros([], jnp.int32), opt.init(params))

  def update(updates, state, params=None, *, inner_fn=None, outer_fn=None, **unused):
    del unused
    inner_fn, outer_fn, _ = base.oracles("comfedl", inner_fn, outer_fn)
    sample, pullback = estimators.inner_vjp(inner_fn, params)
    z = base.add_grads(estimators.compositional_grad(pullback, outer_fn, sample), updates)
    step, opt_state = opt.update(z, state.opt_state, params)
    return step, ComFedLState(state.count + 1, opt_state)

  return base.Algorithm(init, update, plan, base.averaging_server(), "comfedl", "local")
