r"""Adaptive server optimizers: FedAdagrad, FedYogi, FedAdam (Reddi et al. 2021, Algorithm 2).

Clients run FedAvg's local SGD from the server model ``x_t``; the server treats the mean
client change as a pseudo-gradient and takes an adaptive step. Algorithm 2, exactly::

    Delta_t = mean_{i in S} (y_i - x_t)                       (S: the round's clients)
    m_t = b1 m_{t-1} + (1 - b1) Delta_t
    v_t = v_{t-1} + Delta_t^2                                 (FedAdagrad)
    v_t = v_{t-1} - (1 - b2) Delta_t^2 sign(v_{t-1} - Delta_t^2)   (FedYogi)
    v_t = b2 v_{t-1} + (1 - b2) Delta_t^2                     (FedAdam)
    x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)

elementwise, with ``m_{-1} = 0`` and ``v_{-1} = tau^2`` (the paper initialises
``v_{-1} >= tau^2``; this module takes the bound) and no bias correction (the paper has
none).

Two ways to use them:

* **Server transforms** :func:`fedadam_server`, :func:`fedyogi_server`,
  :func:`fedadagrad_server`: optax ``GradientTransformation`` s on fedco's server
  pseudo-gradients ``{"params": x - mean_i y_i, field: server - mean_i client, ...}``
  (:func:`fedco.extend.optax_aggregator`), so ``Delta_t = -pseudo_grad["params"]``. They
  adapt ``params`` and leave every other field (an algorithm's ``every_round`` state) to
  plain averaging. Any algorithm whose server is an optax transform takes one:
  ``fedco.feddro(0.1, 5).replace(server=fedyogi_server(0.01))``, or :func:`with_server`,
  which refuses an algorithm whose server is a :class:`~fedco.extend.ServerAggregator`
  (SCAFFOLD, q-FedAvg, DRFA...: their servers read every client and are not pseudo-gradient
  steps). The replaced server is dropped: DS-FedDRO's two-sided rates, for one.
* **Registered algorithms** :func:`fedadam`, :func:`fedyogi`, :func:`fedadagrad`: plain
  FedAvg clients (local SGD on ``updates = grad h_k``) with that server.

**Defaults** (the paper's experiments): ``b1 = 0.9``, ``b2 = 0.99`` for FedAdam and FedYogi;
``b1 = 0`` for FedAdagrad (Adagrad without momentum; its ``v`` has no ``b2``, so it takes
none); ``tau = 1e-3``, argument ``adaptivity`` (fedco's ``tau`` is the local step count).
The paper tunes the server rate ``eta`` per task; ``server_lr = 0.01`` is this module's
default, not the paper's. The client mean is uniform over the round's clients (Algorithm
2's ``1/|S| sum``); ``weighting="samples"`` is offered.

Reference:
  Reddi, Charles, Zaheer, Garrett, Rush, Konecny, Kumar, McMahan, "Adaptive federated
  optimization" (ICLR 2021), Algorithm 2.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedco import extend

RULES = ("adagrad", "yogi", "adam")


class AdaptiveServerState(NamedTuple):
  """The server's moments of ``params``: ``m`` (first) and ``v`` (second)."""

  m: Any
  v: Any


def _second_moment(rule: str, b2):
  """``(v_{t-1}, Delta_t^2) -> v_t`` of Algorithm 2."""
  if rule == "adagrad":
    return lambda v, d2: v + d2
  if rule == "yogi":
    return lambda v, d2: v - (1 - b2) * d2 * jnp.sign(v - d2)
  return lambda v, d2: b2 * v + (1 - b2) * d2


def _params_of(tree, where: str):
  if not isinstance(tree, dict) or "params" not in tree:
    raise ValueError(
      f"{where} takes fedco's server values {{'params': ..., field: ...}} "
      f"(an Algorithm's server), got {type(tree).__name__}"
    )
  return tree["params"]


def adaptive_server(
  rule: str, server_lr: float = 0.01, *, b1: float = 0.9, b2: float = 0.99, adaptivity: float = 1e-3
) -> optax.GradientTransformation:
  """Algorithm 2's server step for ``rule`` (``"adagrad"``, ``"yogi"`` or ``"adam"``) as an
  optax transform on fedco's pseudo-gradient dicts (see the module docstring).

  Args:
    rule: the second-moment update.
    server_lr: the server rate ``eta > 0``.
    b1: the first-moment decay in ``[0, 1)``.
    b2: the second-moment decay in ``[0, 1)`` (unused by ``"adagrad"``).
    adaptivity: the paper's ``tau > 0`` (also ``v_{-1} = tau^2``).

  Returns:
    An ``optax.GradientTransformation``; its state is an :class:`AdaptiveServerState` of
    ``params``' moments.
  """
  if rule not in RULES:
    raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
  decay = lambda name, value: extend.bounded(name, value, 0, 1, closed_low=True)
  eta, b1, b2, tau = (
    extend.positive("server_lr", server_lr),
    decay("b1", b1),
    decay("b2", b2),
    extend.positive("adaptivity", adaptivity),
  )
  second = _second_moment(rule, b2)
  where = f"the fed{rule} server"

  def init(server):
    params = _params_of(server, where)
    return AdaptiveServerState(
      jax.tree.map(jnp.zeros_like, params),
      jax.tree.map(lambda p: (jnp.zeros_like(p) + tau**2).astype(p.dtype), params),
    )

  def update(pseudo_grad, state, params=None):
    del params
    delta = jax.tree.map(jnp.negative, _params_of(pseudo_grad, where))  # mean_i y_i - x
    m = jax.tree.map(lambda m, d: (b1 * m + (1 - b1) * d).astype(m.dtype), state.m, delta)
    v = jax.tree.map(lambda v, d: second(v, d * d).astype(v.dtype), state.v, delta)
    step = jax.tree.map(lambda m, v: (eta * m / (jnp.sqrt(v) + tau)).astype(m.dtype), m, v)
    updates = {
      k: step if k == "params" else jax.tree.map(jnp.negative, g)  # plain mean
      for k, g in pseudo_grad.items()
    }
    return updates, AdaptiveServerState(m, v)

  return optax.GradientTransformation(init, update)


def fedadam_server(
  server_lr: float = 0.01, *, b1: float = 0.9, b2: float = 0.99, adaptivity: float = 1e-3
) -> optax.GradientTransformation:
  """FedAdam's server: ``v_t = b2 v_{t-1} + (1 - b2) Delta_t^2`` (see
  :func:`adaptive_server`)."""
  return adaptive_server("adam", server_lr, b1=b1, b2=b2, adaptivity=adaptivity)


def fedyogi_server(
  server_lr: float = 0.01, *, b1: float = 0.9, b2: float = 0.99, adaptivity: float = 1e-3
) -> optax.GradientTransformation:
  """FedYogi's server: ``v_t = v_{t-1} - (1 - b2) Delta_t^2 sign(v_{t-1} - Delta_t^2)`` (see
  :func:`adaptive_server`)."""
  return adaptive_server("yogi", server_lr, b1=b1, b2=b2, adaptivity=adaptivity)


def fedadagrad_server(
  server_lr: float = 0.01, *, b1: float = 0.0, adaptivity: float = 1e-3
) -> optax.GradientTransformation:
  """FedAdagrad's server: ``v_t = v_{t-1} + Delta_t^2`` (see :func:`adaptive_server`)."""
  return adaptive_server("adagrad", server_lr, b1=b1, adaptivity=adaptivity)


def with_server(
  algorithm: extend.Algorithm, server: optax.GradientTransformation
) -> extend.Algorithm:
  """``algorithm`` with ``server`` (e.g. :func:`fedyogi_server`) as its server transform.

  Raises:
    ValueError: ``algorithm``'s server is a :class:`~fedco.extend.ServerAggregator` (it reads
      every client, not a pseudo-gradient; ``fedco.inject_hyperparams`` also makes one:
      replace the server before injecting), or ``server`` is not an optax transform.
  """
  if not isinstance(algorithm, extend.Algorithm):
    raise ValueError(f"with_server takes a fedco Algorithm, got {type(algorithm).__name__}")
  if isinstance(algorithm.server, extend.ServerAggregator):
    raise ValueError(
      f"{algorithm.name}'s server is a ServerAggregator, not an optax transform "
      "on pseudo-gradients: an adaptive server cannot replace it"
    )
  if isinstance(server, extend.ServerAggregator) or not isinstance(
    server, optax.GradientTransformation
  ):
    raise ValueError(
      f"with_server takes an optax GradientTransformation as the server, got "
      f"{type(server).__name__}"
    )
  return algorithm.replace(server=server)


# ---- registered algorithms: FedAvg clients with an adaptive server ---------------------


class FedOptState(NamedTuple):
  count: jnp.ndarray  # type: ignore[assignment]  # NamedTuple field shadows tuple.count
  opt_state: optax.OptState


def _fedopt(name, learning_rate, local_steps, weighting, optimizer, server):
  """Plain FedAvg's client (local SGD on ``updates = grad h_k``) with ``server``."""
  opt = extend.param_optimizer(learning_rate, optimizer, default=0.01)
  plan = extend.make_plan(local_steps, weighting=weighting)

  def init(params, *, inner_value=None):
    del inner_value
    return FedOptState(jnp.zeros([], jnp.int32), opt.init(params))

  def update(updates, state, params=None, **unused):
    del unused
    extend.require("updates (the gradient of the client loss)", updates, name)
    step, opt_state = opt.update(updates, state.opt_state, params)
    return step, FedOptState(state.count + 1, opt_state)

  return extend.Algorithm(init, update, plan, server, name, "plain")


@extend.register(
  settings={"fedadam": dict(learning_rate=0.1, server_lr=0.1, b1=0.9, b2=0.99, adaptivity=1e-3)}
)
@extend.factory(static=("local_steps", "optimizer"))
def fedadam(
  learning_rate: Optional[extend.ScalarOrSchedule] = None,
  local_steps: int = 5,
  *,
  server_lr: float = 0.01,
  b1: float = 0.9,
  b2: float = 0.99,
  adaptivity: float = 1e-3,
  weighting: str = "uniform",
  optimizer: extend.Optimizer = None,
) -> extend.Algorithm:
  r"""FedAdam (Reddi et al. 2021, Algorithm 2): FedAvg clients, an Adam step on the server.

  A baseline for **plain** problems :math:`\frac{1}{K}\sum_k h_k(x)`: the round's clients
  run FedAvg's local SGD on ``updates`` :math:`= \nabla h_k` from the server model
  :math:`x_t`, and the server treats their mean change as a pseudo-gradient, elementwise
  and without bias correction (the paper has none):

  .. math::

    \Delta_t = \frac{1}{|S|}\sum_{i \in S} (y_i - x_t), \qquad
    m_t = b_1 m_{t-1} + (1 - b_1)\Delta_t, \\
    v_t = b_2 v_{t-1} + (1 - b_2)\Delta_t^2, \qquad
    x_{t+1} = x_t + \eta \frac{m_t}{\sqrt{v_t} + \tau},

  with :math:`m_{-1} = 0`, :math:`v_{-1} = \tau^2`. The paper's settings: :math:`b_1 =
  0.9`, :math:`b_2 = 0.99`, :math:`\tau = 10^{-3}`, :math:`\eta` tuned per task. The same
  server fits other algorithms: :func:`fedco.algorithms.adaptive.with_server`.

  Args:
    learning_rate: the clients' local SGD rate :math:`> 0` (a number or an optax
      schedule); ``None``: 0.01.
    local_steps: local steps per round, :math:`\ge 1` (default 5).
    server_lr: the server rate :math:`\eta > 0` (default 0.01, this module's: the paper
      tunes it per task).
    b1: the first-moment decay :math:`b_1 \in [0, 1)` (default 0.9, the paper's).
    b2: the second-moment decay :math:`b_2 \in [0, 1)` (default 0.99, the paper's).
    adaptivity: the paper's :math:`\tau > 0` in :math:`\sqrt{v} + \tau` (also
      :math:`v_{-1} = \tau^2`; default 1e-3, the paper's); renamed because fedco's
      :math:`\tau` elsewhere is the local step count.
    weighting: the client mean :math:`\Delta_t`: ``"uniform"`` (Algorithm 2's, default) or
      ``"samples"`` (by client data sizes).
    optimizer: the clients' local step: ``None`` (``optax.sgd(learning_rate)``), a factory
      of the learning rate (``optax.adam``) or an optax transform with its own rate (then
      no ``learning_rate``).

  Returns:
    An :class:`~fedco.Algorithm` (``problem_kind="plain"``, only the model travels: ``d``
    floats up and down per client per round) whose ``server`` is
    :func:`fedco.algorithms.adaptive.fedadam_server` (an optax transform on the pseudo-gradients).

  Raises:
    ValueError: if a rate or ``adaptivity`` is not positive, ``b1`` or ``b2`` is not in
      ``[0, 1)``, ``local_steps`` is not a positive int, ``weighting`` is unknown, both
      ``learning_rate`` and an optax transform ``optimizer`` are given, or ``update`` gets
      ``updates=None``.

  Examples:
    The server's first two steps for the clients' mean change :math:`\Delta = (1, -0.01)`
    each round (the pseudo-gradient the server receives is :math:`x - \mathrm{mean}_i\,
    y_i = -\Delta`);
    each coordinate moves by a fraction of ``server_lr``, though they differ 100x:

    >>> import jax.numpy as jnp
    >>> import fedco
    >>> opt = fedco.fedadam(0.01, 5, server_lr=0.01, b1=0.9, b2=0.99, adaptivity=1e-3)
    >>> opt.plan.weighting, opt.plan.fields  # the model only, a uniform mean
    ('uniform', ())
    >>> server_state = opt.server.init({"params": jnp.zeros(2)})
    >>> delta = jnp.array([1.0, -0.01])
    >>> for _ in range(2):
    ...   updates, server_state = opt.server.update({"params": -delta}, server_state)
    ...   print([round(float(v), 4) for v in updates["params"]])  # x = x + updates
    [0.0099, -0.0041]
    [0.0134, -0.007]
  """
  return _fedopt(
    "fedadam",
    learning_rate,
    local_steps,
    weighting,
    optimizer,
    fedadam_server(server_lr, b1=b1, b2=b2, adaptivity=adaptivity),
  )


@extend.register(
  settings={"fedyogi": dict(learning_rate=0.1, server_lr=0.1, b1=0.9, b2=0.99, adaptivity=1e-3)}
)
@extend.factory(static=("local_steps", "optimizer"))
def fedyogi(
  learning_rate: Optional[extend.ScalarOrSchedule] = None,
  local_steps: int = 5,
  *,
  server_lr: float = 0.01,
  b1: float = 0.9,
  b2: float = 0.99,
  adaptivity: float = 1e-3,
  weighting: str = "uniform",
  optimizer: extend.Optimizer = None,
) -> extend.Algorithm:
  r"""FedYogi (Reddi et al. 2021, Algorithm 2): FedAvg clients, a Yogi step on the server.

  A baseline for **plain** problems :math:`\frac{1}{K}\sum_k h_k(x)`: the round's clients
  run FedAvg's local SGD on ``updates`` :math:`= \nabla h_k` from the server model
  :math:`x_t`, and the server treats their mean change as a pseudo-gradient, elementwise:

  .. math::

    \Delta_t = \frac{1}{|S|}\sum_{i \in S} (y_i - x_t), \qquad
    m_t = b_1 m_{t-1} + (1 - b_1)\Delta_t, \\
    v_t = v_{t-1} - (1 - b_2)\Delta_t^2 \operatorname{sign}(v_{t-1} - \Delta_t^2), \qquad
    x_{t+1} = x_t + \eta \frac{m_t}{\sqrt{v_t} + \tau},

  with :math:`m_{-1} = 0`, :math:`v_{-1} = \tau^2`: unlike Adam's, :math:`v` moves
  additively, by :math:`(1 - b_2)\Delta_t^2` a round towards :math:`\Delta_t^2`. The
  paper's settings: :math:`b_1 = 0.9`, :math:`b_2 = 0.99`, :math:`\tau = 10^{-3}`,
  :math:`\eta` tuned per task. The same server fits other algorithms:
  :func:`fedco.algorithms.adaptive.with_server`.

  Args:
    learning_rate: the clients' local SGD rate :math:`> 0` (a number or an optax
      schedule); ``None``: 0.01.
    local_steps: local steps per round, :math:`\ge 1` (default 5).
    server_lr: the server rate :math:`\eta > 0` (default 0.01, this module's: the paper
      tunes it per task).
    b1: the first-moment decay :math:`b_1 \in [0, 1)` (default 0.9, the paper's).
    b2: the second-moment rate :math:`b_2 \in [0, 1)` (default 0.99, the paper's).
    adaptivity: the paper's :math:`\tau > 0` in :math:`\sqrt{v} + \tau` (also
      :math:`v_{-1} = \tau^2`; default 1e-3, the paper's); renamed because fedco's
      :math:`\tau` elsewhere is the local step count.
    weighting: the client mean :math:`\Delta_t`: ``"uniform"`` (Algorithm 2's, default) or
      ``"samples"`` (by client data sizes).
    optimizer: the clients' local step: ``None`` (``optax.sgd(learning_rate)``), a factory
      of the learning rate (``optax.adam``) or an optax transform with its own rate (then
      no ``learning_rate``).

  Returns:
    An :class:`~fedco.Algorithm` (``problem_kind="plain"``, only the model travels: ``d``
    floats up and down per client per round) whose ``server`` is
    :func:`fedco.algorithms.adaptive.fedyogi_server` (an optax transform on the pseudo-gradients).

  Raises:
    ValueError: if a rate or ``adaptivity`` is not positive, ``b1`` or ``b2`` is not in
      ``[0, 1)``, ``local_steps`` is not a positive int, ``weighting`` is unknown, both
      ``learning_rate`` and an optax transform ``optimizer`` are given, or ``update`` gets
      ``updates=None``.

  Examples:
    The server's first two steps for the clients' mean change :math:`\Delta = (1, -0.01)`
    each round (the pseudo-gradient the server receives is :math:`x - \mathrm{mean}_i\,
    y_i = -\Delta`);
    from :math:`v_{-1} = \tau^2` its first step is FedAdam's:

    >>> import jax.numpy as jnp
    >>> import fedco
    >>> opt = fedco.fedyogi(0.01, 5, server_lr=0.01, b1=0.9, b2=0.99, adaptivity=1e-3)
    >>> opt.plan.weighting, opt.plan.fields  # the model only, a uniform mean
    ('uniform', ())
    >>> server_state = opt.server.init({"params": jnp.zeros(2)})
    >>> delta = jnp.array([1.0, -0.01])
    >>> for _ in range(2):
    ...   updates, server_state = opt.server.update({"params": -delta}, server_state)
    ...   print([round(float(v), 4) for v in updates["params"]])  # x = x + updates
    [0.0099, -0.0041]
    [0.0133, -0.007]
  """
  return _fedopt(
    "fedyogi",
    learning_rate,
    local_steps,
    weighting,
    optimizer,
    fedyogi_server(server_lr, b1=b1, b2=b2, adaptivity=adaptivity),
  )


@extend.register(
  settings={"fedadagrad": dict(learning_rate=0.1, server_lr=0.1, b1=0.0, adaptivity=1e-3)}
)
@extend.factory(static=("local_steps", "optimizer"))
def fedadagrad(
  learning_rate: Optional[extend.ScalarOrSchedule] = None,
  local_steps: int = 5,
  *,
  server_lr: float = 0.01,
  b1: float = 0.0,
  adaptivity: float = 1e-3,
  weighting: str = "uniform",
  optimizer: extend.Optimizer = None,
) -> extend.Algorithm:
  r"""FedAdagrad (Reddi et al. 2021, Algorithm 2): FedAvg clients, an Adagrad server step.

  A baseline for **plain** problems :math:`\frac{1}{K}\sum_k h_k(x)`: the round's clients
  run FedAvg's local SGD on ``updates`` :math:`= \nabla h_k` from the server model
  :math:`x_t`, and the server treats their mean change as a pseudo-gradient, elementwise
  (:math:`v` has no decay, so there is no ``b2``):

  .. math::

    \Delta_t = \frac{1}{|S|}\sum_{i \in S} (y_i - x_t), \qquad
    m_t = b_1 m_{t-1} + (1 - b_1)\Delta_t, \\
    v_t = v_{t-1} + \Delta_t^2, \qquad
    x_{t+1} = x_t + \eta \frac{m_t}{\sqrt{v_t} + \tau},

  with :math:`m_{-1} = 0`, :math:`v_{-1} = \tau^2`. The paper's settings: :math:`b_1 = 0`
  (no momentum), :math:`\tau = 10^{-3}`, :math:`\eta` tuned per task. The same server
  fits other algorithms: :func:`fedco.algorithms.adaptive.with_server`.

  Args:
    learning_rate: the clients' local SGD rate :math:`> 0` (a number or an optax
      schedule); ``None``: 0.01.
    local_steps: local steps per round, :math:`\ge 1` (default 5).
    server_lr: the server rate :math:`\eta > 0` (default 0.01, this module's: the paper
      tunes it per task).
    b1: the first-moment decay :math:`b_1 \in [0, 1)` (default 0, the paper's: no
      momentum).
    adaptivity: the paper's :math:`\tau > 0` in :math:`\sqrt{v} + \tau` (also
      :math:`v_{-1} = \tau^2`; default 1e-3, the paper's); renamed because fedco's
      :math:`\tau` elsewhere is the local step count.
    weighting: the client mean :math:`\Delta_t`: ``"uniform"`` (Algorithm 2's, default) or
      ``"samples"`` (by client data sizes).
    optimizer: the clients' local step: ``None`` (``optax.sgd(learning_rate)``), a factory
      of the learning rate (``optax.adam``) or an optax transform with its own rate (then
      no ``learning_rate``).

  Returns:
    An :class:`~fedco.Algorithm` (``problem_kind="plain"``, only the model travels: ``d``
    floats up and down per client per round) whose ``server`` is
    :func:`fedco.algorithms.adaptive.fedadagrad_server` (an optax transform on the
    pseudo-gradients).

  Raises:
    ValueError: if a rate or ``adaptivity`` is not positive, ``b1`` is not in
      ``[0, 1)``, ``local_steps`` is not a positive int, ``weighting`` is unknown, both
      ``learning_rate`` and an optax transform ``optimizer`` are given, or ``update`` gets
      ``updates=None``.

  Examples:
    The server's first two steps for the clients' mean change :math:`\Delta = (1, -0.01)`
    each round (the pseudo-gradient the server receives is :math:`x - \mathrm{mean}_i\,
    y_i = -\Delta`);
    the accumulated :math:`v` shrinks the second step:

    >>> import jax.numpy as jnp
    >>> import fedco
    >>> opt = fedco.fedadagrad(0.01, 5, server_lr=0.01, b1=0.0, adaptivity=1e-3)
    >>> opt.plan.weighting, opt.plan.fields  # the model only, a uniform mean
    ('uniform', ())
    >>> server_state = opt.server.init({"params": jnp.zeros(2)})
    >>> delta = jnp.array([1.0, -0.01])
    >>> for _ in range(2):
    ...   updates, server_state = opt.server.update({"params": -delta}, server_state)
    ...   print([round(float(v), 4) for v in updates["params"]])  # x = x + updates
    [0.01, -0.009]
    [0.0071, -0.0066]
  """
  return _fedopt(
    "fedadagrad",
    learning_rate,
    local_steps,
    weighting,
    optimizer,
    fedadagrad_server(server_lr, b1=b1, adaptivity=adaptivity),
  )
