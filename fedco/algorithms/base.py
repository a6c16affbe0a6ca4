"""The algorithm contract: an optax transform, a communication plan, a server.

Every fedco algorithm is an :class:`Algorithm`: an ``optax.GradientTransformationExtraArgs``
(so ``optax.chain``, ``optax.named_chain`` and other combinators pass the oracles through)
that also carries what the federated runtime needs (``plan``, ``server``, ``name``,
``problem_kind``)::

    opt = fedco.local_scgdm(1.0, 5, beta=0.01, alpha=0.8, gamma=0.7)
    state = opt.init(params)
    updates, state = opt.update(grad_h, state, params,
                                inner_fn=lambda x: g(x, batch),
                                outer_fn=lambda y: f(y, batch_f))
    params = optax.apply_updates(params, updates)

``update(updates, state, params, *, inner_fn, outer_fn, next_inner_fn, **extra_args)``:

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

``init(params)`` is optax's. Trackers of the inner value (``y``, ``u``) need its pytree
structure, which ``params`` does not give, so they start as :class:`Pending` placeholders
and the first ``update`` fills them from that step's sample ``g(x_0; zeta_0)`` (one extra
trace in a jitted loop). ``init(params, inner_value=g(x_0; zeta_0))`` or
:func:`init_trackers` fill them at once, which a ``lax.scan`` carry needs (its structure
must not change); the runtime does this for every client and then averages (SPEC 2.5).

The *communication plan* tells the federated runtime what to average and when; the
*server* is an optax transformation applied to pseudo-gradients
``server_value - mean_k client_value`` of the parameters and the round-synchronised state,
so plain averaging is ``optax.sgd(1.0)`` and DS-FedDRO's two-sided rates are server SGD.
The runtime finds the plan's fields by name anywhere in the state
(``optax.tree_utils.tree_get``), so :func:`chain` and :func:`inject_hyperparams` keep an
algorithm runnable in ``fedco.simulate``.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree

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
      from the same ``y_bar_0``): trackers of the inner value, never fields that start equal
      everywhere (under privacy each is a message, clipped, noised and accounted). Default:
      none.
    round_start: state fields that hold an inner value and are recomputed at the start of
      every round: each of the round's clients evaluates ``g_k(x_bar; zeta)`` at the server
      model on a fresh batch and the field becomes their mean (MBSGD's ``y_bar``), or
      ``round_start_reduce(values, weights)`` of them when given.
    round_start_reduce: ``None`` (the weighted mean) or ``(values [S, ...], weights [S]) ->
      value``, the server's statistic of the clients' ``round_start`` values (weights sum to
      1 over the surviving clients, 0 elsewhere): normalised ComFedL's log-normaliser.
    round_start_value: what each client evaluates at the server model for the
      ``round_start`` fields: ``"inner"`` (``g_k(x_bar; zeta)``) or ``"pre_link"`` (its loss
      before the problem's ``outer_link``: the unlinked outer on a fresh query batch at the
      inner value, DA-MAML's query loss at the adapted model; the inner value itself for
      problems without a link, such as client-level KL-DRO, whose inner is the loss).
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
  at_init: Tuple[str, ...] = ()
  weighting: str = "uniform"
  round_start: Tuple[str, ...] = ()
  round_start_loss: Tuple[str, ...] = ()
  report: Tuple[str, ...] = ()
  round_start_reduce: Optional[Callable[[Any, Any], Any]] = None
  round_start_value: str = "inner"

  @property
  def init_fields(self) -> Tuple[str, ...]:
    return tuple(self.at_init or ())

  @property
  def fields(self) -> Tuple[str, ...]:
    """Every state field the plan names, each once, in plan order."""
    return tuple(
      dict.fromkeys(
        self.every_step
        + self.every_round
        + self.init_fields
        + self.round_start
        + self.round_start_loss
        + self.report
      )
    )


class Algorithm(optax.GradientTransformationExtraArgs):
  """An optax ``GradientTransformationExtraArgs`` plus what the federated runtime needs.

  It *is* the ``(init, update)`` pair, so optax's combinators accept it as any other
  transform; :func:`chain` and :func:`inject_hyperparams` return an :class:`Algorithm`
  again, with the plan, server and name intact.

  Attributes:
    init: ``(params, *, inner_value=None) -> state``.
    update: ``(updates, state, params=None, **extra_args) -> (updates, state)``.
    plan: the :class:`CommPlan`.
    server: an optax transformation on pseudo-gradient dicts ``{"params": ..., field: ...}``,
      or a :class:`ServerAggregator` for servers that need every client's values.
    name: a short label for logs and metrics.
    problem_kind: the problem class it solves: ``"local"``, ``"global"`` or ``"plain"``.
  """

  def __new__(cls, init, update, plan: CommPlan, server, name: str, problem_kind: str):
    self = super().__new__(cls, init, update)
    self.__dict__.update(plan=plan, server=server, name=name, problem_kind=problem_kind)
    return self

  def replace(self, **changes) -> "Algorithm":
    """A copy with some of ``init``, ``update``, ``plan``, ``server``, ``name``,
    ``problem_kind`` replaced."""
    fields = dict(
      init=self.init,
      update=self.update,
      plan=self.plan,
      server=self.server,
      name=self.name,
      problem_kind=self.problem_kind,
    )
    unknown = set(changes) - set(fields)
    if unknown:
      raise ValueError(
        f"Algorithm.replace got unknown fields {sorted(unknown)}; allowed: {sorted(fields)}"
      )
    fields.update(changes)
    return Algorithm(**fields)

  _replace = replace

  def __repr__(self):
    return f"Algorithm(name={self.name!r}, problem_kind={self.problem_kind!r}, plan={self.plan!r})"


ScalarOrSchedule = optax.ScalarOrSchedule
# ``None``, an optax transform, or a factory of the learning rate (``optax.adam``).
Optimizer = Optional[Any]


# Annotations of arguments that inject_hyperparams would mistake for hyperparameters: an int
# becomes a traced number, an optimizer factory (a callable) a schedule. (Strings and bools
# stay static by their value.)
_STRUCTURAL = {"int", "Optimizer", "base.Optimizer"}


def _structural(annotation) -> bool:
  """Whether an annotation (a string under ``from __future__ import annotations``) is an
  int or an optimizer, alone or with ``None``."""
  text = (
    annotation if isinstance(annotation, str) else getattr(annotation, "__name__", repr(annotation))
  )
  names = {
    n.strip()
    for n in text.replace("Optional[", "")
    .replace("Union[", "")
    .replace("typing.", "")
    .replace("]", "")
    .split(",")
  } - {"None"}
  return bool(names) and names <= _STRUCTURAL


def factory(*, static: Tuple[str, ...] = ()):
  """Marks an algorithm factory's structural arguments (``static_args``).

  :func:`inject_hyperparams` keeps these static (a compiled program depends on them:
  ``local_steps``, counts, the ``optimizer``); every other numeric argument becomes state.
  Checked when the factory is decorated: ``static`` must name arguments of the factory, and
  every argument annotated ``int`` (or ``Optional[int]``) or ``Optimizer`` must be in it:
  under ``inject_hyperparams`` an int would silently become a traced number and an
  optimizer factory a schedule. (``str`` and ``bool`` arguments stay static by value.)

  Raises:
    ValueError: ``static`` names an unknown argument, or leaves out a structural one.
  """
  static = (static,) if isinstance(static, str) else tuple(static)

  def mark(fn):
    signature = inspect.signature(fn)
    name = getattr(fn, "__name__", repr(fn))
    unknown = [a for a in static if a not in signature.parameters]
    if unknown:
      raise ValueError(
        f"@factory(static=...) of {name} names {unknown}, which are not its "
        f"arguments; allowed: {list(signature.parameters)}"
      )
    missing = [
      p.name
      for p in signature.parameters.values()
      if p.name not in static
      and p.annotation is not inspect.Parameter.empty
      and _structural(p.annotation)
    ]
    if missing:
      raise ValueError(
        f"@factory(static=...) of {name} leaves out {missing}: arguments "
        f"annotated int or Optimizer shape the compiled program and must be "
        f"static (add them to static=)"
      )

    @functools.wraps(fn)
    def build(*args, **kwargs):
      algorithm = fn(*args, **kwargs)
      if isinstance(algorithm, Algorithm):  # what built it, for run fingerprints
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        algorithm.__dict__["arguments"] = {"factory": fn.__name__, **bound.arguments}
      return algorithm

    build.static_args = tuple(static)
    return build

  return mark


# name -> factory of every registered algorithm: fedco.ALGORITHMS.
REGISTRY: dict = {}


def register(*, settings: dict):
  """Adds a :func:`factory` to ``fedco.ALGORITHMS`` under its function name.

  Built-in algorithms are registered in their own module, so adding one is that module and
  its tests; ``fedco.ALGORITHMS``, ``fedco.<name>``, the test suite's coverage and the mesh
  and multi-process checks follow. A user's algorithm needs no registration to run
  anywhere (``simulate``, ``sweep``, :func:`fedco.testing.check_algorithm`); registering it
  makes it a name the experiment configs accept (``methods.<label>.algorithm``).

  Args:
    settings: ``{label: keyword arguments}``: small configurations that converge on the
      test problem (``fedco.testing``'s portfolio), run by the contract tests; more than one
      label tests several configurations (``fedavg_co``'s cases).

  Raises:
    ValueError: the name is taken, the function is not a :func:`factory`, or ``settings``
      is empty or names arguments the factory does not take.
  """
  if not isinstance(settings, dict) or not settings:
    raise ValueError(
      f"register(settings=...) needs a non-empty dict {{label: kwargs}}, got {settings!r}"
    )

  def add(fn):
    name = getattr(fn, "__name__", None)
    if not hasattr(fn, "static_args"):
      raise ValueError(
        f"register: decorate {name} with @factory(static=...) first (under @register)"
      )
    if name in REGISTRY and REGISTRY[name] is not fn:
      raise ValueError(f"register: an algorithm named {name!r} is registered already")
    parameters = inspect.signature(fn).parameters
    for label, kwargs in settings.items():
      unknown = set(kwargs) - set(parameters)
      if unknown:
        raise ValueError(
          f"register: settings[{label!r}] of {name} names {sorted(unknown)}, "
          "which are not its arguments"
        )
    fn.settings = {label: dict(kwargs) for label, kwargs in settings.items()}
    REGISTRY[name] = fn
    return fn

  return add


def strong(tree: PyTree) -> PyTree:
  """``tree`` with every leaf a strongly typed array of its own dtype.

  Build state from ``strong(params)`` in ``init``: ``jnp.zeros_like`` and optax states of
  weak-typed params (``jnp.full(shape, 0.1)``) are weak-typed, the first update makes them
  strong, and a jitted loop over the state then traces twice. A no-op on strong arrays.
  """
  return jax.tree.map(lambda a: jnp.asarray(a, jnp.result_type(a)), tree)


def at_round_start(local_step, count, local_steps: int) -> jax.Array:
  """Whether this ``update`` is the first local step of a round.

  The runtime passes ``local_step`` (``0 .. local_steps - 1``); in a user's own loop it is
  ``None`` and the step count tells (``count % local_steps == 0``, every ``local_steps``
  calls starting with the first). Use it where a client does something once a round:
  anchor to the round's model (FedProx, Ditto), reset a per-round accumulator.
  """
  if local_step is None:
    return jnp.asarray(count) % local_steps == 0
  return jnp.asarray(local_step) == 0


def at_round_end(local_step, count, local_steps: int) -> jax.Array:
  """Whether this ``update`` is the last local step of a round (see :func:`at_round_start`):
  where a client prepares what it uploads (SCAFFOLD's control variate)."""
  if local_step is None:
    return jnp.asarray(count) % local_steps == local_steps - 1
  return jnp.asarray(local_step) == local_steps - 1


# ---- trackers filled from the first inner sample ------------------------------------------


@jax.tree_util.register_pytree_node_class
class Pending:
  """A tracker not yet filled: ``init(params)`` cannot know the inner value's structure.

  A pytree with no leaves whose static ``kind`` says how :func:`init_trackers` fills it:
  ``"inner"`` takes the inner value itself; ``"inner_jacobian"`` zeros shaped
  ``[p, *param.shape]`` for the flattened inner value's size ``p`` (GCIVR's ``J``).
  """

  KINDS = ("inner", "inner_jacobian")

  def __init__(self, kind: str = "inner"):
    self.kind = _validate.one_of("kind", kind, self.KINDS)

  def tree_flatten(self):
    return (), self.kind

  @classmethod
  def tree_unflatten(cls, kind, children):
    del children
    return cls(kind)

  def __eq__(self, other):
    return isinstance(other, Pending) and other.kind == self.kind

  def __hash__(self):
    return hash(("Pending", self.kind))

  def __repr__(self):
    return f"Pending({self.kind!r})"


def _is_pending(x) -> bool:
  return isinstance(x, Pending)


def has_pending(state) -> bool:
  """Whether any tracker of ``state`` (however nested) is still a :class:`Pending`."""
  return any(_is_pending(x) for x in jax.tree.leaves(state, is_leaf=_is_pending))


def init_trackers(state, params, inner_value):
  """``state`` with every :class:`Pending` tracker filled from ``inner_value = g(x_0)``.

  Works on any state that holds fedco algorithm states (``optax.chain``,
  ``optax.inject_hyperparams``, ...); a state with nothing pending is returned as is.
  """
  if not has_pending(state):
    return state
  if inner_value is None:
    raise ValueError(
      "init_trackers needs inner_value=g(params, batch): the state has "
      "trackers of the inner value that are not filled yet"
    )
  inner_value = jax.tree.map(jnp.asarray, inner_value)

  def fill(x):
    if not _is_pending(x):
      return x
    if x.kind == "inner":
      return inner_value
    size = ravel_pytree(inner_value)[0].shape
    return jax.tree.map(lambda p: jnp.zeros(size + jnp.shape(p), jnp.result_type(p)), params)

  return jax.tree.map(fill, state, is_leaf=_is_pending)


def fill_pending(state, params, inner_fn):
  """In ``update``: fill pending trackers from this step's sample ``inner_fn(params)``.

  Decided while tracing, so a state with nothing pending costs nothing."""
  if not has_pending(state):
    return state
  return init_trackers(state, params, inner_fn(params))


def pending_or(inner_value, fill):
  """In ``init``: ``fill(inner_value)`` when given, else a :class:`Pending` tracker."""
  if inner_value is None:
    return Pending("inner")
  return fill(jax.tree.map(jnp.asarray, inner_value))


# ---- the plan's fields, wherever they sit in a (chained, injected) state --------------------

_MISSING = object()


def get_field(state, name: str):
  """The state field ``name``, found anywhere in a nested state (optax's ``tree_get``)."""
  try:
    value = optax.tree_utils.tree_get(state, name, default=_MISSING)
  except KeyError:
    raise ValueError(
      f"the algorithm's state holds more than one field named {name!r} (a chained "
      f"transform uses the same name); the runtime cannot tell which to communicate"
    ) from None
  if value is _MISSING:
    raise ValueError(
      f"the communication plan names the field {name!r}, which the algorithm's state does not have"
    )
  return value


def set_fields(state, **values):
  """``state`` with the named fields replaced, wherever they sit (optax's ``tree_set``)."""
  if not values:
    return state
  for name in values:
    get_field(state, name)  # a clear error for a missing or ambiguous field
  return optax.tree_utils.tree_set(state, **values)


# ---- composition ----------------------------------------------------------------------------


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
  to the algorithm.
  """
  algorithm = _the_algorithm(transforms, "fedco.chain")
  tx = optax.chain(*transforms)
  return algorithm.replace(init=tx.init, update=tx.update)


def named_chain(*named_transforms) -> Algorithm:
  """``optax.named_chain`` (``(name, transform)`` pairs) that keeps the fedco algorithm."""
  algorithm = _the_algorithm([t for _, t in named_transforms], "fedco.named_chain")
  tx = optax.named_chain(*named_transforms)
  return algorithm.replace(init=tx.init, update=tx.update)


class InjectedServerState(NamedTuple):
  """The server's injected hyperparameters (change them between calls) and its own state."""

  count: jax.Array
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
  ``static_args`` given here.

  * The client transform is exactly ``optax.inject_hyperparams(algorithm_factory, ...)``:
    its state is an ``InjectHyperparamsState`` whose ``hyperparams`` dict you may change,
    and client schedules count that client's local steps.
  * The server is built from the same arguments; its state is an
    :class:`InjectedServerState` (``hyperparams`` dict, schedules counting rounds), so
    server-side rates (DS-FedDRO's ``server_lr_x``, DRFA's ``weights_lr``) are state too.

  Returns:
    a factory with ``algorithm_factory``'s signature that returns an :class:`Algorithm`.
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

  build.static_args = tuple(sorted(static))
  return build


def _schedule_at(schedule, count):
  if isinstance(schedule, optax.schedules.StatefulSchedule):
    raise ValueError(
      "fedco.inject_hyperparams takes schedules of the step count "
      "(callables); stateful schedules are not supported"
    )
  return schedule(count)


def make_plan(
  local_steps,
  *,
  every_step=(),
  every_round=(),
  at_init=(),
  weighting="uniform",
  round_start=(),
  round_start_loss=(),
  report=(),
  round_start_reduce=None,
  round_start_value="inner",
) -> CommPlan:
  """A validated :class:`CommPlan` (see its attributes; ``at_init`` defaults to none)."""
  _validate.one_of("round_start_value", round_start_value, ("inner", "pre_link"))
  if at_init is None:
    raise ValueError("at_init must be a tuple of field names (() for none), got None")
  for what, names in (
    ("every_step", every_step),
    ("every_round", every_round),
    ("at_init", at_init),
    ("round_start", round_start),
    ("round_start_loss", round_start_loss),
    ("report", report),
  ):
    if isinstance(names, str) or not all(isinstance(n, str) and n for n in names):
      raise ValueError(f"{what} must be a tuple of field names, got {names!r}")
  _validate.positive_int("local_steps", local_steps)
  _validate.one_of("weighting", weighting, ("uniform", "samples"))
  if round_start_reduce is not None and not callable(round_start_reduce):
    raise ValueError(f"round_start_reduce must be callable, got {round_start_reduce!r}")
  return CommPlan(
    int(local_steps),
    tuple(every_step),
    tuple(every_round),
    tuple(at_init),
    weighting,
    tuple(round_start),
    tuple(round_start_loss),
    tuple(report),
    round_start_reduce,
    round_start_value,
  )


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
    reads_each: whether ``update`` reads the clients' values one by one (q-FedAvg, AFL,
      DRFA...) rather than only their weighted mean (:func:`optax_aggregator`); privacy
      noise then goes on each upload instead of once on the mean.
    queries_losses: whether ``update`` calls ``info.client_losses`` (DRFA's loss queries:
      uploads outside the communication plan, which privacy refuses).
  """

  init: Callable[..., Any]
  update: Callable[..., Tuple[Any, Any]]
  reads_each: bool = True
  queries_losses: bool = False


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

  return ServerAggregator(init, update, reads_each=False)


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


def param_optimizer(
  learning_rate: Optional[ScalarOrSchedule], optimizer, *, default: float, shared_rate: bool = False
) -> optax.GradientTransformation:
  """The parameter step.

  * ``optimizer=None``: the paper's ``optax.sgd(learning_rate)`` (``default`` when
    ``learning_rate`` is ``None``).
  * ``optimizer`` a factory of the learning rate (``optax.adam``,
    ``functools.partial(optax.sgd, momentum=0.9)``): ``optimizer(learning_rate)``, so
    ``learning_rate`` (a number, a schedule, or an injected hyperparameter) feeds it.
  * ``optimizer`` an optax transform: used as it is; it has its own step size, so passing
    ``learning_rate`` too is an error rather than silently ignored, unless ``shared_rate``:
    the algorithm's rate also sets other rates (Local-SCGDM's tracker and momentum rates,
    q-FedAvg's server ``L``), so it is used either way.
  """
  if optimizer is None:
    lr = default if learning_rate is None else learning_rate
    return optax.sgd(_validate.rate("learning_rate", lr))
  if isinstance(optimizer, optax.GradientTransformation):
    if learning_rate is not None and not shared_rate:
      raise ValueError(
        "pass learning_rate or optimizer, not both: optimizer is a GradientTransformation "
        "with its own step size; pass a factory (e.g. optimizer=optax.adam) to feed it "
        f"learning_rate={learning_rate!r}"
      )
    return optimizer
  if callable(optimizer):
    lr = default if learning_rate is None else learning_rate
    tx = optimizer(_validate.rate("learning_rate", lr))
    if not isinstance(tx, optax.GradientTransformation):
      raise ValueError(
        f"optimizer(learning_rate) must return an optax GradientTransformation, "
        f"got {type(tx).__name__}"
      )
    return tx
  raise ValueError(
    "optimizer must be an optax GradientTransformation or a factory of the "
    f"learning rate (e.g. optax.adam), got {optimizer!r}"
  )


def require(name: str, value, algorithm: str):
  """Raise a clear error when a compositional algorithm is called without its oracle."""
  if value is None:
    raise ValueError(
      f"{algorithm}.update needs the keyword argument {name}; pass a callable "
      f"(see fedco.oracle_args), got None"
    )
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
