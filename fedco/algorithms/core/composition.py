"""Composition with optax: :func:`chain`, :func:`named_chain`, :func:`inject_hyperparams`.

Each returns an :class:`~fedco.algorithms.core.types.Algorithm` again, with the plan,
server and name of the one algorithm it wraps, so the result stays runnable in
:func:`fedco.simulate`; an injected algorithm's server state is an
:class:`InjectedServerState`.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedco.algorithms.core.servers import ServerAggregator, as_aggregator
from fedco.algorithms.core.types import Algorithm


def _the_algorithm(transforms, where: str) -> Algorithm:
  algorithms = [t for t in transforms if isinstance(t, Algorithm)]
  if len(algorithms) != 1:
    raise ValueError(
      f"{where} needs exactly one fedco algorithm among its transforms (the "
      f"one whose plan and server the runtime uses), got {len(algorithms)}"
    )
  return algorithms[0]


def chain(*transforms) -> Algorithm:
  """``optax.chain`` that keeps the fedco algorithm's plan, server and name.

  Exactly one of ``transforms`` is a fedco :class:`Algorithm`; the others are any optax
  transforms. Every transform receives the oracles (extra args). A transform *before* the
  algorithm acts on what the algorithm receives (``updates = grad h``, the gradient of the
  non-compositional term); one *after* it acts on the algorithm's step. To transform the
  compositional direction itself (e.g. clip it), pass ``optimizer=optax.chain(clip, ...)``
  to the algorithm. The chain's state is ``optax.chain``'s tuple; the runtime finds the
  plan's fields in it by name (:func:`get_field`). Its ``init`` takes ``params`` only: fill
  trackers of the inner value with :func:`init_trackers`.

  Args:
    *transforms: optax transforms, exactly one of them an :class:`Algorithm`.

  Returns:
    an :class:`Algorithm` whose ``init`` and ``update`` are the chain's, with the
    algorithm's ``plan``, ``server``, ``name`` and ``problem_kind``.

  Raises:
    ValueError: not exactly one of ``transforms`` is an :class:`Algorithm`.

  Examples:
    Clip each coordinate of ``grad h`` to ``[-1, 1]`` before FedAvg's step of rate 0.1:

    >>> import jax.numpy as jnp
    >>> import optax
    >>> import fedco
    >>> opt = fedco.chain(optax.clip(1.0), fedco.fedavg(0.1))
    >>> opt.name, opt.plan.weighting
    ('fedavg', 'samples')
    >>> params = jnp.zeros(2)
    >>> updates, state = opt.update(jnp.array([3.0, -0.5]), opt.init(params), params)
    >>> [round(float(v), 4) for v in updates]  # -0.1 * [1, -0.5]
    [-0.1, 0.05]
  """
  algorithm = _the_algorithm(transforms, "fedco.chain")
  tx = optax.chain(*transforms)
  return algorithm.replace(init=tx.init, update=tx.update)


def named_chain(*named_transforms) -> Algorithm:
  """``optax.named_chain`` (``(name, transform)`` pairs) that keeps the fedco algorithm.

  As :func:`chain`, but the state is a dict keyed by the names given, which makes the
  parts of a chained state easy to read.

  Args:
    *named_transforms: ``(name, transform)`` pairs; exactly one transform is an
      :class:`Algorithm`.

  Returns:
    an :class:`Algorithm` whose ``init`` and ``update`` are the named chain's, with the
    algorithm's ``plan``, ``server``, ``name`` and ``problem_kind``.

  Raises:
    ValueError: not exactly one of the transforms is an :class:`Algorithm`.

  Examples:
    >>> import jax.numpy as jnp
    >>> import optax
    >>> import fedco
    >>> opt = fedco.named_chain(
    ...   ("clip", optax.clip_by_global_norm(1.0)), ("local_scgd", fedco.local_scgd(0.1))
    ... )
    >>> state = opt.init(jnp.zeros(2))
    >>> list(state), state["local_scgd"].u
    (['clip', 'local_scgd'], Pending('inner'))
  """
  algorithm = _the_algorithm([t for _, t in named_transforms], "fedco.named_chain")
  tx = optax.named_chain(*named_transforms)
  return algorithm.replace(init=tx.init, update=tx.update)


class InjectedServerState(NamedTuple):
  r"""The server's injected hyperparameters (change them between calls) and its own state.

  The state of the server of an algorithm built by :func:`inject_hyperparams`: the
  server's aggregator is rebuilt at every round from ``hyperparams`` (schedules evaluated at
  ``count``), so server-side rates can change between rounds without a new compilation.

  Attributes:
    count: ``int32 []``, the rounds aggregated so far (what server schedules read).
    hyperparams: ``{name: value}``, the factory's numeric arguments as arrays (every one
      of them, client-side rates included); assign to change one.
    inner_state: the state of the aggregator those hyperparameters build.

  Examples:
    DS-FedDRO's server step on ``x``, :math:`\bar x \leftarrow \bar x - \gamma_x (\bar x -
    \mathrm{mean}_k\, x_k)`, with :math:`\gamma_x` set to 0.5 between rounds:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> from fedco.algorithms import RoundInfo
    >>> opt = fedco.inject_hyperparams(fedco.ds_feddro)(0.1, server_lr_x=1.0)
    >>> server = {"params": jnp.zeros(2), "y": jnp.zeros(1)}
    >>> state = opt.server.init(server, jnp.array([4, 4]))
    >>> sorted(state.hyperparams)
    ['beta', 'learning_rate', 'server_lr_x', 'server_lr_y']
    >>> state.hyperparams["server_lr_x"] = 0.5
    >>> clients = {"params": jnp.array([[2.0, 2.0], [4.0, 4.0]]), "y": jnp.ones((2, 1))}
    >>> info = RoundInfo(ids=jnp.array([0, 1]), weights=jnp.array([0.5, 0.5]),
    ...                  counts=jnp.array([4, 4]), num_clients=2, key=jax.random.key(0),
    ...                  client_losses=None)
    >>> server, state = jax.jit(opt.server.update)(server, state, clients, info)
    >>> [round(float(v), 4) for v in server["params"]], int(state.count)
    ([1.5, 1.5], 1)
  """

  count: jax.Array  # type: ignore[assignment]  # NamedTuple field shadows tuple.count
  hyperparams: dict
  inner_state: Any


def _classify(arguments, static):
  """optax.inject_hyperparams's split: static/other, schedules, numeric."""
  numeric, schedules, other = {}, {}, {}
  for name, value in arguments.items():
    if name in static or isinstance(value, bool):
      other[name] = value
    elif callable(value):
      schedules[name] = value
    elif isinstance(value, (int, float, jax.Array, np.ndarray)):
      numeric[name] = value
    else:
      other[name] = value
  return numeric, schedules, other


def _float_dtype(value, dtype):
  value = jnp.asarray(value)
  return value.astype(dtype) if jnp.issubdtype(value.dtype, jnp.floating) else value


def inject_hyperparams(
  algorithm_factory: Callable[..., Algorithm], static_args=(), hyperparam_dtype=None
) -> Callable[..., Algorithm]:
  """``optax.inject_hyperparams`` for fedco algorithms: hyperparameters become state.

  Every numeric argument (learning rate, ``beta``, ``alpha``, ``gamma``, server rates,
  ``weights_lr``, ``q``, ...) is held in the state and can change between calls without a
  new compilation; a callable is a schedule of the step count. The factory's structural
  arguments (``local_steps``, counts, ``optimizer``: its ``static_args``) stay static, as do
  ``static_args`` given here. Booleans, strings and ``None`` stay static by value.

  * The client transform is exactly ``optax.inject_hyperparams(algorithm_factory, ...)``:
    its state is optax's injected-hyperparameters state (``InjectHyperparamsState``) whose
    ``hyperparams`` dict you may change, and client schedules count that client's local
    steps. Its ``init`` takes ``params`` only: fill trackers with :func:`init_trackers`.
  * The server is built from the same arguments; its state is an
    :class:`InjectedServerState` (``hyperparams`` dict, schedules counting rounds), so
    server-side rates (DS-FedDRO's ``server_lr_x``, DRFA's ``weights_lr``) are state too.

  The factory's checks run once, on the arguments' concrete values (schedules at step 0),
  when the algorithm is built; values assigned later are not checked.

  Args:
    algorithm_factory: a :func:`factory` (a built-in such as ``fedco.local_scgdm`` or your
      own), or any function of hyperparameters that returns an :class:`Algorithm`.
    static_args: names of further arguments to keep static (a string or a sequence);
      default: only the factory's own ``static_args``.
    hyperparam_dtype: the dtype of the float hyperparameters; ``None`` (default): optax's
      choice for the client (the values' own dtype) and the highest float dtype of the
      server's values for the server.

  Returns:
    a factory with ``algorithm_factory``'s signature that returns an :class:`Algorithm`
    (with ``static_args``, the sorted static names).

  Raises:
    ValueError: when the returned factory is called: a schedule is an optax stateful
      schedule (only callables of the step count are supported), or the factory's own
      checks reject a value.

  Examples:
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> opt = fedco.inject_hyperparams(fedco.local_scgd)(learning_rate=0.1, gamma=0.5)
    >>> params = jnp.array([1.0, -1.0])
    >>> inner_fn = lambda x: x**2
    >>> outer_fn = lambda y: jnp.sum(y)
    >>> state = fedco.init_trackers(opt.init(params), params, inner_fn(params))
    >>> sorted(state.hyperparams)
    ['gamma', 'learning_rate']
    >>> state.hyperparams["learning_rate"] = 0.05  # no new compilation under jit
    >>> updates, state = opt.update(None, state, params, inner_fn=inner_fn, outer_fn=outer_fn)
    >>> [round(float(v), 4) for v in updates]  # -0.05 * 2x
    [-0.1, 0.1]
  """
  static = {static_args} if isinstance(static_args, str) else set(static_args)
  signature = inspect.signature(algorithm_factory)
  static |= set(getattr(algorithm_factory, "static_args", ())) & set(signature.parameters)
  client_factory = optax.inject_hyperparams(
    algorithm_factory, static_args=static, hyperparam_dtype=hyperparam_dtype
  )

  @functools.wraps(algorithm_factory)
  def build(*args, **kwargs) -> Algorithm:
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    # NumPy scalars as Python numbers: optax injects only those (and arrays), not np.float32
    bound.arguments.update(
      {k: v.item() for k, v in bound.arguments.items() if isinstance(v, (np.integer, np.floating))}
    )
    numeric, schedules, other = _classify(bound.arguments, static)
    at_zero = {k: _schedule_at(v, 0) for k, v in schedules.items()}
    template = algorithm_factory(**other, **numeric, **at_zero)  # validates concrete values
    client = client_factory(*bound.args, **bound.kwargs)

    def hyperparams_at(count, values, dtype):
      return {
        **values,
        **{k: _float_dtype(_schedule_at(v, count), dtype) for k, v in schedules.items()},
      }

    def aggregator(hyperparams) -> ServerAggregator:
      return as_aggregator(algorithm_factory(**other, **hyperparams).server)

    def dtype_of(server):
      return hyperparam_dtype or optax.tree.dtype(server, "highest")

    def server_init(server, counts):
      dtype = dtype_of(server)
      values = {k: _float_dtype(v, dtype) for k, v in numeric.items()}
      count = jnp.zeros([], jnp.int32)
      inner = aggregator(hyperparams_at(count, values, dtype)).init(server, counts)
      return InjectedServerState(count, values, inner)

    def server_update(server, state, client_values, info):
      dtype = dtype_of(server)
      values = {k: _float_dtype(v, dtype) for k, v in state.hyperparams.items()}
      hp = hyperparams_at(state.count, values, dtype)
      server, inner = aggregator(hp).update(server, state.inner_state, client_values, info)
      return server, InjectedServerState(optax.safe_increment(state.count), values, inner)

    return template.replace(
      init=client.init,
      update=client.update,
      server=as_aggregator(template.server)._replace(init=server_init, update=server_update),
    )

  # typeshed's functools.wraps result type (_Wrapped) declares no function attributes
  build.static_args = tuple(sorted(static))  # type: ignore[attr-defined]
  return build


def _schedule_at(schedule, count):
  if isinstance(schedule, optax.schedules.StatefulSchedule):
    raise ValueError(
      "fedco.inject_hyperparams takes schedules of the step count "
      "(callables); stateful schedules are not supported"
    )
  return schedule(count)
