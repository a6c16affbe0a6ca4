r"""SCAFFOLD (Karimireddy et al. 2020), option II control variates, partial participation.

On a plain problem (``updates = grad h_i(y)``, client ``i``'s loss gradient). The server
holds the model ``x`` and a control variate ``c``; every client ``i`` of ``N`` keeps its own
control variate ``c_i`` (0 at first) from round to round. A round, with ``S`` the round's
clients (those that survive it)::

    y_i = x
    K times:  y_i = y_i - eta (g_i(y_i) - c_i + c)                     (local steps)
    c_i+ = c_i - c + (x - y_i) / (K eta)                               (option II)
    upload  dy_i = y_i - x,  dc_i = c_i+ - c_i;   then c_i = c_i+
    x = x + eta_g mean_S dy_i,   c = c + (|S| / N) mean_S dc_i         (server)

With SGD at a constant rate, ``c_i - c + (x - y_i) / (k eta)`` after ``k`` steps is the mean
of the ``k`` gradients ``g_i(y_i)`` the steps took (``c`` and ``c_i`` are fixed during a
round), so the client computes ``c_i+`` as that running mean: option II "reuses the
previously computed gradients", with any rate schedule or optax ``optimizer`` (then it is
the average gradient, no longer the printed ratio).

In fedco terms (the client-state contract of :mod:`fedco.extend`):

* ``c`` is an ``every_round`` field: the server's value arrives in it at the round's start
  and the client uploads ``dc_i`` by leaving ``c + dc_i`` in it. The round's ``c`` is kept in
  ``c_round`` for the steps.
* ``c_i`` (the control variate the steps use) and ``c_plus`` (``c_i+`` from the steps done
  so far) are private. Both are updated at *every* step, so a straggler that stops after
  ``k < K`` steps uploads its ``k``-step values; ``c_plus`` becomes ``c_i`` at the client's
  next round start (:func:`fedco.extend.at_round_start`), whenever that is. A client that
  drops out of a round takes no step, keeps its state and counts nowhere on the server.
* The server is a :class:`~fedco.extend.ServerAggregator` that reads the round's client
  weights and who survived (:class:`~fedco.extend.RoundInfo`) for ``|S| / N``.

**Choices**: client means are uniform (the paper's); ``|S|`` counts the round's surviving
clients. In a user's own loop (one client, nobody playing the server) the ``c`` the client
leaves is the next round's ``c``, which is the server with ``N = |S| = 1``: ``c = c_i`` and
the steps are plain SGD.

Reference:
  Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, "SCAFFOLD: stochastic controlled averaging
  for federated learning" (ICML 2020), Algorithm 1 (option II).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedco import extend


class ScaffoldState(NamedTuple):
  """Client state: the server's ``c`` (broadcast; holds the upload ``c + dc_i``), the
  round's ``c`` (``c_round``), the client's ``c_i`` and its candidate ``c_plus``."""

  count: jnp.ndarray  # type: ignore[assignment]  # NamedTuple field shadows tuple.count
  c: Any
  c_round: Any
  c_i: Any
  c_plus: Any
  opt_state: optax.OptState


@extend.register(settings={"scaffold": dict(learning_rate=0.1, server_lr=1.0)})
@extend.factory(static=("local_steps", "optimizer"))
def scaffold(
  learning_rate: Optional[extend.ScalarOrSchedule] = None,
  local_steps: int = 5,
  *,
  server_lr: float = 1.0,
  optimizer: extend.Optimizer = None,
) -> extend.Algorithm:
  r"""SCAFFOLD (Karimireddy et al. 2020): control variates correct the clients' drift.

  A baseline for **plain** problems :math:`\frac{1}{N}\sum_i h_i(x)`, option II control
  variates, partial participation. The server holds the model :math:`x` and a control
  variate :math:`c`; each of the :math:`N` clients keeps its own :math:`c_i` (0 at first)
  from round to round. A round with clients :math:`S` (those that survive it):

  .. math::

    y_i &= x, \qquad y_i \leftarrow y_i - \eta\,(g_i(y_i) - c_i + c)
      \ \ (K \text{ times}), \qquad c_i^+ = c_i - c + \frac{x - y_i}{K\eta}, \\
    x &\leftarrow x + \eta_g \frac{1}{|S|}\sum_{i \in S} (y_i - x), \qquad
    c \leftarrow c + \frac{|S|}{N} \frac{1}{|S|}\sum_{i \in S} (c_i^+ - c_i),

  with :math:`g_i = \nabla h_i` (``updates``). The client computes :math:`c_i^+` as the
  running mean of the round's gradients, which equals option II's ratio for SGD at a
  constant rate (and stays the average gradient with a schedule or an optax
  ``optimizer``). Per local step, with ``g = updates``::

      y = y - eta (g - c_i + c_round)
      c_plus = mean of this round's g so far              (c_i+ of option II)
      c = c_round + c_plus - c_i                          (the upload: dc_i = c_plus - c_i)

  and at a round's first step ``c_round = c`` (the server's) and ``c_i = c_plus`` (the
  client's last round). ``c`` is an ``every_round`` field: clients send the model and
  ``c + dc_i`` (``2d`` floats) and receive both. A straggler uploads its ``k``-step
  values; a dropped client keeps its state. **Choices**: client means are uniform (the
  paper's); :math:`|S|` counts the round's surviving clients. In a user's own loop (one
  client, nobody playing the server) the ``c`` the client leaves is the next round's
  ``c``: the server with :math:`N = |S| = 1`, so the steps are plain SGD.

  Args:
    learning_rate: the local rate :math:`\eta > 0` (a number or an optax schedule);
      ``None``: 0.01.
    local_steps: :math:`K \ge 1`, local steps per round (default 5).
    server_lr: the global step :math:`\eta_g > 0` (default 1.0, which is model averaging).
    optimizer: the local step on the corrected gradient :math:`g - c_i + c`: ``None``
      (``optax.sgd(eta)``), a factory of the learning rate (``optax.adam``) or an optax
      transform with its own rate (then no ``learning_rate``).

  Returns:
    An :class:`~fedco.Algorithm` (``problem_kind="plain"``, ``every_round=("c",)``) whose
    server is a :class:`~fedco.extend.ServerAggregator`; after :func:`fedco.simulate` the
    clients' control variates are ``result.state.clients.c_plus`` (:math:`c_i` of their
    last round) and the server's is ``result.state.server["c"]``.

  Raises:
    ValueError: if ``server_lr`` or ``learning_rate`` is not positive, ``local_steps`` is
      not a positive int, both ``learning_rate`` and an optax transform ``optimizer`` are
      given, or ``update`` gets ``updates=None``.

  Examples:
    One round of two local steps on :math:`h(y) = \frac{1}{2}\|y - a\|^2`; the uploaded
    ``c`` is the mean of the round's two gradients:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import optax
    >>> import fedco
    >>> opt = fedco.scaffold(0.1, 2, server_lr=1.0)
    >>> opt.plan.every_round
    ('c',)
    >>> loss = lambda y: 0.5 * jnp.sum((y - jnp.array([1.0, -2.0])) ** 2)
    >>> y = jnp.zeros(2)
    >>> state = opt.init(y)
    >>> for _ in range(opt.plan.local_steps):
    ...   step, state = opt.update(jax.grad(loss)(y), state, y)
    ...   y = optax.apply_updates(y, step)
    >>> [round(float(v), 4) for v in state.c]  # mean of (-1, 2) and (-0.9, 1.8)
    [-0.95, 1.9]
  """
  opt = extend.param_optimizer(learning_rate, optimizer, default=0.01)
  eta_g = extend.positive("server_lr", server_lr)
  # c is the server's at a round's start, c_round and c_i are set by its first step: only
  # c_plus (the client's c_i of its last round) persists between rounds
  plan = extend.make_plan(local_steps, every_round=("c",), round_local=("c", "c_round", "c_i"))
  steps = plan.local_steps

  def init(params, *, inner_value=None):
    del inner_value
    params = extend.strong(params)
    zeros = lambda: jax.tree.map(jnp.zeros_like, params)
    return ScaffoldState(
      jnp.zeros([], jnp.int32), zeros(), zeros(), zeros(), zeros(), opt.init(params)
    )

  def update(updates, state, params=None, *, local_step=None, **unused):
    del unused
    extend.require("updates (the gradient of the client loss)", updates, "scaffold")
    first = extend.at_round_start(local_step, state.count, steps)
    done = (
      jnp.asarray(state.count) % steps if local_step is None else jnp.asarray(local_step)
    )  # steps already taken this round
    c_round = extend.select(first, state.c, state.c_round)
    c_i = extend.select(first, state.c_plus, state.c_i)
    c_plus = jax.tree.map(
      lambda m, g: jnp.where(first, g, m + (g - m) / (done + 1).astype(g.dtype)),
      state.c_plus,
      updates,
    )
    direction = jax.tree.map(lambda g, ci, c: g - ci + c, updates, c_i, c_round)
    step, opt_state = opt.update(direction, state.opt_state, params)
    upload = jax.tree.map(lambda c, cp, ci: c + (cp - ci), c_round, c_plus, c_i)
    return step, ScaffoldState(state.count + 1, upload, c_round, c_i, c_plus, opt_state)

  def server_init(server, counts):
    del server, counts
    return optax.EmptyState()

  def server_update(server, state, client_values, info):
    w = info.weights  # uniform over the survivors, 0 for dropped clients
    survivors = jnp.sum(info.alive_mask)
    mean_y = extend.weighted_client_mean(client_values["params"], w)
    mean_c = extend.weighted_client_mean(client_values["c"], w)
    x = jax.tree.map(lambda a, b: a + eta_g * (b - a), server["params"], mean_y)
    c = jax.tree.map(
      lambda a, b: a + (survivors.astype(a.dtype) / info.num_clients) * (b - a), server["c"], mean_c
    )
    return {**server, "params": x, "c": c}, state

  return extend.Algorithm(
    init,
    update,
    plan,
    extend.ServerAggregator(server_init, server_update, reads_each=False),
    "scaffold",
    "plain",
  )
