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

``update(updates, state, params, *, inner_fn, outer_fn, next_inner_fn, **extra_args)``
receives the oracles and the runtime's other keyword arguments listed in :mod:`fedco.extend`
("What ``update`` receives").

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

import difflib
import functools
import inspect
import types
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

  A plan names state fields of the algorithm (found anywhere in a nested state, see
  :func:`get_field`) and says how the federated runtime synchronises each of them; the
  parameters are always aggregated at the end of a round. Build one with :func:`make_plan`,
  which checks the values; :attr:`fields` lists every field the plan names.

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

  Examples:
    >>> import fedco
    >>> plan = fedco.ds_feddro(local_steps=5).plan  # y aggregated with x once a round
    >>> plan.local_steps, plan.every_round, plan.at_init
    (5, ('y',), ('y',))
    >>> fedco.feddro().plan.every_step  # FedDRO shares y after every step
    ('y',)
    >>> fedco.CommPlan(3, every_step=("y",), every_round=("u", "y")).fields
    ('y', 'u')
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
    """The ``at_init`` fields as a tuple (``()`` for none)."""
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
  r"""An optax ``GradientTransformationExtraArgs`` plus what the federated runtime needs.

  It *is* the ``(init, update)`` pair, so optax's combinators accept it as any other
  transform; :func:`chain` and :func:`inject_hyperparams` return an :class:`Algorithm`
  again, with the plan, server and name intact. ``update`` receives ``updates = grad h(x;
  xi)`` (or ``None``) and the oracles as keyword arguments (``inner_fn(x) = g(x; zeta)``,
  ``outer_fn(y) = f(y; xi)``, ...; see this module's docstring) and returns the step to add
  to the parameters with ``optax.apply_updates``. An algorithm built by a :func:`factory`
  also carries ``arguments``, the factory's name and bound arguments (for run fingerprints).
  Use :meth:`replace` for a copy with some attributes changed.

  Attributes:
    init: ``(params, *, inner_value=None) -> state``; ``inner_value = g(x_0; zeta_0)`` fills
      the trackers of the inner value at once (else they start :class:`Pending`). Chained
      and injected algorithms take ``params`` only: fill them with :func:`init_trackers`.
    update: ``(updates, state, params=None, **extra_args) -> (updates, state)``.
    plan: the :class:`CommPlan`.
    server: an optax transformation on pseudo-gradient dicts ``{"params": ..., field: ...}``,
      or a :class:`ServerAggregator` for servers that need every client's values.
    name: a short label for logs and metrics.
    problem_kind: the problem class it solves: ``"local"`` (local-inner, :math:`F(x) =
      \frac{1}{K}\sum_k [f_k(g_k(x)) + h_k(x)]`), ``"global"`` (global-inner, :math:`\Phi(x)
      = h(x) + f(g(x))`, :math:`g = \frac{1}{K}\sum_k g_k`) or ``"plain"`` (only ``h``).

  Examples:
    One step of Local-SCGD on :math:`f(g(x))` with :math:`g(x) = x^2` (elementwise) and
    :math:`f(y) = \sum_i y_i`, whose gradient is :math:`2x`:

    >>> import jax.numpy as jnp
    >>> import optax
    >>> import fedco
    >>> opt = fedco.local_scgd(0.1, local_steps=2)
    >>> opt.problem_kind, opt.plan.every_round  # u is averaged with x every 2 steps
    ('local', ('u',))
    >>> params = jnp.array([1.0, -1.0])
    >>> inner_fn = lambda x: x**2
    >>> outer_fn = lambda y: jnp.sum(y)
    >>> state = opt.init(params, inner_value=inner_fn(params))
    >>> updates, state = opt.update(None, state, params, inner_fn=inner_fn, outer_fn=outer_fn)
    >>> params = optax.apply_updates(params, updates)
    >>> [round(float(v), 4) for v in params]  # x - 0.1 * 2x
    [0.8, -0.8]
  """

  def __new__(cls, init, update, plan: CommPlan, server, name: str, problem_kind: str):
    self = super().__new__(cls, init, update)
    self.__dict__.update(plan=plan, server=server, name=name, problem_kind=problem_kind)
    return self

  def replace(self, **changes) -> "Algorithm":
    """A copy with some of its attributes replaced (``NamedTuple._replace`` is the same).

    Args:
      **changes: new values for any of ``init``, ``update``, ``plan``, ``server``, ``name``
        and ``problem_kind``.

    Returns:
      a new :class:`Algorithm` (without the ``arguments`` a :func:`factory` recorded).

    Raises:
      ValueError: a keyword is not one of those six.
    """
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


#: A learning rate: a number, or an optax schedule ``step -> rate``.
ScalarOrSchedule = optax.ScalarOrSchedule
#: The parameter step of a factory's ``optimizer=``: ``None``, an optax transform, or a
#: factory of the learning rate (``optax.adam``).
Optimizer = Optional[Any]


# Annotations of arguments that inject_hyperparams would mistake for hyperparameters: an int
# becomes a traced number, an optimizer factory (a callable) a schedule. (Strings and bools
# stay static by their value.)
_STRUCTURAL = {"int", "Optimizer"}


def _structural(annotation) -> bool:
  """Whether an annotation (a string under ``from __future__ import annotations``, or an
  ``int`` object) is an int or an optimizer, alone or with ``None`` (``Optional[...]``, ``X |
  None``), however the module was imported (``base.``, ``extend.``, ``fedco.``)."""
  # (Optimizer is Optional[Any] once evaluated: only its written name tells it apart.)
  if annotation is int or annotation == Optional[int]:
    return True
  text = annotation if isinstance(annotation, str) else repr(annotation)
  for prefix in ("typing.", "fedco.algorithms.base.", "fedco.extend.", "fedco.", "extend."):
    text = text.replace(prefix, "")
  text = text.replace("base.", "").replace("Optional[", "").replace("Union[", "")
  names = {n.strip() for n in text.replace("]", "").replace("|", ",").split(",")} - {"None"}
  return bool(names) and names <= _STRUCTURAL


def factory(*, static: Tuple[str, ...] = ()):
  """Marks an algorithm factory's structural arguments (``static_args``).

  :func:`inject_hyperparams` keeps these static (a compiled program depends on them:
  ``local_steps``, counts, the ``optimizer``); every other numeric argument becomes state.
  Checked when the factory is decorated: ``static`` must name arguments of the factory, and
  every argument annotated ``int`` (or ``Optional[int]``) or ``Optimizer``, or unannotated
  with an ``int`` default, must be in it: under ``inject_hyperparams`` an int would
  silently become a traced number and an optimizer factory a schedule. (``str`` and
  ``bool`` arguments stay static by value.)
  Every :class:`Algorithm` the decorated factory builds records what built it in its
  ``arguments`` attribute (``{"factory": name, argument: value, ...}``, defaults included),
  which run fingerprints read.

  Args:
    static: the names of the factory's structural arguments (a tuple, or one name as a
      string); default: none.

  Returns:
    a decorator; it returns the factory wrapped (same signature and docstring), with
    ``static_args``, the tuple of ``static``.

  Raises:
    ValueError: ``static`` names an unknown argument, or leaves out a structural one.

  Examples:
    >>> import optax
    >>> from fedco import extend
    >>> @extend.factory(static=("local_steps",))
    ... def local_sgd(learning_rate: float = 0.1, local_steps: int = 2):
    ...   tx = optax.with_extra_args_support(optax.sgd(learning_rate))
    ...   plan = extend.make_plan(local_steps)
    ...   return extend.Algorithm(tx.init, tx.update, plan, extend.averaging_server(),
    ...                           "local_sgd", "plain")
    >>> local_sgd.static_args
    ('local_steps',)
    >>> local_sgd(0.5).arguments
    {'factory': 'local_sgd', 'learning_rate': 0.5, 'local_steps': 2}
    >>> @extend.factory()  # an int argument left out of static
    ... def bad(local_steps: int = 2):
    ...   pass
    Traceback (most recent call last):
      ...
    ValueError: @factory(static=...) of bad leaves out ['local_steps']: ...
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
      and (
        _structural(p.annotation)
        if p.annotation is not inspect.Parameter.empty
        else type(p.default) is int  # unannotated with an int default: an int
      )
    ]
    if missing:
      raise ValueError(
        f"@factory(static=...) of {name} leaves out {missing}: arguments "
        f"annotated int or Optimizer (or unannotated with an int default) shape the "
        f"compiled program and must be static (add them to static=, or annotate a "
        f"number float and give it a float default)"
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


class UnknownAlgorithmError(KeyError):
  """A name ``fedco.ALGORITHMS`` does not hold; the message names the close matches.

  A ``KeyError``, so ``except KeyError`` still catches it; its message prints as written
  (a bare ``KeyError`` quotes its argument).
  """

  def __str__(self) -> str:
    return str(self.args[0]) if self.args else ""


class _Registry(dict):
  """``fedco.ALGORITHMS``: a dict whose failed lookups name the close matches."""

  def __missing__(self, name):
    names = sorted(self)
    close = difflib.get_close_matches(str(name).lower(), names, n=3, cutoff=0.6)
    quoted = [repr(c) for c in close]
    hint = f" (did you mean {' or '.join(quoted)}?)" if close else ""
    raise UnknownAlgorithmError(
      f"fedco.ALGORITHMS has no algorithm {name!r}{hint}; its {len(names)} names are "
      "sorted(fedco.ALGORITHMS), each described in docs/algorithms.md"
    )


# name -> factory of every registered algorithm: fedco.ALGORITHMS.
REGISTRY: dict = _Registry()


def register(*, settings: dict):
  """Adds a :func:`factory` to ``fedco.ALGORITHMS`` under its function name.

  Built-in algorithms are registered in their own module, so adding one is that module and
  its tests; ``fedco.ALGORITHMS``, ``fedco.<name>``, the test suite's coverage and the mesh
  and multi-process checks follow. A user's algorithm needs no registration to run
  anywhere (``simulate``, ``sweep``, :func:`fedco.testing.check_algorithm`); registering it
  makes it a name the experiment configs accept (``methods.<label>.algorithm``). Put
  ``@register`` above ``@factory``. Registering the same function again is allowed.

  Args:
    settings: ``{label: keyword arguments}``: small configurations that converge on the
      test problem (``fedco.testing``'s portfolio), run by the contract tests; more than one
      label tests several configurations (``fedavg_co``'s cases).

  Returns:
    a decorator that registers the factory and returns it unchanged but for its
    ``settings`` attribute (a copy of ``settings``).

  Raises:
    ValueError: the name is taken, the function is not a :func:`factory`, or ``settings``
      is empty or names arguments the factory does not take.

  Examples:
    >>> import optax
    >>> import fedco
    >>> from fedco import extend
    >>> @extend.register(settings={"my_sgd": dict(learning_rate=0.1)})
    ... @extend.factory(static=("local_steps",))
    ... def my_sgd(learning_rate: float = 0.1, local_steps: int = 2):
    ...   tx = optax.with_extra_args_support(optax.sgd(learning_rate))
    ...   plan = extend.make_plan(local_steps)
    ...   return extend.Algorithm(tx.init, tx.update, plan, extend.averaging_server(),
    ...                           "my_sgd", "plain")
    >>> fedco.ALGORITHMS["my_sgd"] is my_sgd, my_sgd.settings
    (True, {'my_sgd': {'learning_rate': 0.1}})
    >>> del fedco.ALGORITHMS["my_sgd"]  # leave the registry as it was
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

  Args:
    tree: a pytree of arrays or Python numbers.

  Returns:
    the same structure, each leaf a ``jax.Array`` of the leaf's dtype, not weakly typed.

  Examples:
    >>> import jax.numpy as jnp
    >>> from fedco import extend
    >>> params = {"w": jnp.full((2,), 0.1)}  # weak-typed: a Python float
    >>> jnp.zeros_like(params["w"]).weak_type
    True
    >>> m = jnp.zeros_like(extend.strong(params)["w"])
    >>> m.weak_type, m.dtype.name
    (False, 'float32')
  """
  return jax.tree.map(lambda a: jnp.asarray(a, jnp.result_type(a)), tree)


def at_round_start(local_step, count, local_steps: int) -> jax.Array:
  """Whether this ``update`` is the first local step of a round.

  The runtime passes ``local_step`` (``0 .. local_steps - 1``); in a user's own loop it is
  ``None`` and the step count tells (``count % local_steps == 0``, every ``local_steps``
  calls starting with the first). Use it where a client does something once a round:
  anchor to the round's model (FedProx, Ditto), reset a per-round accumulator.

  Args:
    local_step: the ``local_step`` keyword argument ``update`` received (an int or an int
      array), or ``None`` outside the runtime.
    count: the number of updates this state has taken (the state's step counter); read
      only when ``local_step`` is ``None``.
    local_steps: the plan's steps per round, ``>= 1``.

  Returns:
    a boolean scalar ``jax.Array`` (traceable, for ``jnp.where`` / :func:`select`).

  Examples:
    >>> from fedco import extend
    >>> [bool(extend.at_round_start(None, count, 3)) for count in range(6)]
    [True, False, False, True, False, False]
    >>> bool(extend.at_round_start(0, 7, 3))  # the runtime's local_step decides
    True
  """
  if local_step is None:
    return jnp.asarray(count) % local_steps == 0
  return jnp.asarray(local_step) == 0


def at_round_end(local_step, count, local_steps: int) -> jax.Array:
  """Whether this ``update`` is the last local step of a round.

  Where a client prepares what it uploads (SCAFFOLD's control variate). Like
  :func:`at_round_start`, it reads the runtime's ``local_step`` when given and otherwise the
  step count (``count % local_steps == local_steps - 1``). A straggler stops before its last
  step, so an upload computed only here may be missing: prefer one kept right at every step.

  Args:
    local_step: the ``local_step`` keyword argument ``update`` received, or ``None``
      outside the runtime.
    count: the number of updates this state has taken; read only when ``local_step`` is
      ``None``.
    local_steps: the plan's steps per round, ``>= 1``.

  Returns:
    a boolean scalar ``jax.Array``.

  Examples:
    >>> from fedco import extend
    >>> [bool(extend.at_round_end(None, count, 3)) for count in range(6)]
    [False, False, True, False, False, True]
  """
  if local_step is None:
    return jnp.asarray(count) % local_steps == local_steps - 1
  return jnp.asarray(local_step) == local_steps - 1


# ---- trackers filled from the first inner sample ------------------------------------------


@jax.tree_util.register_pytree_node_class
class Pending:
  """A tracker not yet filled: ``init(params)`` cannot know the inner value's structure.

  A pytree with no leaves whose static ``kind`` says how :func:`init_trackers` fills it:
  ``"inner"`` takes ``fill(inner_value)`` (the inner value itself without a ``fill``);
  ``"inner_jacobian"`` zeros shaped ``[p, *param.shape]`` for the flattened inner value's
  size ``p`` (GCIVR's ``J``). Algorithms create it with :func:`pending_or` and fill it with
  :func:`fill_pending`. The fill is part of the state's structure: two placeholders are
  equal when their kinds are and their fills compute the same (the same function; or the
  same code, defaults and captured values, such as a lambda made anew by each ``init``
  call; or a ``functools.partial`` of such), so states from two ``init`` calls share one
  structure, and fills that capture other values (or arrays) give other structures.

  Args:
    kind: ``"inner"`` (default) or ``"inner_jacobian"``.
    fill: ``"inner"`` only: ``inner_value -> tracker`` (``None``: the inner value itself).

  Raises:
    ValueError: ``kind`` is not one of those, a ``fill`` is given that is not callable or
      for ``"inner_jacobian"``, or the fill captures a traced value (a hyperparameter being
      injected or swept: a fill must depend on the inner value alone).

  Examples:
    >>> import jax
    >>> from fedco import extend
    >>> tracker = extend.Pending()
    >>> tracker, jax.tree.leaves(tracker)
    (Pending('inner'), [])
    >>> extend.has_pending({"u": tracker, "count": 0})
    True
  """

  KINDS = ("inner", "inner_jacobian")

  def __init__(self, kind: str = "inner", fill: Optional[Callable] = None):
    self.kind = _validate.one_of("kind", kind, self.KINDS)
    if fill is not None and (kind != "inner" or not callable(fill)):
      raise ValueError(
        f"fill must be a function inner_value -> tracker, for kind 'inner' only; got "
        f"{fill!r} for kind {kind!r}"
      )
    self.fill = fill
    self._key = (self.kind, _fill_key(fill))

  def tree_flatten(self):
    return (), self  # static: the kind and the fill; no leaves

  @classmethod
  def tree_unflatten(cls, aux, children):
    del children
    return aux

  def __eq__(self, other):
    return isinstance(other, Pending) and other._key == self._key

  def __hash__(self):
    return hash(("Pending", *self._key))

  def __repr__(self):
    return f"Pending({self.kind!r})"


class _Unkeyed(Exception):
  """A fill whose computation cannot be told from its code and captured values."""


def _fill_key(fill):
  """What a fill computes, as a hashable key: ``None``; a function's code, defaults and
  captured values; a ``functools.partial``'s function, arguments and keywords; another
  callable itself; otherwise (arrays captured) the fill itself, compared by identity."""
  if fill is None:
    return None
  try:
    key = _static(fill)
    hash(key)
    return key
  except (_Unkeyed, TypeError):
    return ("object", fill)


def _static(value):
  """``value`` as a hashable key of what it is (``_Unkeyed`` for arrays and objects)."""
  if isinstance(value, jax.core.Tracer):
    raise ValueError(
      "pending_or: the fill captures a traced value (an injected or swept hyperparameter?); "
      "a fill must depend on the inner value alone: apply hyperparameters in update"
    )
  if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
    return (type(value).__name__, value)
  if isinstance(value, tuple):
    return ("tuple",) + tuple(_static(v) for v in value)
  if isinstance(value, functools.partial):
    keywords = tuple(sorted((k, _static(v)) for k, v in value.keywords.items()))
    return ("partial", _static(value.func), _static(value.args), keywords)
  if isinstance(value, types.FunctionType):
    cells = tuple(_static(c.cell_contents) for c in value.__closure__ or ())
    kwdefaults = tuple(sorted((k, _static(v)) for k, v in (value.__kwdefaults__ or {}).items()))
    return ("function", value.__code__, _static(value.__defaults__), kwdefaults, cells)
  if callable(value) and not hasattr(value, "shape"):  # a module's function, a bound method
    return ("callable", value)
  raise _Unkeyed


def _is_pending(x) -> bool:
  return isinstance(x, Pending)


def has_pending(state) -> bool:
  """Whether any tracker of ``state`` (however nested) is still a :class:`Pending`.

  Decided from the state's structure alone, so it is a Python bool even while tracing.

  Args:
    state: any pytree (an algorithm's state, chained or injected).

  Returns:
    ``True`` when some node of ``state`` is a :class:`Pending`, else ``False``.

  Examples:
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> from fedco import extend
    >>> state = fedco.local_scgd(0.1).init(jnp.zeros(2))
    >>> extend.has_pending(state)  # its tracker u waits for g(x_0)
    True
    >>> extend.has_pending(fedco.local_scgd(0.1).init(jnp.zeros(2), inner_value=jnp.ones(3)))
    False
  """
  return any(_is_pending(x) for x in jax.tree.leaves(state, is_leaf=_is_pending))


def init_trackers(state, params, inner_value):
  """``state`` with every :class:`Pending` tracker filled from ``inner_value = g(x_0)``.

  Works on any state that holds fedco algorithm states (``optax.chain``,
  ``optax.inject_hyperparams``, ...); a state with nothing pending is returned as is.
  A ``"inner"`` tracker becomes ``fill(inner_value)`` with the ``fill`` it was made with
  (:func:`pending_or`; ``inner_value`` itself without one); an ``"inner_jacobian"`` one zeros of shape
  ``[p, *leaf.shape]`` for each leaf of ``params``, where ``p`` is the flattened size of
  ``inner_value``. Filling before a jitted loop or ``lax.scan`` keeps the state's structure
  fixed; the runtime does it for every client from one mini-batch ``g_k(x_0; zeta_0)`` and
  then averages the plan's ``at_init`` fields (SPEC 2.5).

  Args:
    state: an algorithm's state, however nested.
    params: the parameters ``x_0`` (the structure of ``"inner_jacobian"`` trackers).
    inner_value: ``g(x_0; zeta_0)``, a pytree of arrays; may be ``None`` when nothing is
      pending.

  Returns:
    ``state`` with the same structure but every :class:`Pending` replaced by arrays.

  Raises:
    ValueError: ``state`` has pending trackers and ``inner_value`` is ``None``.

  Examples:
    >>> import jax.numpy as jnp
    >>> import optax
    >>> import fedco
    >>> opt = fedco.chain(optax.clip_by_global_norm(1.0), fedco.local_scgd(0.1))
    >>> params = jnp.array([1.0, 2.0])
    >>> state = opt.init(params)  # a chain's init takes params only
    >>> state[1].u
    Pending('inner')
    >>> state = fedco.init_trackers(state, params, inner_value=params**2)
    >>> [round(float(v), 4) for v in state[1].u]
    [1.0, 4.0]
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
      return inner_value if x.fill is None else x.fill(inner_value)
    size = ravel_pytree(inner_value)[0].shape
    return jax.tree.map(lambda p: jnp.zeros(size + jnp.shape(p), jnp.result_type(p)), params)

  return jax.tree.map(fill, state, is_leaf=_is_pending)


def fill_pending(state, params, inner_fn):
  """In ``update``: fill pending trackers from this step's sample ``inner_fn(params)``.

  Decided while tracing, so a state with nothing pending costs nothing (``inner_fn`` is not
  called); otherwise this is :func:`init_trackers` with ``inner_value = inner_fn(params)``.
  Call it first in ``update``, so that an algorithm initialised without ``inner_value``
  still runs (a jitted loop then traces twice: the state's structure changes once).

  Args:
    state: the algorithm's state as ``update`` received it.
    params: the current parameters ``x``.
    inner_fn: the oracle ``x -> g(x; zeta)`` of this step.

  Returns:
    ``state`` with no :class:`Pending` left.

  Examples:
    >>> import jax.numpy as jnp
    >>> from fedco import extend
    >>> state = {"u": extend.pending_or(None, lambda v: v)}
    >>> state = extend.fill_pending(state, jnp.array([1.0, 2.0]), lambda x: 3 * x)
    >>> [round(float(v), 4) for v in state["u"]]
    [3.0, 6.0]
  """
  if not has_pending(state):
    return state
  return init_trackers(state, params, inner_fn(params))


def pending_or(inner_value, fill):
  """In ``init``: ``fill(inner_value)`` when given, else a :class:`Pending` tracker.

  The way to start a tracker of the inner value (``y``, ``u``): ``init(params,
  inner_value=...)`` fills it at once; without the value, the runtime (:func:`init_trackers`)
  or :func:`fill_pending` in the first ``update`` fills it with the same ``fill``.

  Args:
    inner_value: ``g(x_0; zeta_0)`` (a pytree; its leaves are made ``jax.Array``) or
      ``None``.
    fill: ``inner_value -> tracker``, e.g. ``lambda v: v`` or an estimator's ``init``; a
      function of the inner value alone (it may run later, where an injected or swept
      hyperparameter is not at hand: use those in ``update``).

  Returns:
    ``fill(inner_value)``, or ``Pending("inner", fill)`` when ``inner_value`` is ``None``.

  Examples:
    >>> import jax.numpy as jnp
    >>> from fedco import extend
    >>> extend.pending_or(None, lambda v: v)
    Pending('inner')
    >>> extend.pending_or([1.0, 2.0], lambda v: v)[1].dtype.name
    'float32'

    Filled later, the tracker is the same ``fill`` of the inner value:

    >>> half = lambda v: v / 2
    >>> state = {"u": extend.pending_or(None, half)}
    >>> extend.fill_pending(state, jnp.array([2.0, 4.0]), lambda x: x)["u"].tolist()
    [1.0, 2.0]
  """
  if inner_value is None:
    return Pending("inner", fill)
  return fill(jax.tree.map(jnp.asarray, inner_value))


# ---- the plan's fields, wherever they sit in a (chained, injected) state --------------------

_MISSING = object()


def get_field(state, name: str):
  """The state field ``name``, found anywhere in a nested state (optax's ``tree_get``).

  How the runtime reads the fields its :class:`CommPlan` names, whether the algorithm's
  state is at the top or inside a :func:`chain` or :func:`inject_hyperparams` state.

  Args:
    state: an algorithm's state (NamedTuples, dicts, tuples, nested).
    name: a field name (a NamedTuple field or a dict key).

  Returns:
    the field's value (any pytree).

  Raises:
    ValueError: no field is called ``name``, or more than one is (a chained transform
      uses the same name).

  Examples:
    >>> import jax.numpy as jnp
    >>> import optax
    >>> import fedco
    >>> opt = fedco.chain(optax.clip_by_global_norm(1.0), fedco.local_scgd(0.1))
    >>> state = fedco.init_trackers(opt.init(jnp.zeros(2)), jnp.zeros(2), jnp.ones(3))
    >>> fedco.algorithms.get_field(state, "u").shape
    (3,)
  """
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
  """``state`` with the named fields replaced, wherever they sit (optax's ``tree_set``).

  How the runtime writes the fields its :class:`CommPlan` names (the server's values at
  the start of a round, the clients' mean after a step); see :func:`get_field`.

  Args:
    state: an algorithm's state, however nested.
    **values: ``name=value`` for each field to replace; none returns ``state`` as is.

  Returns:
    a new state of the same structure with those fields replaced.

  Raises:
    ValueError: a name is not a field of ``state``, or names more than one.

  Examples:
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> state = fedco.local_scgd(0.1).init(jnp.zeros(2), inner_value=jnp.zeros(2))
    >>> state = fedco.algorithms.set_fields(state, u=jnp.array([0.5, 1.5]))
    >>> [round(float(v), 4) for v in state.u]
    [0.5, 1.5]
  """
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
  """A validated :class:`CommPlan` (see its attributes; ``at_init`` defaults to none).

  What every algorithm factory calls to build its plan: it checks each argument and
  returns the plan with field-name sequences as tuples.

  Args:
    local_steps: steps per round, a positive int (``I``, ``tau`` or ``p``).
    every_step: fields averaged over the round's clients after every step (plain mean).
    every_round: fields aggregated with the parameters at the end of every round, through
      the server.
    at_init: fields averaged over all clients once, after ``init`` (trackers of the inner
      value only); default ``()``, none.
    weighting: ``"uniform"`` (default) or ``"samples"`` (weights proportional to data
      sizes).
    round_start: fields recomputed at the start of every round from the clients' values
      at the server model.
    round_start_loss: fields set at the start of every round to each client's exact loss
      at the server model.
    report: fields sent up at the end of a round for a :class:`ServerAggregator` to read.
    round_start_reduce: ``None`` (the weighted mean) or a callable ``(values [S, ...],
      weights [S]) -> value`` combining the ``round_start`` values.
    round_start_value: what clients evaluate for ``round_start`` fields: ``"inner"``
      (default) or ``"pre_link"``.

  Returns:
    a :class:`CommPlan`.

  Raises:
    ValueError: ``local_steps`` is not a positive int, a field list is a string or holds a
      non-string or empty name, ``at_init`` is ``None``, ``weighting`` or
      ``round_start_value`` is not one of the allowed strings, or ``round_start_reduce`` is
      not callable.

  Examples:
    >>> from fedco import extend
    >>> plan = extend.make_plan(5, every_round=["u", "m"], at_init=("u", "m"))
    >>> plan.every_round, plan.fields, plan.weighting
    (('u', 'm'), ('u', 'm'), 'uniform')
    >>> extend.make_plan(5, every_round="u")  # a string is not a tuple of names
    Traceback (most recent call last):
      ...
    ValueError: every_round must be a tuple of field names, got 'u'
  """
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
      clients' values must not count. Their ``weights`` are already 0. ``None``
      (default): all of them; ``alive_mask`` gives the mask either way.

  Examples:
    The usual server after a round whose second client dropped out:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> from fedco import extend
    >>> info = extend.RoundInfo(ids=jnp.array([0, 2]), weights=jnp.array([1.0, 0.0]),
    ...                         counts=jnp.array([5, 5]), num_clients=3,
    ...                         key=jax.random.key(0), client_losses=None,
    ...                         alive=jnp.array([True, False]))
    >>> server = extend.optax_aggregator(extend.averaging_server())
    >>> values = {"params": jnp.zeros(2)}
    >>> clients = {"params": jnp.array([[1.0, 2.0], [9.0, 9.0]])}
    >>> values, _ = server.update(values, server.init(values, info.counts), clients, info)
    >>> [round(float(v), 4) for v in values["params"]]
    [1.0, 2.0]
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

  Examples:
    A coordinate-wise median server (robust to a few outlying clients; this simple one
    ignores dropout), used in place of FedAvg's:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> from fedco import extend
    >>> def init(server_values, counts):
    ...   return ()
    >>> def update(server_values, state, client_values, info):
    ...   values = {k: client_values[k] for k in server_values}
    ...   return jax.tree.map(lambda a: jnp.median(a, axis=0), values), state
    >>> opt = fedco.fedavg(0.1).replace(server=extend.ServerAggregator(init, update))
    >>> clients = {"params": jnp.array([[1.0], [2.0], [100.0]])}
    >>> info = extend.RoundInfo(ids=jnp.arange(3), weights=jnp.full(3, 1 / 3),
    ...                         counts=jnp.ones(3, int), num_clients=3,
    ...                         key=jax.random.key(0), client_losses=None)
    >>> server, _ = opt.server.update({"params": jnp.zeros(1)}, (), clients, info)
    >>> round(float(server["params"][0]), 4)
    2.0
  """

  init: Callable[..., Any]
  update: Callable[..., Tuple[Any, Any]]
  reads_each: bool = True
  queries_losses: bool = False


def weighted_client_mean(tree: PyTree, weights: jax.Array) -> PyTree:
  r"""``sum_i w_i v_i`` over the leading clients axis.

  :math:`\sum_i w_i v_i` for every leaf :math:`v` of shape ``[m, ...]``; the weights are
  cast to each leaf's dtype and are used as given (not normalised).

  Args:
    tree: a pytree whose leaves are stacked on a leading ``[m]`` clients axis.
    weights: ``[m]``, the clients' weights (those of :class:`RoundInfo` sum to 1).

  Returns:
    a pytree of ``tree``'s structure, each leaf without the leading axis.

  Examples:
    >>> import jax.numpy as jnp
    >>> from fedco import extend
    >>> tree = {"w": jnp.array([[1.0, 2.0], [3.0, 6.0]])}
    >>> mean = extend.weighted_client_mean(tree, jnp.array([0.25, 0.75]))
    >>> [round(float(v), 4) for v in mean["w"]]
    [2.5, 5.0]
  """
  return jax.tree.map(lambda a: jnp.tensordot(weights.astype(a.dtype), a, axes=1), tree)


def optax_aggregator(tx: optax.GradientTransformation) -> ServerAggregator:
  r"""The usual server: ``tx`` applied to ``server - weighted mean of the clients``.

  The pseudo-gradient :math:`\bar v - \sum_k w_k v_k` of each server value :math:`\bar v`
  (the parameters and the plan's ``every_round`` fields), with the weights of
  :class:`RoundInfo`, is passed to ``tx``, and its updates are applied: ``optax.sgd(1.0)``
  is plain averaging (:func:`averaging_server`), ``optax.adam`` FedAdam.

  Args:
    tx: an optax transformation on ``{"params": ..., field: ...}`` dicts.

  Returns:
    a :class:`ServerAggregator` that reads only the weighted mean (``reads_each=False``).

  Examples:
    A server that moves halfway to the clients' mean:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import optax
    >>> from fedco import extend
    >>> server = extend.optax_aggregator(optax.sgd(0.5))
    >>> info = extend.RoundInfo(ids=jnp.array([0, 1]), weights=jnp.array([0.5, 0.5]),
    ...                         counts=jnp.array([3, 3]), num_clients=2,
    ...                         key=jax.random.key(0), client_losses=None)
    >>> values = {"params": jnp.zeros(2)}
    >>> clients = {"params": jnp.array([[2.0, 0.0], [4.0, 2.0]])}
    >>> values, _ = server.update(values, server.init(values, info.counts), clients, info)
    >>> [round(float(v), 4) for v in values["params"]]
    [1.5, 0.5]
  """

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
  """An :class:`Algorithm`'s ``server`` as an aggregator (optax transforms are wrapped).

  Lets code that handles servers treat both kinds alike.

  Args:
    server: a :class:`ServerAggregator` (returned as is) or an optax transformation
      (wrapped by :func:`optax_aggregator`).

  Returns:
    a :class:`ServerAggregator`.

  Examples:
    >>> import fedco
    >>> from fedco import extend
    >>> extend.as_aggregator(fedco.fedavg(0.1).server).reads_each  # an optax server
    False
  """
  if isinstance(server, ServerAggregator):
    return server
  return optax_aggregator(server)


def project_simplex(v: jax.Array) -> jax.Array:
  r"""Euclidean projection onto the probability simplex (sort-based; Duchi et al. 2008).

  .. math::

    \Pi_\Delta(v) = \arg\min_{w \in \Delta} \|w - v\|_2 = \max(v - \theta, 0),
    \qquad \Delta = \{w \in \mathbb{R}^n : w \ge 0, \textstyle\sum_i w_i = 1\},

  with the threshold :math:`\theta` found from the sorted entries in :math:`O(n \log n)`.
  DRO baselines use it to keep client or sample weights on the simplex. Traceable.

  Args:
    v: a 1-D float array of length ``n >= 1`` (not batched).

  Returns:
    ``w``, an array of ``v``'s shape and dtype: nonnegative, summing to 1.

  Examples:
    >>> import jax
    >>> import jax.numpy as jnp
    >>> from fedco import algorithms
    >>> w = jax.jit(algorithms.project_simplex)(jnp.array([0.5, 1.0, -0.2]))
    >>> [round(float(x), 4) for x in w]
    [0.25, 0.75, 0.0]
  """
  n = v.shape[-1]
  u = jnp.sort(v)[::-1]
  css = jnp.cumsum(u) - 1.0
  ks = jnp.arange(1, n + 1, dtype=v.dtype)
  rho = jnp.max(jnp.where(u - css / ks > 0, ks, 0.0))
  theta = jnp.take(css, rho.astype(jnp.int32) - 1) / rho
  return jnp.maximum(v - theta, 0.0)


def averaging_server() -> optax.GradientTransformation:
  r"""Plain model averaging: ``server = server - 1.0 * (server - mean_k client)``.

  ``optax.sgd(1.0)`` on the pseudo-gradient :math:`\bar x - \sum_k w_k x_k`, so the new
  server value is the clients' weighted mean :math:`\sum_k w_k x_k`; the server of FedAvg
  and most built-in algorithms. Server SGD with another rate is DS-FedDRO's.

  Returns:
    an optax ``GradientTransformation`` (stateless).

  Examples:
    >>> import jax.numpy as jnp
    >>> import optax
    >>> from fedco import algorithms
    >>> tx = algorithms.averaging_server()
    >>> server, mean = jnp.zeros(2), jnp.array([1.0, 3.0])
    >>> updates, _ = tx.update(server - mean, tx.init(server))
    >>> [round(float(v), 4) for v in optax.apply_updates(server, updates)]
    [1.0, 3.0]
  """
  return optax.sgd(1.0)


def param_optimizer(
  learning_rate: Optional[ScalarOrSchedule], optimizer, *, default: float, shared_rate: bool = False
) -> optax.GradientTransformation:
  """The parameter step: what an algorithm's ``learning_rate`` and ``optimizer`` build.

  * ``optimizer=None``: the paper's ``optax.sgd(learning_rate)`` (``default`` when
    ``learning_rate`` is ``None``).
  * ``optimizer`` a factory of the learning rate (``optax.adam``,
    ``functools.partial(optax.sgd, momentum=0.9)``): ``optimizer(learning_rate)``, so
    ``learning_rate`` (a number, a schedule, or an injected hyperparameter) feeds it.
  * ``optimizer`` an optax transform: used as it is; it has its own step size, so passing
    ``learning_rate`` too is an error rather than silently ignored, unless ``shared_rate``:
    the algorithm's rate also sets other rates (Local-SCGDM's tracker and momentum rates,
    q-FedAvg's server ``L``), so it is used either way.

  Args:
    learning_rate: a positive rate, a schedule of the step count, or ``None`` (use
      ``default``).
    optimizer: ``None``, a factory of the learning rate, or an optax
      ``GradientTransformation``.
    default: the rate used when ``learning_rate`` is ``None`` (the algorithm's default).
    shared_rate: whether ``learning_rate`` may be given with an optax transform
      ``optimizer`` (default ``False``: it is an error).

  Returns:
    an optax ``GradientTransformation`` whose updates are the step to add to the
    parameters (negative gradient direction).

  Raises:
    ValueError: the rate is not positive; ``optimizer`` is a transform and a
      ``learning_rate`` is given without ``shared_rate``; ``optimizer(learning_rate)`` is not
      a transform; or ``optimizer`` is neither a transform nor callable.

  Examples:
    >>> import functools
    >>> import jax.numpy as jnp
    >>> import optax
    >>> from fedco import extend
    >>> grad, params = jnp.array([1.0, -2.0]), jnp.zeros(2)
    >>> sgd = extend.param_optimizer(None, None, default=0.1)  # sgd(0.1)
    >>> [round(float(v), 4) for v in sgd.update(grad, sgd.init(params))[0]]
    [-0.1, 0.2]
    >>> momentum = functools.partial(optax.sgd, momentum=0.9)
    >>> tx = extend.param_optimizer(0.01, momentum, default=0.1)  # sgd(0.01, momentum=0.9)
    >>> [round(float(v), 4) for v in tx.update(grad, tx.init(params))[0]]
    [-0.01, 0.02]
    >>> extend.param_optimizer(0.01, optax.adam(0.1), default=0.1)
    Traceback (most recent call last):
      ...
    ValueError: pass learning_rate or optimizer, not both: ...
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
  """Raise a clear error when a compositional algorithm is called without its oracle.

  Args:
    name: the keyword argument's name (``"inner_fn"``, ``"example_losses_fn"``, ...).
    value: what ``update`` received for it.
    algorithm: the algorithm's name, for the message.

  Returns:
    ``value``, when it is not ``None``.

  Raises:
    ValueError: ``value`` is ``None``.

  Examples:
    >>> from fedco import extend
    >>> extend.require("extra_fn", None, "my_alg")
    Traceback (most recent call last):
      ...
    ValueError: my_alg.update needs the keyword argument extra_fn; ...
  """
  if value is None:
    raise ValueError(
      f"{algorithm}.update needs the keyword argument {name}; pass a callable "
      f"(see fedco.oracle_args), got None"
    )
  return value


def oracles(name: str, inner_fn, outer_fn, next_inner_fn=None):
  """The checked ``(inner_fn, outer_fn, next_inner_fn)`` a compositional ``update`` needs.

  ``inner_fn(x) = g(x; zeta)`` and ``outer_fn(y) = f(y; xi)`` must be given (see
  :func:`require`); ``next_inner_fn(x) = g(x; zeta')`` defaults to ``inner_fn`` (one sample
  for everything).

  Args:
    name: the algorithm's name, for the error message.
    inner_fn: the inner oracle ``x -> g(x; zeta)``.
    outer_fn: the outer oracle ``y -> f(y; xi)``.
    next_inner_fn: the inner oracle on an independent sample, or ``None``.

  Returns:
    the tuple ``(inner_fn, outer_fn, next_inner_fn)``.

  Raises:
    ValueError: ``inner_fn`` or ``outer_fn`` is ``None``.

  Examples:
    >>> from fedco import extend
    >>> g, f = (lambda x: x**2), (lambda y: y.sum())
    >>> inner_fn, outer_fn, next_inner_fn = extend.oracles("my_alg", g, f)
    >>> next_inner_fn is g
    True
  """
  require("inner_fn", inner_fn, name)
  require("outer_fn", outer_fn, name)
  return inner_fn, outer_fn, inner_fn if next_inner_fn is None else next_inner_fn


def add_grads(z: PyTree, grad_h: Optional[PyTree]) -> PyTree:
  """``z + grad h`` where ``grad h`` may be ``None`` (no non-compositional term).

  Completes the compositional gradient ``z = J_g(x; zeta)^T grad f(y; xi) + grad h(x;
  xi')`` with the ``updates`` an algorithm receives.

  Args:
    z: a pytree (the compositional term, the parameters' structure).
    grad_h: ``None`` or a pytree of ``z``'s structure.

  Returns:
    ``z`` itself when ``grad_h`` is ``None``, else their leafwise sum.

  Examples:
    >>> import jax.numpy as jnp
    >>> from fedco import extend
    >>> z = {"w": jnp.array([1.0, 2.0])}
    >>> [round(float(v), 4) for v in extend.add_grads(z, {"w": jnp.array([0.5, 0.5])})["w"]]
    [1.5, 2.5]
    >>> extend.add_grads(z, None) is z
    True
  """
  return z if grad_h is None else jax.tree.map(jnp.add, z, grad_h)


def select(pred, on_true: PyTree, on_false: PyTree) -> PyTree:
  """Leafwise ``jnp.where(pred, on_true, on_false)``.

  A traceable ``if`` on whole states or updates (e.g. with :func:`at_round_start`);
  both branches are computed.

  Args:
    pred: a boolean scalar (or an array that broadcasts against every leaf).
    on_true: a pytree.
    on_false: a pytree of ``on_true``'s structure.

  Returns:
    a pytree of that structure, each leaf from ``on_true`` where ``pred`` holds, else from
    ``on_false``.

  Examples:
    >>> import jax.numpy as jnp
    >>> from fedco import extend
    >>> first = extend.at_round_start(None, 3, 3)
    >>> anchor = extend.select(first, {"x": jnp.ones(2)}, {"x": jnp.zeros(2)})
    >>> [round(float(v), 4) for v in anchor["x"]]
    [1.0, 1.0]
  """
  return jax.tree.map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)
