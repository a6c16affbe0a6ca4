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
("What ``update`` receives"). ``init(params)`` is optax's; trackers of the inner value start
as placeholders (:mod:`fedco.algorithms.core.trackers`).

The *communication plan* (:class:`CommPlan`, built by :func:`make_plan`) tells the federated
runtime what to average and when; the *server* (:mod:`fedco.algorithms.core.servers`) is an
optax transformation applied to pseudo-gradients ``server_value - mean_k client_value``. This
module also names the types of a factory's arguments, ``ScalarOrSchedule`` and
``Optimizer``.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Tuple, TypeAlias

import optax

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
    round_local: state fields whose value at a round's start is never read (the round's
      first step sets them, or they are ``every_round`` fields the server's copy
      overwrites): the runtime keeps them out of each client's stored state between rounds
      (``None`` there) and starts each round's clients from zeros, so a run of ``K``
      clients holds only what must persist (SCAFFOLD's ``c_i``, not its round's scratch;
      decision 109). Default: none.

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
  round_local: Tuple[str, ...] = ()

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
  round_local=(),
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
    round_local: fields not kept per client between rounds (see :class:`CommPlan`); none
      may be averaged after a step, at init or at a round's start, or be a report.

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
    ("round_local", round_local),
  ):
    if isinstance(names, str) or not all(isinstance(n, str) and n for n in names):
      raise ValueError(f"{what} must be a tuple of field names, got {names!r}")
  carried = set(every_step) | set(at_init) | set(round_start) | set(round_start_loss) | set(report)
  kept = sorted(set(round_local) & carried)
  if kept:
    raise ValueError(
      f"round_local names {kept}, which the plan reads at a round's start or after a step "
      f"(every_step, at_init, round_start, round_start_loss or report)"
    )
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
    tuple(round_local),
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
ScalarOrSchedule: TypeAlias = optax.ScalarOrSchedule
#: The parameter step of a factory's ``optimizer=``: ``None``, an optax transform, or a
#: factory of the learning rate (``optax.adam``).
Optimizer = Optional[Any]
