"""Check your algorithm as fedco checks its own: a chex-based contract kit.

You wrote an algorithm with :mod:`fedco.extend`; this kit tells you whether it really runs
everywhere a built-in one does. :func:`check_algorithm` runs an algorithm factory through
the contract every built-in algorithm meets (fedco's own test suite calls it on every entry
of ``fedco.ALGORITHMS``), so one call in your own test suite is enough::

  import fedco.testing

  def test_my_algorithm_meets_fedcos_contract():
    report = fedco.testing.check_algorithm(my_factory, learning_rate=0.1, local_steps=3)
    # {"builds": "passed", "state": "passed", ..., "mesh": "skipped: ..."}

Each check raises :class:`ContractError` (an ``AssertionError``) naming the algorithm, the
check and what broke; the report says which passed and which were skipped and why. The
checks (:data:`CHECKS`; ``checks=`` picks some):

* ``builds``: the factory returns an :class:`~fedco.extend.Algorithm` directly and under
  :func:`fedco.inject_hyperparams`; every field its plan names exists in its state.
* ``state``: a jitted step traces once over several updates, and the state keeps its tree
  structure, shapes and dtypes (a ``lax.scan`` carry must; a weak-typed field that the
  first update makes strong retraces every jitted loop).
* ``jit``: the same steps with and without ``jax.jit`` agree.
* ``chain``: ``optax.chain`` and ``fedco.chain`` with clips that never bite, before and
  after it, give the bare algorithm's steps (the oracles pass through).
* ``inject``: :func:`fedco.inject_hyperparams` from ``init(params)`` plus
  :func:`fedco.init_trackers` gives the same steps, and a changed ``learning_rate`` changes
  them without a new trace.
* ``simulate``: :func:`fedco.simulate` (vmapped clients, scanned steps and rounds) equals
  :func:`loop_reference`, a per-client Python loop of the transform and its plan.
* ``server``: the server uses the uploads: after one round the server model moved.
* ``asynchronous``: :func:`fedco.simulate` with ``asynchronous=`` (FedBuff: stale clients,
  staleness weights, discarded reports; :mod:`fedco.runtime.asynchrony`) equals
  :func:`async_reference`, an event-driven per-client loop (skipped for algorithms whose
  clients send state fields besides the model, which asynchrony refuses).
* ``sweep``: :func:`fedco.sweep` over two learning rates equals two ``simulate`` runs.
* ``resume``: a run checkpointed halfway and resumed ends bit-identical to one without a
  stop.
* ``mesh``: the run on a mesh of up to 8 devices equals the one-device run (skipped with
  one device: set ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` before importing
  jax).

The cheap checks (``builds``, ``state``, ``jit``) take seconds; all of them, tens of seconds
on a CPU. The default problem (:func:`default_problem`) is the portfolio problem of the
algorithm's kind (SPEC 4.7; a plain quadratic-plus-quartic loss for ``"plain"``
algorithms) on three clients of different sizes and means (:func:`default_data`), from
:func:`default_params`; pass ``problem``, ``data`` and ``params`` for your own.

The other helpers serve tests of your own:

* :func:`loop_reference`: what ``fedco.simulate`` must compute, as plain Python loops over
  clients and steps (the oracle of the ``simulate`` check).
* :func:`async_reference`: the same for buffered asynchronous aggregation, one report at a
  time (the oracle of the ``asynchronous`` check).
* :func:`run_float64`: ``fedco.simulate`` in float64 with full-batch oracles, returning
  each round's server model and sampled clients, for comparing with a NumPy transcription
  of the paper's pseudocode.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import tempfile
import warnings
from typing import Any, Callable, Dict, NoReturn, Optional, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedco._event_loop import async_reference, full_batch_step, initial_state
from fedco.algorithms import base
from fedco.data.federated import FederatedData
from fedco.problems import Problem, plain, portfolio
from fedco.runtime import asynchrony, batching, host
from fedco.runtime import checks as runtime_checks
from fedco.runtime import mesh as mesh_lib
from fedco.runtime.loop import simulate
from fedco.runtime.simulator import Simulator
from fedco.runtime.sweep import sweep

PyTree = Any

#: The contract checks ``check_algorithm`` runs, in order (pass a subset as ``checks=``).
CHECKS = (
  "builds",
  "state",
  "jit",
  "chain",
  "inject",
  "simulate",
  "server",
  "asynchronous",
  "sweep",
  "resume",
  "mesh",
)
ROUNDS, STEPS = 3, 3
# The asynchronous check: server steps, and delays that make reports stale (some too stale).
ASYNC_ROUNDS = 6
ASYNC_DELAYS = asynchrony.Delays(
  spread=0.5, jitter=0.5, straggler_fraction=0.3, straggler_slowdown=4.0
)


class ContractError(AssertionError):
  """An algorithm broke the contract: the message names the algorithm, check and what.

  Raised by :func:`check_algorithm` as ``fedco.testing.check_algorithm(<name>): <check>:
  <what broke>``; an ``AssertionError``, so a test that calls the kit fails with it.
  """


# ---- defaults --------------------------------------------------------------------------------


def default_problem(kind: str) -> Problem:
  r"""The problem the kit checks an algorithm of ``problem_kind`` ``kind`` on.

  For a compositional algorithm, the mean-variance portfolio problem (SPEC 4.7) with
  :math:`\lambda = 1` in the algorithm's class: :math:`g(x; r) = (r^\top x, (r^\top x)^2)`,
  :math:`f(a, b) = -a + \lambda (b - a^2)`. For a ``"plain"`` algorithm, the per-example
  loss :math:`h(x; r) = \tfrac12 \lVert x - r \rVert^2 + 0.1 \sum_i x_i^4`. Both read
  the field ``"r"`` (3 returns) of :func:`default_data`'s examples.

  Args:
    kind: ``"plain"``, ``"local"`` (local-inner) or ``"global"`` (global-inner); an
      algorithm's ``problem_kind``.

  Returns:
    A :class:`~fedco.problems.Problem`.

  Raises:
    ValueError: ``kind`` is none of these.

  Examples:
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> problem = fedco.testing.default_problem("global")
    >>> problem.name, problem.kind, problem.compositional
    ('portfolio', 'global', True)
    >>> x = fedco.testing.default_params()
    >>> problem.inner(x, {"r": jnp.array([1.0, 2.0, 3.0])}).tolist()  # (r.x, (r.x)^2)
    [0.6, 0.36]
  """
  if kind == "plain":
    return plain(lambda x, e: 0.5 * jnp.sum((x - e["r"]) ** 2) + 0.1 * jnp.sum(x**4))
  return portfolio(1.0, kind=kind)


def default_data(sizes: Sequence[int] = (12, 5, 20), seed: int = 0) -> FederatedData:
  r"""Heterogeneous clients for the kit: different sizes, and returns of different means.

  Client :math:`k` holds ``sizes[k]`` examples ``{"r": float32 [3]}`` drawn from
  :math:`\mathcal{N}(0.2 (k + 1), 1)` per coordinate, so both the client sizes and the
  client optima differ (what a federated algorithm must handle).

  Args:
    sizes: the number of examples of each client (default ``(12, 5, 20)``: three clients).
    seed: the NumPy seed of the draw (default 0; the data is the same on every machine).

  Returns:
    A :class:`~fedco.data.FederatedData` with ``len(sizes)`` clients.

  Examples:
    >>> import fedco
    >>> data = fedco.testing.default_data()
    >>> data.num_clients, data.counts.tolist(), data.examples["r"].shape
    (3, [12, 5, 20], (37, 3))
  """
  rng = np.random.default_rng(seed)
  return FederatedData.from_clients(
    [
      {"r": rng.normal(0.2 * (k + 1), 1.0, size=(n, 3)).astype(np.float32)}
      for k, n in enumerate(sizes)
    ]
  )


def default_params() -> jax.Array:
  """The kit's initial model: ``[0.1, 0.1, 0.1]`` in float32, strongly typed.

  Not zero, so that a step that multiplies the model (a quartic term, weight decay) is
  seen; strongly typed, as ``fedco.simulate``'s parameters are.

  Returns:
    A float32 array of shape ``[3]`` (the dimension of :func:`default_data`'s returns).

  Examples:
    >>> import fedco
    >>> x = fedco.testing.default_params()
    >>> x.shape, str(x.dtype), [round(float(v), 4) for v in x]
    ((3,), 'float32', [0.1, 0.1, 0.1])
  """
  return jnp.full((3,), 0.1, jnp.float32)


# ---- the kit ---------------------------------------------------------------------------------


def check_algorithm(
  factory: Callable[..., base.Algorithm],
  *,
  problem: Optional[Problem] = None,
  data: Optional[FederatedData] = None,
  params: Optional[PyTree] = None,
  checks: Optional[Sequence[str]] = None,
  rtol: float = 1e-5,
  atol: float = 1e-6,
  **factory_kwargs,
) -> Dict[str, str]:
  """Runs the contract checks (module docstring) on ``factory(**factory_kwargs)``.

  Checks the configuration ``factory(**factory_kwargs)`` the way fedco checks its
  built-in algorithms: building and injecting it, the stability of its state under
  ``jax.jit``, ``optax.chain``, ``inject_hyperparams``, ``fedco.simulate`` against a
  per-client Python loop, the server, ``fedco.sweep``, resuming from a checkpoint and
  device meshes (the list: :data:`CHECKS`, described in :mod:`fedco.testing`). The checks
  run in :data:`CHECKS` order on the default problem, data and params unless given.

  Args:
    factory: an algorithm factory, ideally decorated with :func:`fedco.extend.factory`
      (its ``static_args`` keep structural arguments static under ``inject_hyperparams``).
    problem: a :class:`~fedco.problems.Problem` of the algorithm's kind (default:
      :func:`default_problem`).
    data: the clients (default: :func:`default_data`, three heterogeneous clients).
    params: the initial model (default: ``[0.1, 0.1, 0.1]``).
    checks: names from :data:`CHECKS` (default: all).
    rtol, atol: tolerances of the comparisons that are not bit-for-bit.
    **factory_kwargs: the configuration to check (default: the first of a registered
      factory's ``settings``); ``local_steps`` defaults to 3 where the factory takes it.

  Returns:
    ``{check: "passed" or "skipped: <why>"}`` for the chosen checks, in :data:`CHECKS`
    order (e.g. ``mesh`` is skipped with one device, ``sweep`` without a numeric
    ``learning_rate``).

  Raises:
    ContractError: a check failed; the message names the algorithm, the check and what
      broke.
    ValueError: an unknown check name, ``factory`` is not callable, or ``problem`` is not
      of the algorithm's ``problem_kind``.

  Examples:
    The cheap checks on a configuration (here a built-in factory; pass your own):

    >>> import fedco
    >>> fedco.testing.check_algorithm(
    ...   fedco.fedavg, learning_rate=0.1, local_steps=2, checks=("builds", "state")
    ... )
    {'builds': 'passed', 'state': 'passed'}

    Every check (tens of seconds), as a test of your own algorithm would run them:

    .. code-block:: python

      report = fedco.testing.check_algorithm(my_factory, learning_rate=0.1, local_steps=3)
      # {'builds': 'passed', 'state': 'passed', 'jit': 'passed', ..., 'resume': 'passed',
      #  'mesh': 'skipped: one device (set XLA_FLAGS=... before importing jax)'}
  """
  chosen = CHECKS if checks is None else tuple(checks)
  unknown = [c for c in chosen if c not in CHECKS]
  if unknown:
    raise ValueError(f"checks: {unknown} are not checks; allowed: {list(CHECKS)}")
  kit = _Kit(factory, problem, data, params, rtol, atol, factory_kwargs)
  report = {}
  for name in CHECKS:
    if name in chosen:
      report[name] = kit.check(name)
  return report


def _fail(name, check, what, cause=None) -> NoReturn:
  raise ContractError(f"fedco.testing.check_algorithm({name}): {check}: {what}") from cause


# What an error a check's step or run raised most often means (the first match, by type).
_TRACED_HYPERPARAMETER = (
  "a hyperparameter is traced here (inject_hyperparams holds it in the state, fedco.sweep "
  "vmaps it): a Python if, int() or range() on learning_rate or another number fails; "
  "branch with jnp.where or jax.lax.cond, or name a structural argument in "
  "extend.factory(static=...)"
)
_TRACED_VALUE = (
  "init or update uses a traced array as a Python value (an if on an array, float(), "
  "int(), np.asarray() of it) and jax.jit cannot: branch with jnp.where or "
  "jax.lax.cond, compute with jnp, and keep every value update needs in the state"
)
_DIVERGED = (
  "the run is not finite: if the algorithm is right, check it on a problem, params and "
  "learning_rate on which it converges (problem=, params=, learning_rate=)"
)


def _not_finite(value):
  return ~np.isfinite(value)


def _raised(check: str, kind: str, err: BaseException) -> str:
  """What a check says when its step or run raised ``err`` instead of comparing."""
  first = (str(err).strip().splitlines() or [""])[0][:300].rstrip(".")
  what = f"{type(err).__name__}: {first}"
  if isinstance(err, (jax.errors.ConcretizationTypeError, jax.errors.JAXTypeError)):
    hint = _TRACED_HYPERPARAMETER if check in ("inject", "sweep") else _TRACED_VALUE
  elif isinstance(err, FloatingPointError):  # fedco.simulate's NonFiniteError
    hint = _DIVERGED
  elif isinstance(err, (TypeError, KeyError, AttributeError)):
    hint = (
      f"if update reads an oracle, check the algorithm's problem_kind ({kind!r}): a "
      "'plain' algorithm's update gets the gradient of the extra term as updates and no "
      "inner_fn / outer_fn; a 'local' or 'global' one gets inner_fn, outer_fn and the rest"
    )
  else:
    hint = "the traceback above this error shows where"
  return f"raised {what}; {hint}"


# What a failed comparison of a check most often means, after the numbers.
_HINTS = {
  "jit": (
    "; a step that differs under jax.jit usually reads host state or draws host randomness "
    "(numpy.random, random, a Python counter): draw with jax.random from the keys update "
    "receives (client_key, round_key) and keep every value in the state"
  ),
}


def _difference(a, b, rtol, atol, err, root) -> str:
  """The first leaf where two pytrees differ beyond ``rtol`` / ``atol``: its path and its
  largest difference (chex's first line where they cannot be compared leaf by leaf)."""
  try:
    pairs = zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b), strict=True)
    for (path, x), y in pairs:
      x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
      name = root + jax.tree_util.keystr(path)
      if x.shape != y.shape:
        return f"{name} has shapes {x.shape} and {y.shape}"
      far = ~np.isclose(x, y, rtol=rtol, atol=atol, equal_nan=True)
      if far.any():
        gap = np.where(far, np.abs(x - y), -1.0)
        gap = np.where(np.isnan(gap), np.inf, gap)
        at = np.unravel_index(np.argmax(gap), gap.shape)
        return (
          f"{name}, by up to {gap[at]:.3g} (at {tuple(int(i) for i in at)}: "
          f"{x[at]:.6g} against {y[at]:.6g}; rtol={rtol:g}, atol={atol:g})"
        )
  except (TypeError, ValueError):
    pass
  return str(err).splitlines()[0][:300]


def _leaf_paths(tree):
  return [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


class _Kit:
  """The shared set-up of the checks (one problem, one data set, one configuration)."""

  def __init__(self, factory, problem, data, params, rtol, atol, kwargs):
    if not callable(factory):
      raise ValueError(f"factory must be an algorithm factory, got {factory!r}")
    self.factory = factory
    parameters = inspect.signature(factory).parameters
    kwargs = dict(kwargs)
    if not kwargs and getattr(factory, "settings", None):
      kwargs = dict(next(iter(factory.settings.values())))
    if "local_steps" in parameters:
      kwargs.setdefault("local_steps", STEPS)
    self.data = default_data() if data is None else data
    if "num_examples" in parameters:  # per-example state (primal-dual DRO's row weights)
      kwargs.setdefault("num_examples", self.data.num_examples)
    self.kwargs = kwargs
    self.algorithm = factory(**kwargs)
    self.name = getattr(self.algorithm, "name", getattr(factory, "__name__", "factory"))
    if not isinstance(self.algorithm, base.Algorithm):
      _fail(
        self.name,
        "builds",
        f"the factory returned {type(self.algorithm).__name__}, not a fedco.extend.Algorithm",
      )
    kind = self.algorithm.problem_kind
    self.problem = default_problem(kind) if problem is None else problem
    try:  # fedco.simulate's own refusal, before a step meets the wrong oracles
      runtime_checks.check_kinds(self.problem, self.algorithm)
    except ValueError as err:
      raise ValueError(
        f"problem: {err}; pass a problem of kind {kind!r} or leave problem out (the kit's "
        f"default_problem({kind!r}))"
      ) from None
    # strongly typed, as fedco.simulate and fedco.sweep take them (decision 96)
    self.params = default_params() if params is None else base.strong(params)
    self.rtol, self.atol = rtol, atol
    examples = jax.tree.map(
      lambda a: jnp.asarray(a)[np.asarray(self.data.flat_rows)], self.data.examples
    )
    n = int(self.data.flat_rows.shape[0])
    weights = jnp.full((n,), 1.0 / n, jnp.float32)
    self.grad_h_fn, self.oracles = batching.oracle_args(
      self.problem, examples, examples, examples, (weights,) * 3
    )
    self.oracles["example_rows"] = jnp.arange(n, dtype=jnp.int32)

  # the user's own loop: full-batch oracles on the pooled data --------------------------------

  def init(self, opt):
    inner = self.oracles["inner_fn"](self.params) if "inner_fn" in self.oracles else None
    return base.init_trackers(opt.init(self.params), self.params, inner)

  def step_fn(self, opt):
    plan = self.algorithm.plan

    def step(params, state):
      for field in plan.round_start:  # the caller plays the server (MBSGD's y_bar)
        state = base.set_fields(state, **{field: self.oracles["inner_fn"](params)})
      grads = None if self.grad_h_fn is None else self.grad_h_fn(params)
      updates, state = opt.update(
        grads,
        state,
        params,
        round_key=jax.random.PRNGKey(0),
        client_key=jax.random.PRNGKey(1),
        **self.oracles,
      )
      return optax.apply_updates(params, updates), state

    return step

  def run(self, opt, steps=3, jit=True, state=None):
    step = self.step_fn(opt)
    step = jax.jit(step) if jit else step
    params, state = self.params, self.init(opt) if state is None else state
    for _ in range(steps):
      params, state = step(params, state)
    return params, state

  def close(self, what, check, a, b, rtol=None, atol=None, root="params"):
    rtol, atol = self.rtol if rtol is None else rtol, self.atol if atol is None else atol
    try:
      chex.assert_trees_all_close(a, b, rtol=rtol, atol=atol)
    except AssertionError as err:
      gap = _difference(a, b, rtol, atol, err, root)
      _fail(self.name, check, f"{what} differ in {gap}{_HINTS.get(check, '')}")

  # the checks -------------------------------------------------------------------------------

  def check(self, check: str) -> str:
    """Runs ``check_<check>``: ``"passed"``, ``"skipped: <why>"``, or a ContractError
    naming the check, also where the algorithm raised instead (a traced ``if``, a missing
    oracle, a diverged run)."""
    try:
      return getattr(self, f"check_{check}")() or "passed"
    except ContractError:
      raise
    except Exception as err:  # pylint: disable=broad-except
      _fail(self.name, check, _raised(check, self.algorithm.problem_kind, err), err)

  def finite(self, check, what, params, state):
    """Fails ``check`` at the first non-finite model leaf or NaN state leaf (a state may
    hold an infinite sentinel; a NaN never means anything)."""
    for root, tree, bad in (("params", params, _not_finite), ("state", state, np.isnan)):
      for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        value = np.asarray(leaf)
        if np.issubdtype(value.dtype, np.inexact) and bad(value).any():
          shown = value.ravel()[np.argmax(bad(value).ravel())]
          _fail(
            self.name,
            check,
            f"{what}: {root}{jax.tree_util.keystr(path)} holds {shown} on the kit's problem "
            f"{self.problem.name!r}: a step must stay finite (look for a division by zero, "
            "a log or sqrt of a non-positive value, an overflow; pass problem=, params= or "
            "a learning_rate of your own where the kit's do not suit the algorithm)",
          )

  def check_builds(self):
    try:
      injected = base.inject_hyperparams(self.factory)(**self.kwargs)
    except Exception as err:  # pylint: disable=broad-except
      _fail(self.name, "builds", f"inject_hyperparams(factory)(...) failed: {err}")
    if not isinstance(injected, base.Algorithm):
      _fail(self.name, "builds", "inject_hyperparams(factory) did not return an Algorithm")
    state = self.init(self.algorithm)
    self.finite("builds", "init(params)", None, state)
    for field in self.algorithm.plan.fields:
      try:
        base.get_field(state, field)
      except (KeyError, ValueError) as err:
        if "more than one" in str(err):  # a chained or inner optimizer's field of that name
          _fail(
            self.name,
            "builds",
            f"the plan names field {field!r}, and the state holds more than one field of "
            f"that name (its fields: {_leaf_paths(state)}): rename the algorithm's own field",
          )
        _fail(
          self.name,
          "builds",
          f"the plan names field {field!r}, which the state does "
          f"not have (its fields: {_leaf_paths(state)})",
        )

  def check_state(self):
    opt = self.algorithm
    state = self.init(opt)
    chex.clear_trace_counter()
    step = jax.jit(chex.assert_max_traces(self.step_fn(opt), n=1))
    params, new = self.params, state
    for i in range(3):  # one compiled step; each state it returns is compared field by field
      try:
        params, new = step(params, new)
      except AssertionError as err:
        _fail(
          self.name,
          "state",
          f"a jitted step traced again on the state it returned ({str(err).splitlines()[0][:200]})",
        )
      if jax.tree.structure(new) != jax.tree.structure(state):
        _fail(
          self.name,
          "state",
          f"update changed the state's structure: "
          f"{jax.tree.structure(state)} -> {jax.tree.structure(new)}",
        )
      for path, before, after in zip(
        _leaf_paths(state), jax.tree.leaves(state), jax.tree.leaves(new)
      ):
        b, a = jnp.asarray(before), jnp.asarray(after)
        if (b.dtype, b.shape) != (a.dtype, a.shape):
          _fail(
            self.name,
            "state",
            f"state{path} changed from {b.dtype}{list(b.shape)} to "
            f"{a.dtype}{list(a.shape)} across updates",
          )
        if getattr(before, "weak_type", False) != getattr(after, "weak_type", False):
          _fail(
            self.name,
            "state",
            f"state{path} changed weak type across updates (build it from "
            "extend.strong(params), e.g. jnp.zeros_like(extend.strong(params)), or give a "
            "constant its dtype: jnp.asarray(value, dtype))",
          )
      self.finite("state", f"after update {i + 1}", params, new)
    chex.assert_trees_all_equal_dtypes(params, self.params)
    self._check_weak_start(opt)

  def _check_weak_start(self, opt):
    """Guidance, not a failure (decision 96): from weak-typed float32 params (what
    ``jnp.full(shape, 0.1)`` makes), a state field that ``jnp.zeros_like`` makes weak and
    the first update makes strong retraces a user's own jitted loop; fedco's programs
    strong-type the params first, so they never meet it. A ``UserWarning`` with the fix."""
    leaves = jax.tree.leaves(self.params)
    if not leaves or any(jnp.asarray(p).dtype != jnp.float32 for p in leaves):
      return
    weak = jax.tree.map(lambda p: jnp.full(jnp.shape(p), 0.1), self.params)
    inner = self.oracles["inner_fn"](weak) if "inner_fn" in self.oracles else None
    state = base.init_trackers(opt.init(weak), weak, inner)
    _, new = jax.jit(self.step_fn(opt))(weak, state)
    for path, before, after in zip(
      _leaf_paths(state), jax.tree.leaves(state), jax.tree.leaves(new)
    ):
      if getattr(before, "weak_type", False) and not getattr(after, "weak_type", False):
        warnings.warn(
          f"fedco.testing.check_algorithm({self.name}): state: passed; a note for loops of "
          f"your own: state{path} starts weak-typed from weak-typed params (such as "
          "jnp.full(shape, 0.1)) and the first update makes it strong, so your own jitted "
          "loop over it would trace twice (fedco.simulate and fedco.sweep strong-type the "
          "params they are given, so they never do); to avoid it, build the field from "
          "extend.strong(params), e.g. jnp.zeros_like(extend.strong(params))",
          UserWarning,
          stacklevel=5,  # check_algorithm's caller
        )
        return

  def check_jit(self):
    jitted, _ = self.run(self.algorithm, jit=True)
    eager, _ = self.run(self.algorithm, jit=False)
    self.close("the steps with and without jax.jit", "jit", jitted, eager)

  def check_chain(self):
    reference, _ = self.run(self.algorithm)
    clip = optax.clip_by_global_norm(1e12)
    for label, chained in (
      ("optax.chain", optax.chain(clip, self.algorithm, clip)),
      ("fedco.chain", base.chain(clip, self.algorithm, clip)),
    ):
      got, _ = self.run(chained)
      self.close(
        f"{label}(inactive clip, algorithm, inactive clip) and the bare algorithm's steps",
        "chain",
        got,
        reference,
      )

  def check_inject(self):
    static = getattr(self.factory, "static_args", ())
    for label, injected_factory in (
      ("fedco.inject_hyperparams", base.inject_hyperparams(self.factory)),
      ("optax.inject_hyperparams", optax.inject_hyperparams(self.factory, static_args=static)),
    ):
      injected = injected_factory(**self.kwargs)
      state = self.init(injected)  # init(params) + init_trackers: what the runtime does
      if "learning_rate" not in getattr(state, "hyperparams", {}):
        return "skipped: learning_rate is not an injectable number in this configuration"
      chex.clear_trace_counter()
      step = jax.jit(chex.assert_max_traces(self.step_fn(injected), n=1))

      def two(state, step=step):
        p, s = step(self.params, state)
        return step(p, s)[0]

      reference, _ = self.run(self.algorithm, steps=2)
      try:
        first = two(state)
        state.hyperparams["learning_rate"] = 0.5 * state.hyperparams["learning_rate"]
        second = two(state)
      except AssertionError as err:
        _fail(
          self.name,
          "inject",
          f"{label}: the step traced again (from init(params) and "
          f"init_trackers, or after a changed hyperparameter: "
          f"{str(err).splitlines()[0][:200]})",
        )
      self.close(f"{label}(factory) and the factory's steps", "inject", first, reference)
      if all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(second))):
        _fail(self.name, "inject", f"{label}: halving the injected learning_rate changed nothing")
    return None

  def simulate(self, algorithm=None, rounds=ROUNDS, data=None, **kwargs):
    kwargs.setdefault("batch_size", None)  # full batch: the loop reference's oracles
    return simulate(
      self.problem,
      self.algorithm if algorithm is None else algorithm,
      self.data if data is None else data,
      self.params,
      rounds=rounds,
      seed=0,
      **kwargs,
    )

  def simulated(self):
    """The server values after each of ``ROUNDS`` rounds of ``fedco.simulate``'s program
    (one compiled round, run round by round; shared by the checks that need a run)."""
    if not hasattr(self, "_simulated"):
      sim = Simulator(self.problem, self.algorithm, self.data, batch_size=None, evaluate=False)
      state, servers = sim.init(self.params, 0), []
      for _ in range(ROUNDS):
        state, _ = sim.run(state, 1, final_round=ROUNDS)
        servers.append(jax.device_get(state.server))
      self._simulated = servers
    return self._simulated

  def check_simulate(self):
    expected = loop_reference(
      self.problem, self.algorithm, self.data, self.params, rounds=ROUNDS, seed=0
    )
    self.close(
      "fedco.simulate's server and the per-client loop's (loop_reference)",
      "simulate",
      self.simulated()[-1],
      expected,
      rtol=max(self.rtol, 2e-5),
      root="server",
    )

  def check_server(self):
    moved = self.simulated()[0]["params"]
    if all(
      np.array_equal(a, b) for a, b in zip(jax.tree.leaves(moved), jax.tree.leaves(self.params))
    ):
      _fail(
        self.name,
        "server",
        "after a round the server model equals the round's start: "
        "the server ignores the clients' uploads",
      )

  def check_asynchronous(self):
    reason = asynchrony.unsupported(self.algorithm)
    if reason is not None:
      return f"skipped: asynchronous= does not support {reason}"
    settings = dict(
      clients_per_round=1,
      asynchronous=asynchrony.Buffered(min(3, self.data.num_clients), max_staleness=1),
      delays=ASYNC_DELAYS,
    )
    expected = async_reference(
      self.problem, self.algorithm, self.data, self.params, rounds=ASYNC_ROUNDS, **settings
    )
    ran = self.simulate(rounds=ASYNC_ROUNDS, evaluate=False, **settings)
    self.close(
      "fedco.simulate(asynchronous=...)'s server and the event-driven loop's (async_reference)",
      "asynchronous",
      jax.device_get(ran.state.server),
      expected[-1],
      rtol=max(self.rtol, 2e-5),
      root="server",
    )

  def check_sweep(self):
    if "learning_rate" not in self.kwargs or not isinstance(
      self.kwargs["learning_rate"], (int, float)
    ):
      return "skipped: no numeric learning_rate in this configuration"
    rates = [float(self.kwargs["learning_rate"]), 0.5 * float(self.kwargs["learning_rate"])]
    others = {k: v for k, v in self.kwargs.items() if k != "learning_rate"}
    swept = sweep(
      self.problem,
      self.factory,
      self.data,
      self.params,
      rounds=ROUNDS,
      grid={"learning_rate": rates},
      algorithm_kwargs=others,
      batch_size=None,
      evaluate=False,
    )
    for i, rate in enumerate(rates):
      alone = self.simulate(
        algorithm=self.factory(**others, learning_rate=rate), evaluate=False
      ).params
      self.close(
        f"fedco.sweep's run {i} (learning_rate={rate}) and its simulate run",
        "sweep",
        jax.tree.map(lambda a, i=i: a[i], swept.params),
        alone,
      )

  def check_resume(self):
    straight = self.simulate(rounds=4, evaluate=False)
    with tempfile.TemporaryDirectory() as directory:
      checkpoints = os.path.join(directory, "run")
      with contextlib.redirect_stderr(open(os.devnull, "w", encoding="utf-8")):
        self.simulate(rounds=2, evaluate=False, checkpoint_dir=checkpoints)
        resumed = self.simulate(rounds=4, evaluate=False, checkpoint_dir=checkpoints)
    try:
      chex.assert_trees_all_equal(resumed.state, straight.state)
    except AssertionError as err:
      _fail(
        self.name,
        "resume",
        f"a run resumed from round 2 differs from one without a stop "
        f"({str(err).splitlines()[0][:200]})",
      )

  def check_mesh(self):
    devices = min(jax.device_count(), 8)
    if devices < 2:
      return (
        "skipped: one device (set XLA_FLAGS=--xla_force_host_platform_device_count=8 "
        "before importing jax)"
      )
    one = self.simulate(evaluate=False)
    laid = self.simulate(evaluate=False, mesh=mesh_lib.client_mesh(devices))
    self.close(
      f"the run on a {devices}-device mesh and on one device",
      "mesh",
      jax.device_get(laid.state.server),
      jax.device_get(one.state.server),
      root="server",
    )
    return None


# ---- a per-client Python loop of the plan ------------------------------------------------------


def _round_start_value(problem, plan, params, full, mean, w):
  """The value a round-start plan hands every client: the clients' inner values at the
  server model (``pre_link``: before the outer link), reduced by the plan."""
  values = []
  for batch, weights, _ in full:
    value = problem.inner_value(params, batch, weights)
    if plan.round_start_value == "pre_link" and problem.outer_link is not None:
      value = problem.unlinked_outer_value(value, batch, weights)
    values.append(value)
  if plan.round_start_reduce is None:
    return mean(values)
  return plan.round_start_reduce(jnp.stack(values), w)


def loop_reference(
  problem: Problem,
  algorithm: base.Algorithm,
  data: FederatedData,
  params: PyTree,
  *,
  rounds: int,
  seed: int = 0,
) -> Dict[str, PyTree]:
  """The server values after ``rounds`` rounds, computed as plain Python loops over clients.

  The reference that ``fedco.simulate`` is checked against (the ``simulate`` check of
  :func:`check_algorithm`): the algorithm's transform and plan run client by client and
  step by step, one jitted step at a time. Every client takes part in every round with
  full-batch oracles (its whole data), so the result must equal
  ``fedco.simulate(..., batch_size=None)``; it shares with the runtime only the key
  schedule (``round_key``, ``client_key`` from the client's id and step, the server's key),
  the batch layout
  (:func:`fedco.runtime.draw_batch`) and :func:`fedco.runtime.oracle_args`. It follows the
  plan's contract (:mod:`fedco.extend`): ``at_init`` means over all clients; per round,
  ``every_round`` fields broadcast, ``round_start`` and ``round_start_loss`` fields
  refreshed, ``every_step`` fields averaged after each step, then the server combines the
  models, ``every_round`` and ``report`` fields (an optax transform on the weighted mean's
  pseudo-gradient, or a ``ServerAggregator`` given every client's values).

  Args:
    problem: the :class:`~fedco.problems.Problem` (of ``algorithm.problem_kind``).
    algorithm: the :class:`~fedco.extend.Algorithm` to run (a configured instance, not a
      factory).
    data: the clients (:class:`~fedco.data.FederatedData`); each uses all its examples.
    params: the initial model.
    rounds: how many rounds to run.
    seed: the simulation seed (default 0), as ``fedco.simulate``'s ``seed``.

  Returns:
    The server's values after the last round: ``{"params": x, field: value, ...}`` with
    one entry per ``every_round`` field of the plan.

  Examples:
    >>> import fedco
    >>> problem = fedco.testing.default_problem("plain")
    >>> data = fedco.testing.default_data(sizes=(2, 2))
    >>> server = fedco.testing.loop_reference(  # SCAFFOLD broadcasts its control variate c
    ...   problem, fedco.scaffold(0.1, 2), data, fedco.testing.default_params(), rounds=1
    ... )  # what fedco.simulate(..., rounds=1, batch_size=None) must end with
    >>> sorted(server), [round(float(v), 4) for v in server["params"]]
    (['c', 'params'], [0.1507, 0.1216, 0.154])
  """
  n, plan = data.num_clients, algorithm.plan
  params = base.strong(params)  # as fedco.simulate takes them
  aggregator = base.as_aggregator(algorithm.server)
  counts = jnp.asarray(data.counts)
  w = (
    counts.astype(jnp.float32) / jnp.sum(counts).astype(jnp.float32)
    if plan.weighting == "samples"
    else jnp.full((n,), 1.0 / n, jnp.float32)
  )
  full = [
    batching.draw_batch(jax.random.PRNGKey(0), data, k, None, return_rows=True) for k in range(n)
  ]

  def mean(values):
    return jax.tree.map(lambda *v: jnp.tensordot(w, jnp.stack(v), axes=1), *values)

  client_step = full_batch_step(problem, algorithm)

  def with_field(states, field, value):
    return [base.set_fields(s, **{field: value}) for s in states]

  key = jax.random.PRNGKey(seed)
  key, _ = jax.random.split(key)
  states = [initial_state(problem, algorithm, params, *full[k][:2]) for k in range(n)]
  for field in plan.init_fields:
    states = with_field(states, field, mean([base.get_field(s, field) for s in states]))
  server = {
    "params": params,
    **{f: mean([base.get_field(s, f) for s in states]) for f in plan.every_round},
  }
  shared = {f: mean([base.get_field(s, f) for s in states]) for f in plan.every_step}
  server_state = aggregator.init(server, counts)
  ids = jnp.arange(n)
  for _ in range(rounds):
    key, _, k_round, _, k_agg = jax.random.split(key, 5)
    for f in plan.every_round:
      states = with_field(states, f, server[f])
    for f in plan.every_step:
      states = with_field(states, f, shared[f])
    if plan.round_start:
      value = _round_start_value(problem, plan, server["params"], full, mean, w)
      for f in plan.round_start:
        states = with_field(states, f, value)
    for f in plan.round_start_loss:
      states = [
        base.set_fields(s, **{f: problem.client_objective(server["params"], *full[k][:2])})
        for k, s in enumerate(states)
      ]
    models = [server["params"]] * n
    for t in range(plan.local_steps):
      for k in range(n):
        models[k], states[k] = client_step(
          states[k], models[k], *full[k], k_round, jnp.asarray(k), jnp.asarray(t)
        )
      for f in plan.every_step:
        states = with_field(states, f, mean([base.get_field(s, f) for s in states]))
    shared = {f: base.get_field(states[0], f) for f in plan.every_step}
    uploads = {
      "params": models,
      **{f: [base.get_field(s, f) for s in states] for f in plan.every_round + plan.report},
    }
    stacked = {f: jax.tree.map(lambda *v: jnp.stack(v), *values) for f, values in uploads.items()}

    def client_losses(x, which, loss_key):
      del loss_key  # full batch: every draw is the client's whole data
      return jnp.stack([problem.client_objective(x, *full[int(k)][:2]) for k in which])

    info = base.RoundInfo(ids, w, counts, n, k_agg, client_losses, jnp.ones((n,), bool))
    server, server_state = aggregator.update(server, server_state, stacked, info)
  return server


# ---- float64 transcriptions ---------------------------------------------------------------------


def run_float64(
  problem: Problem,
  algorithm: base.Algorithm,
  clients: Sequence[Dict[str, Any]],
  params: PyTree,
  *,
  rounds: int,
  seed: int = 0,
  **simulate_kwargs,
):
  r"""``fedco.simulate`` in float64 with full-batch oracles, for NumPy transcription tests.

  A paper's pseudocode transcribed in NumPy (float64, loops over clients) is the clearest
  check of an algorithm's arithmetic; this runs the same configuration through
  ``fedco.simulate`` under ``jax.enable_x64`` with every client's whole data as its batch
  (``batch_size=None``) and no evaluation, and records the server model after every round
  and the clients each round sampled, so the transcription can follow the same clients and
  be compared round by round at ``rtol=1e-12``.

  Args:
    problem: as for :func:`fedco.simulate`.
    algorithm: as for :func:`fedco.simulate`.
    clients: each client's examples (a dict of arrays), cast to float64.
    params: the initial model, cast to float64.
    rounds: rounds to run.
    seed: the simulation seed (client sampling under ``clients_per_round``; default 0).
    **simulate_kwargs: more :func:`fedco.simulate` arguments (``clients_per_round``, ...).

  Returns:
    A dict with ``"params"``, the final model; ``"trajectory"``, the list of the models
    after rounds 1, 2, ...; and ``"clients"``, the list of each round's sampled client ids
    (lists of ints). Models are float64 NumPy arrays.

  Examples:
    FedAvg with one local step on :math:`\tfrac12 \lVert x - r \rVert^2`: each round
    :math:`x \leftarrow \tfrac1K \sum_k \bigl(x - \eta (x - \bar r_k)\bigr)`.

    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> import fedco
    >>> clients = [{"r": np.array([[1.0, 0.0], [3.0, 0.0]])}, {"r": np.array([[0.0, 4.0]])}]
    >>> problem = fedco.plain(lambda x, e: 0.5 * jnp.sum((x - e["r"]) ** 2))
    >>> algorithm = fedco.fedavg(0.5, 1, weighting="uniform")
    >>> out = fedco.testing.run_float64(problem, algorithm, clients, np.zeros(2), rounds=2)
    >>> x = np.zeros(2)
    >>> for _ in range(2):  # the NumPy transcription
    ...   x = np.mean([x - 0.5 * (x - c["r"].mean(0)) for c in clients], axis=0)
    >>> out["clients"], str(out["params"].dtype), out["params"].tolist(), x.tolist()
    ([[0, 1], [0, 1]], 'float64', [0.75, 1.5], [0.75, 1.5])
  """
  trajectory = []

  def record(state, round_):
    del round_
    trajectory.append(
      jax.tree.map(lambda a: np.asarray(a, np.float64), jax.device_get(state.server["params"]))
    )

  with jax.enable_x64(True):
    data = FederatedData.from_clients(
      [jax.tree.map(lambda a: np.asarray(a, np.float64), c) for c in clients]
    )
    x0 = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), params)
    result = simulate(
      problem,
      algorithm,
      data,
      x0,
      rounds=rounds,
      seed=seed,
      batch_size=None,
      evaluate=False,
      actions=[host.RoundAction(record, 1)],
      **simulate_kwargs,
    )
    final = jax.tree.map(lambda a: np.asarray(a, np.float64), jax.device_get(result.params))
  return {
    "params": final,
    "trajectory": trajectory,
    "clients": [list(map(int, ids)) for ids in np.asarray(result.metrics["clients"])],
  }


__all__ = [
  "CHECKS",
  "ContractError",
  "async_reference",
  "check_algorithm",
  "default_data",
  "default_params",
  "default_problem",
  "loop_reference",
  "run_float64",
]
