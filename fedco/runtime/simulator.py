"""The one-program federated simulator.

Clients are stacked on a leading axis and ``vmap``-ed; the local steps of a round are a
``lax.scan``; a chunk of rounds is a ``lax.scan`` over rounds inside one ``jax.jit``. The
runtime contains no algorithm math: it reads the algorithm's :class:`CommPlan`, draws
batches, calls ``update``, averages what the plan says and hands pseudo-gradients to the
algorithm's server transform.

The parts, each readable on its own: :mod:`~fedco.runtime.config` (the frozen, validated
settings), :mod:`~fedco.runtime.layouts` (which client each slot holds and what it reads),
:mod:`~fedco.runtime.batching` (batches and oracles), :mod:`~fedco.runtime.rounds` (the pure
round, the CommPlan interpreter), :mod:`~fedco.runtime.faults`,
:mod:`~fedco.runtime.evaluation`, :mod:`~fedco.runtime.ledger` and
:mod:`~fedco.runtime.mesh`. This module ties them to an object with ``init``, ``run`` and
``ledger``; :func:`fedco.simulate` is the host loop around it.

Randomness is explicit: the round key is folded with each client's *id* and then with the
step index, so a client's batches do not depend on which other clients were sampled or on
how clients are laid out over devices. One seed gives one result.
"""

from __future__ import annotations

import functools
from typing import Any, Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedco import _validate
from fedco import privacy as privacy_lib
from fedco.algorithms.base import Algorithm, get_field, strong
from fedco.data.datasets import FederatedDataset
from fedco.data.federated import FederatedData
from fedco.data.store import ClientStore
from fedco.problems.base import Problem
from fedco.runtime import config, paging
from fedco.runtime import rounds as rounds_lib
from fedco.runtime.ledger import Ledger, tree_size
from fedco.runtime.mesh import CLIENTS, client_mesh, replicated
from fedco.runtime.options import SimOptions
from fedco.runtime.rounds import SimState

PyTree = Any


class Simulator:
  r"""Runs an algorithm on a problem over federated data, a chunk of rounds per jit call.

  The one-program simulator that :func:`fedco.simulate` drives: :meth:`init` builds the
  :class:`~fedco.runtime.SimState` (every client's state from the initial model and one
  mini-batch), :meth:`run` advances it ``rounds`` rounds as one jitted ``lax.scan`` and
  returns the per-round metrics as device arrays, :meth:`ledger` counts what the plan
  communicates. Each round samples ``m`` of the ``K`` clients, runs the algorithm's
  ``local_steps`` on each (``vmap`` over clients, ``lax.scan`` over steps), averages what
  its :class:`~fedco.algorithms.CommPlan` says, and applies its server transform. The
  compiled program is kept per instance: calls with the same ``rounds`` reuse it. Use this
  class to drive rounds yourself (resuming, interleaving your own host code); use
  :func:`fedco.simulate` for metrics on the host, checkpoints, writers and Ctrl-C.

  Evaluation (``evaluate=True``) computes the exact objective over every client's whole
  data, :math:`F(x) = \frac1K \sum_k [f_k(g_k(x)) + h_k(x)]` for local-inner problems and
  :math:`\Phi(x) = h(x) + f(g(x))` for global-inner ones (SPEC 0), and each client's loss.

  Args:
    problem: the :class:`~fedco.problems.Problem`; its kind must be the algorithm's
      (``algorithm.problem_kind``: a ``"plain"`` algorithm needs an extra term, e.g.
      :func:`fedco.problems.plain`; a ``"local"`` / ``"global"`` one a compositional problem
      of that inner kind), and a problem built for ``num_clients`` needs data with as many.
    algorithm: the :class:`~fedco.algorithms.Algorithm` (a ``fedco`` factory's result, or
      :func:`fedco.chain` / :func:`fedco.inject_hyperparams` of one; ``optax.chain`` drops
      the communication plan and is refused).
    data: the :class:`~fedco.data.FederatedData` with ``K`` clients (or a
      :class:`~fedco.data.blocks.ClientBlockData`, see ``mesh``).
    options: a :class:`~fedco.runtime.SimOptions`: sampling (``clients_per_round``),
      batches (``batch_size``, ``outer_batch_size``, ``paired_batches``, ``local_epochs``),
      evaluation (``evaluate``, ``exact_grad_norm``, ``metrics_fn``, ``metrics_data``,
      ``eval_every``), devices (``mesh``, ``client_chunk``), faults (``participation``,
      ``straggler_prob``), the uplink (``compression``, ``privacy``, ``aggregation``,
      ``byzantine``) and time (``delays``, ``asynchronous``: FedBuff); each field is
      documented there. Default: every default.
    **settings: fields of ``options`` by keyword, replacing its values
      (``Simulator(problem, algorithm, data, batch_size=None)``).
  Raises:
    ValueError: one line naming the argument and what is allowed, when an argument is not
      of the allowed type or range above, the problem's kind does not fit the algorithm's,
      or ``compression`` / ``privacy`` do not fit the algorithm's plan.

  Examples:
    FedAvg on a least-squares problem over 4 clients, run as two calls of 2 rounds (the
    second reuses the first's compiled program):

    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> import fedco
    >>> x = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 1.0]], np.float32)
    >>> data = fedco.FederatedData.from_clients([{"x": x + k} for k in range(4)])
    >>> problem = fedco.problems.plain(lambda w, e: jnp.sum((w - e["x"]) ** 2))
    >>> sim = fedco.Simulator(problem, fedco.fedavg(0.1, 1), data, batch_size=None)
    >>> state = sim.init(jnp.zeros(2), seed=0)
    >>> state, metrics = sim.run(state, 2)
    >>> int(state.round), metrics["objective"].shape, metrics["client_losses"].shape
    (2, (2,), (2, 4))
    >>> state, more = sim.run(state, 2)
    >>> [round(float(v), 2) for v in jnp.concatenate([metrics["objective"], more["objective"]])]
    [10.43, 7.82, 6.15, 5.09]
    >>> sim.ledger(state).per_round()  # floats over the 4 clients, one round
    {'up': 8, 'down': 8}
  """

  def __init__(
    self,
    problem: Problem,
    algorithm: Algorithm,
    data: FederatedData,
    options: Optional[SimOptions] = None,
    **settings,
  ):
    options = SimOptions.of(options, settings)
    self.config = cfg = config.make_config(problem, algorithm, data, options)
    mesh, metrics_data = cfg.mesh, options.metrics_data
    self.problem, self.algorithm, self.plan = problem, algorithm, algorithm.plan
    self.num_clients, self.clients_per_round = cfg.num_clients, cfg.clients_per_round
    self.batch_size, self.outer_batch_size = cfg.batch_size, cfg.outer_batch_size
    self.eval_every, self.mesh = cfg.eval_every, mesh
    self.resident = cfg.layout.resident
    if mesh is not None:
      self._replicated = replicated(mesh)
    self.data = cfg.layout.place_data(data)  # placed once: every run sees the same shardings
    # an argument of the compiled chunk, not a constant in it: runs that differ only in it
    # (seeds with their own held-out sets) compile to the same program
    if isinstance(metrics_data, (FederatedDataset, ClientStore)):  # JAX's error names none
      fix = (
        "pass its .val (a FederatedData) or a dict of its parts"
        if isinstance(metrics_data, FederatedDataset)
        else "held-out sets stay in memory (a FederatedData or a dict of arrays)"
      )
      raise ValueError(
        f"metrics_data must be a pytree of arrays; got a {type(metrics_data).__name__}: {fix}"
      )
    self.metrics_data = (
      None
      if metrics_data is None
      else (
        jax.device_put(metrics_data, self._replicated)
        if mesh is not None
        else jax.tree.map(jnp.asarray, metrics_data)
      )
    )
    # Per-instance jits of pure functions (never a global cache keyed on ``self``), so a
    # dropped simulator and its data are collected.
    self._run = jax.jit(functools.partial(_run_rounds, cfg), static_argnames="rounds")
    self._init_jit = jax.jit(functools.partial(rounds_lib.init_state, cfg))
    self._init_paged = jax.jit(functools.partial(_init_paged, cfg), static_argnames="pages")

  def init(self, params: PyTree, seed=0, *, pages: Optional[int] = None) -> SimState:
    """The initial :class:`~fedco.runtime.SimState` (round 0) from the model ``params``.

    Every client's state from ``params`` and one mini-batch ``g_k(x_0)``; then the plan's
    init fields are averaged so all clients start from the same ``(x_bar_0, y_bar_0)``.

    Args:
      params: the initial model ``x_bar_0``, a pytree of float32 / float64 arrays that the
        problem accepts on one example of the data; taken strongly typed (a weak-typed
        ``jnp.full(shape, 0.1)`` as the float32 array it is), so a state built with
        ``jnp.zeros_like(params)`` keeps its type across updates.
      seed: an int or a ``jax.random.PRNGKey``: client sampling, batches and faults.
      pages: streamed runs (:mod:`fedco.runtime.streaming`): the per-client state of only
        this many clients, as :class:`~fedco.runtime.Pages`, with trackers of the inner
        value from zeros (no client's batch is read:
        :func:`~fedco.runtime.streaming.with_initial_means` then fills their means from the
        store). ``None`` (default): every client's, ``[K]``.

    Returns:
      The :class:`~fedco.runtime.SimState` at round 0.

    Raises:
      ValueError: if ``seed`` is not an int or key, or ``params`` do not fit the problem and
        data (dtype or shapes).
    """
    key = self.seed_key(seed)
    params = self._checked_params(params)
    if self.mesh is not None:
      params, key = jax.device_put((params, key), self._replicated)
    if pages is not None:
      pages = _validate.positive_int("pages", pages)
      return self._init_paged(params, key, self.data, pages=pages)
    return self._init_jit(params, key, self.data)

  @staticmethod
  def seed_key(seed) -> jax.Array:
    """The PRNG key of ``seed`` (an int or a key), as :meth:`init` takes it."""
    if isinstance(seed, (bool, float, str)) or seed is None:
      raise ValueError(f"seed must be an int or a PRNG key, got {seed!r}")
    return jax.random.PRNGKey(seed) if isinstance(seed, (int, np.integer)) else seed

  def _checked_params(self, params):
    """``params`` as strongly typed arrays (decision 96: no algorithm meets weak types, so
    an optax-style ``jax.tree.map(jnp.zeros_like, params)`` state keeps its type), refused
    when they do not fit the data and problem."""
    return strong(config.check_params(params, self.data, self.problem))

  def run(
    self,
    state: SimState,
    rounds: int,
    *,
    final_round: Optional[int] = None,
    data: Optional[FederatedData] = None,
  ):
    """Advance ``rounds`` rounds in one jitted program; returns ``(state, metrics)``.

    Args:
      state: a :class:`~fedco.runtime.SimState` from :meth:`init` or an earlier call.
      rounds: an int ``>= 1``; each distinct value compiles once.
      final_round: the run's last round, evaluated whatever ``eval_every`` says (default:
        this call's last round; :func:`fedco.simulate` passes its ``rounds``, so its chunks
        share one program).
      data: these rounds' data in place of the simulator's (the same clients and counts;
        :mod:`fedco.runtime.streaming` passes each chunk's clients); ``None``: the
        simulator's own.

    Returns:
      ``(state, metrics)``: the state after the rounds and ``{name: array [rounds, ...]}``
      on the device: ``objective``, ``client_losses`` ``[rounds, K]``, ``grad_norm``,
      ``metrics_fn``'s entries and ``evaluated`` (as asked), ``clients`` (sampled ids
      ``[rounds, m]``), with faults ``survivors``, and with faults or ``local_epochs``
      ``local_steps`` (each sampled client's steps, ``[rounds, m]``).
    """
    _validate.positive_int("rounds", rounds)
    if final_round is None:
      final_round = -1  # a traced sentinel: this call's last round (see run_rounds)
    final_round = _validate.positive_int("final_round", final_round, minimum=-1)
    if self.mesh is not None:  # same input shardings every call: no second compilation
      state = jax.device_put(state, self._replicated)
    data = self.data if data is None else data
    return self._run(state, data, self.metrics_data, np.int32(final_round), rounds=rounds)

  def ledger(self, state: SimState) -> Ledger:
    """Floats and bytes per participating client per round, split by what was sent.

    Args:
      state: a :class:`~fedco.runtime.SimState` of this simulator (for the fields' sizes).

    Returns:
      The :class:`~fedco.runtime.Ledger`.
    """
    steps = self.plan.local_steps

    def field(f):  # one client's field as shapes and dtypes (slicing compiles an op per leaf)
      if f in state.server:  # the model and every_round fields (maybe round_local)
        return state.server[f]
      per_client = get_field(_per_client(state.clients), f)
      return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), per_client)

    size = lambda f: tree_size(field(f))
    up = {"params": size("params")}
    for f in self.plan.every_round:
      up[f] = size(f)
    for f in self.plan.every_step:
      up[f] = steps * size(f)
    for f in self.plan.round_start:
      up[f] = up.get(f, 0) + size(f)
    down = dict(up)
    for f in self.plan.report:  # sent up only
      up[f] = up.get(f, 0) + size(f)
    per_step = {f: size(f) for f in self.plan.every_step}
    link = self.config.uplink
    codecs = {} if link is None else link.codecs
    messages = privacy_lib.messages_per_round(self.plan)

    dtype = lambda f: jnp.result_type(*(a.dtype for a in jax.tree.leaves(field(f))))
    itemsize = lambda f: np.dtype(dtype(f)).itemsize

    def message_bytes(f):  # one message of the field: the codec's bits, or its floats
      if f in codecs:
        return codecs[f].payload_bits(size(f), dtype(f)) / 8
      return size(f) * itemsize(f)

    up_bytes = {f: messages[f] * message_bytes(f) for f in up}
    down_bytes: Dict[str, float] = {f: down[f] * itemsize(f) for f in down}
    per_step_bytes = {f: message_bytes(f) for f in self.plan.every_step}
    return Ledger(
      up,
      down,
      self.clients_per_round,
      per_step,
      steps,
      up_bytes,
      down_bytes,
      per_step_bytes,
      None if link is None else link.describe(),
    )

  def epsilon(self, rounds):
    """Epsilon spent after ``rounds`` rounds under ``privacy``, else ``None``.

    Args:
      rounds: an int, or a sequence of ints (one epsilon each).

    Returns:
      The epsilon (a float, or an array for a sequence) at the mechanism's ``delta``, or
      ``None`` without ``privacy``.
    """
    link = self.config.uplink
    return None if link is None else link.epsilon(rounds)


def _per_client(tree):
  return tree.values if isinstance(tree, paging.Pages) else tree


def _init_paged(cfg, params, key, data, *, pages):
  """The initial state with :class:`~fedco.runtime.Pages` of ``pages`` rows (the
  ``[K]`` stacks are not outputs, so the compiled program never holds them), its trackers
  from zeros: :func:`~fedco.runtime.streaming.with_initial_means` fills their means."""
  state = rounds_lib.init_state(cfg, params, key, data, template=True)
  return paging.to_pages(state, pages, cfg.num_clients)


def _run_rounds(cfg, state, data, metrics_data, final_round, *, rounds):
  """``run_rounds`` with ``final_round`` traced; ``-1``: this call's last round."""
  final_round = jnp.where(final_round < 0, state.round + rounds, final_round)
  return rounds_lib.run_rounds(cfg, state, data, rounds, final_round, metrics_data)


__all__ = ["CLIENTS", "SimState", "Simulator", "client_mesh"]
