"""``simulate``: the host loop around a :class:`~fedco.runtime.Simulator`.

Chunks of rounds run as single jitted calls; between chunks the host fetches the metrics,
checks them, streams them to the metric writers (:mod:`fedco.runtime.host`), checkpoints,
updates the progress bar and honours a deferred Ctrl-C.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Dict, List, Optional, cast

import numpy as np

from fedco import _validate
from fedco.algorithms.base import Algorithm
from fedco.data.federated import FederatedData
from fedco.data.store import ClientStore
from fedco.problems.base import Problem
from fedco.runtime import checkpoints, driver, host, paging, streaming
from fedco.runtime.checks import (
  NonFiniteError,
  data_finiteness_note,
  raise_if_not_finite,
  raise_if_rows_not_finite,
)
from fedco.runtime.distributed import fetch
from fedco.runtime.options import SimOptions
from fedco.runtime.simulator import SimState, Simulator

PyTree = Any


@dataclasses.dataclass
class SimulationResult:
  """What :func:`simulate` returns: the final model, the per-round metrics and the ledger.

  Attributes:
    params: the server model after the last round.
    random_params: the server model of a uniformly random round (reservoir sampling), the
      iterate the FedDRO/DS-FedDRO theorems return.
    state: the final :class:`SimState` (resume with ``Simulator.run``).
    metrics: per-round host arrays (NumPy), ``[rounds, ...]``: ``objective``,
      ``client_losses`` ``[R, K]``, ``grad_norm`` (if asked), user metrics, ``evaluated``
      (which rounds were evaluated; the others hold NaN), ``clients`` (sampled ids
      ``[R, m]``), with faults ``survivors``, with faults or ``local_epochs``
      ``local_steps`` ``[R, m]`` (each sampled client's steps) and, under
      ``privacy`` with noise, ``epsilon`` (spent by the end of each round).
    ledger: communication per client per round and in total, in floats and bytes (a dict,
      :meth:`fedco.runtime.Ledger.as_dict` with the run's fault record).
    seconds: wall time of the rounds (compilation included).
    host_metrics: the rows the :class:`~fedco.runtime.host.RoundAction` s returned,
      ``{"round": r, **metric_labels, name: value}``, in round order; a resumed run's
      earlier rows come back from its checkpoint.

  Examples:
    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> import fedco
    >>> x = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 1.0]], np.float32)
    >>> data = fedco.FederatedData.from_clients([{"x": x + k} for k in range(4)])
    >>> problem = fedco.problems.plain(lambda w, e: jnp.sum((w - e["x"]) ** 2))
    >>> result = fedco.simulate(
    ...   problem, fedco.fedavg(0.1, 1), data, jnp.zeros(2), rounds=2, batch_size=None,
    ...   clients_per_round=2,
    ... )
    >>> result.params.shape, int(result.state.round), result.seconds > 0
    ((2,), 2, True)
    >>> sorted(result.metrics), result.metrics["clients"].shape
    (['client_losses', 'clients', 'evaluated', 'objective'], (2, 2))
    >>> result.ledger["up_per_client_per_round"], result.ledger["total_up"]
    ({'params': 2}, 8)
  """

  params: PyTree
  random_params: PyTree
  state: SimState
  metrics: Dict[str, np.ndarray]
  ledger: Dict[str, Any]
  seconds: float
  host_metrics: List[Dict[str, Any]] = dataclasses.field(default_factory=list)


def simulate(
  problem: Problem,
  algorithm: Algorithm,
  data: FederatedData,
  params: PyTree,
  *,
  rounds: int,
  seed=0,
  chunk_rounds: Optional[int] = None,
  progress: Optional[bool] = None,
  check_finite: bool = True,
  checkpoint_dir=None,
  checkpoint_every: Optional[int] = None,
  keep_checkpoints: int = 3,
  checkpoint_mismatch: str = "error",
  progress_metric: str = "objective",
  metric_writers=(),
  actions=(),
  metric_labels: Optional[Dict[str, Any]] = None,
  options: Optional[SimOptions] = None,
  **settings,
) -> SimulationResult:
  r"""Run ``rounds`` rounds of ``algorithm`` on ``problem`` and collect the metrics on the host.

  The main entry point. A :class:`Simulator` compiles the rounds; they run in chunks of
  ``chunk_rounds`` (default: all of them, at most 100), each chunk one jitted ``lax.scan``,
  and between chunks the host fetches the metrics, checks them, streams them to the metric
  writers, runs the actions, checkpoints and updates the progress bar. Every round samples
  ``m`` clients, runs ``local_steps`` of the algorithm on each and applies its
  communication plan and server transform; evaluated rounds record the exact objective
  (:math:`F(x)` or :math:`\Phi(x)`, SPEC 0) and every client's loss. One seed gives one
  result: a client's batches depend on its id, not on which clients were sampled with it or
  on the device layout.

  Ctrl-C is deferred to the end of the running chunk: the chunk's rows are written, a
  checkpoint is saved (when checkpointing) and :class:`~fedco.runtime.host.Interrupted`
  (a ``KeyboardInterrupt``) says up to which round. It is never dropped: a Ctrl-C during
  the last chunk still raises ``Interrupted`` (the finished result is its ``result``), one
  during a chunk that diverges raises it instead of the ``NonFiniteError`` (chained as its
  cause), and under an enclosing :func:`~fedco.runtime.host.interrupt_guard` one that came
  before the call stops it before round 1. A second Ctrl-C ends the process at once.

  Args:
    problem: the :class:`~fedco.problems.Problem`, of the algorithm's kind (see
      :class:`Simulator`).
    algorithm: the :class:`~fedco.algorithms.Algorithm` (``fedco.feddro(...)``, ...).
    data: the :class:`~fedco.data.FederatedData`, or a :class:`~fedco.data.ClientStore`
      (clients on disk, streamed: each chunk reads only the clients it samples; results
      equal the in-memory run's; it refuses ``evaluate=True``, ``exact_grad_norm``, a mesh,
      loss-querying servers (DRFA, AFL, q-FedAvg) and per-example state, one line each).
    params: the initial model ``x_bar_0``, a pytree of float32 / float64 arrays.
    rounds: number of rounds, an int ``>= 1``.
    seed: an int or a ``jax.random.PRNGKey``: client sampling, batches, faults and the
      random iterate. Default 0.
    chunk_rounds: rounds per jitted call, an int ``>= 1`` (default ``min(rounds, 100)``);
      chunks also end at checkpoints and at the actions' rounds.
    progress: print a ``tqdm`` progress line with rounds per second (leaving out the first
      chunk, compilation) and ``progress_metric``: ``True`` always, ``False`` never, ``None``
      (default, automatic) only where stderr is a terminal, once the run has taken 5 s
      without finishing: a long run in a shell shows its progress, while short runs, tests,
      notebooks and output sent to a file get no bar.
    check_finite: stop with :class:`NonFiniteError` (a ``FloatingPointError``) naming the
      first evaluated round whose metrics, the server model, or an action's row stop being
      finite; it carries the metrics and action rows collected so far. With checkpointing,
      the last good state (the start of the failing chunk) is saved first. Default ``True``.
    checkpoint_dir: a directory (str or path-like) to save the whole simulation state and
      the metrics so far in (see :mod:`fedco.checkpoint`); if it already holds a checkpoint
      of this run (same fingerprint: :mod:`fedco.runtime.fingerprint`), the run resumes from
      the newest intact one, says "resumed from round N" on stderr, and ends bit-identical
      to an uninterrupted run (a streamed run with client state on disk keeps it in
      ``<checkpoint_dir>/client_state``, journaled per checkpoint, and falls back to an
      older checkpoint as an in-memory run does: :class:`~fedco.runtime.StateStore`; without
      ``checkpoint_dir`` it keeps it in a temporary ``fedco-client-state-*`` folder, removed
      at the end, and a later run removes those of killed runs). The directory is locked
      for the run (a second run gets a one-line ``ValueError`` naming the holder; in a
      multi-process run, process 0 holds it). ``None`` (default): no checkpoints.
    checkpoint_every: rounds between checkpoints, an int ``>= 1`` (default: every chunk).
    keep_checkpoints: how many checkpoints to keep, an int ``>= 1``. Default 3.
    checkpoint_mismatch: what a ``checkpoint_dir`` holding *another* run's checkpoints
      does: ``"error"`` (default; ``fedco.checkpoint.RunMismatchError``, naming what
      differs) or ``"restart"`` (delete that directory's checkpoints and start afresh).
    progress_metric: the scalar metric the progress line shows (``"objective"``, default, or
      one of ``metrics_fn``'s or of the actions' rows).
    metric_writers: :class:`fedco.runtime.host.RowWriter` s (``JsonlWriter``,
      ``CsvWriter``, ``TensorBoardWriter``) that receive every chunk's evaluated rows as
      soon as the chunk is done (a diverging chunk's up to the divergence); a resumed run
      first drops its rows from them and writes its restored rows again. They are closed at
      the end. Default: none.
    actions: :class:`fedco.runtime.host.RoundAction` s, run on the host with the whole
      state at their rounds (chunks end there); their rows are written, checkpointed and
      returned in ``host_metrics``; ``progress_metric`` may name one of their numbers.
      Default: none.
    metric_labels: a dict of fields added to every written row (default
      ``{"algorithm": algorithm.name}``); its ``"method"`` (else ``"algorithm"``) and
      ``"seed"`` name the run on the progress line.
    options: a :class:`~fedco.runtime.SimOptions` (sampling, batches, evaluation, devices,
      faults, the uplink: each documented there); a ``privacy`` with a target epsilon is
      calibrated to ``rounds`` here. Default: every default.
    **settings: fields of ``options`` by keyword, replacing its values
      (``clients_per_round=``, ``batch_size=``, ``eval_every=``, ...).
  Returns:
    A :class:`SimulationResult`: final and random-iterate ``params``, the final ``state``,
    per-round host ``metrics`` ``[rounds, ...]``, the ``ledger`` dict, ``seconds`` and the
    actions' ``host_metrics``.

  Raises:
    ValueError: an argument outside what is allowed above (one line naming it), params that
      do not fit the problem and data, a ``checkpoint_dir`` locked by another process or
      holding a round past ``rounds``, or (``fedco.checkpoint.RunMismatchError``) holding
      another run's checkpoints with ``checkpoint_mismatch="error"``.
    NonFiniteError: with ``check_finite``, when the run diverges.
    Interrupted: after a Ctrl-C, at the end of the running chunk.

  Examples:
    FedDRO on the log form of client-level KL-DRO,
    :math:`\gamma \log \frac1K \sum_k \exp(f_k(x) / \gamma)`, over 4 clients of 4
    examples each (the per-example loss is a squared distance):

    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> import fedco
    >>> x = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 1.0]], np.float32)
    >>> data = fedco.FederatedData.from_clients([{"x": x + k} for k in range(4)]).with_owner()
    >>> loss = lambda w, e: jnp.sum((w - e["x"]) ** 2)  # l(w; e)
    >>> problem = fedco.problems.client_kl_dro_log(loss, gamma=1.0, num_clients=4)
    >>> result = fedco.simulate(
    ...   problem, fedco.feddro(0.05, 2), data, jnp.zeros(2), rounds=3, batch_size=None
    ... )
    >>> evaluated = result.metrics["objective"][result.metrics["evaluated"]]
    >>> [round(float(v), 2) for v in evaluated]  # the objective after rounds 1, 2, 3
    [19.8, 13.59, 9.88]
    >>> result.metrics["client_losses"].shape  # [rounds, K]
    (3, 4)
    >>> result.ledger["up_per_client_per_round"]  # y after each of the 2 local steps
    {'params': 2, 'y': 8}
  """
  rounds = _validate.positive_int("rounds", rounds)
  chunk = (
    min(rounds, 100)
    if chunk_rounds is None
    else _validate.positive_int("chunk_rounds", chunk_rounds)
  )
  _validate.one_of("checkpoint_mismatch", checkpoint_mismatch, ("error", "restart"))
  if not isinstance(progress_metric, str) or not progress_metric:
    raise ValueError(f"progress_metric must be a metric's name (a string), got {progress_metric!r}")
  actions = tuple(actions)
  for action in actions:  # before anything is opened or locked
    if not isinstance(action, host.RoundAction):
      raise ValueError(f"actions must be fedco.runtime.host.RoundAction s, got {action!r}")
  options = SimOptions.of(options, settings).over(rounds)
  store = data if isinstance(data, ClientStore) else None
  sim = Simulator(problem, algorithm, data if store is None else streaming.template(store), options)
  if store is None:
    state, chunks = sim.init(params, seed), None
  else:  # streamed clients: built on a template, each chunk read in turn
    state, chunks = _start_streamed(sim, store, params, seed, rounds, chunk)
  labels = {"algorithm": algorithm.name} if metric_labels is None else dict(metric_labels)
  run = _Simulation(
    sim,
    state,
    chunks,
    rounds,
    chunk,
    actions,
    check_finite,
    metric_writers,
    labels,
    progress_metric,
  )
  if checkpoint_dir is not None:
    every = checkpoints.every_round(checkpoint_every, chunk)
    run.ckpt = checkpoints.RunCheckpoint(
      checkpoint_dir, keep=keep_checkpoints, every=every, sim=sim, state=state, seed=seed
    )
    run.done, run.state, run.collected, run.host_metrics = run.ckpt.restore(
      rounds, checkpoint_mismatch
    )
  run.rewind_writers()
  return driver.drive(run, rounds, run.done, progress=progress, progress_metric=progress_metric)


def _start_streamed(sim, store: ClientStore, params, seed, rounds: int, chunk_rounds: int):
  """``(state, chunks)``: a streamed run's initial state (its trackers of the inner value
  started from one pass over ``store``: :func:`streaming.with_initial_means`) and the
  :class:`streaming.Chunks` that read each chunk's sampled clients (every round's clients
  drawn from the initial key, so a resumed run reads the same ones), from a ``store`` whose
  every read is checked (:func:`streaming.checked`)."""
  averaged, store = streaming.checked(sim, params, store)
  sim.data_description = {
    "store": store.digest,
    "clients": store.num_clients,
    "examples": store.num_examples,
  }
  key = paging.state_key(sim.seed_key(seed))
  sampled = streaming.schedule(
    key, sim.num_clients, sim.clients_per_round, rounds, sim.config.sampling
  )
  chunks = streaming.Chunks(store, sampled, chunk_rounds)
  state = sim.init(params, seed, pages=chunks.pages)
  state = streaming.with_initial_means(sim, store, state, averaged, seed)
  chunks.own = streaming.OwnStart.of(sim, state.server["params"], seed)
  return state, chunks


@dataclasses.dataclass(eq=False)
class _Simulation:
  """:func:`simulate`'s run, advanced chunk by chunk by :func:`fedco.runtime.driver.drive`:
  what a chunk runs, writes, checks and checkpoints, and the client state on disk."""

  sim: Simulator
  state: Any
  chunks: Optional[streaming.Chunks]
  rounds: int
  chunk: int
  actions: tuple
  check_finite: bool
  writers: tuple
  labels: Dict[str, Any] = dataclasses.field(default_factory=dict)
  progress_metric: str = "objective"
  ckpt: Optional[checkpoints.RunCheckpoint] = None
  states: Optional[paging.StateStore] = None
  done: int = 0  # the rounds a restored checkpoint holds: where the run starts
  collected: List[Dict[str, np.ndarray]] = dataclasses.field(default_factory=list)
  host_metrics: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
  last_metrics: Dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    self.writers = tuple(self.writers)
    link = self.sim.config.uplink
    self.spends = link is not None and link.spends
    # Persistent client state on disk (streamed runs): every client's initial row, taken
    # now (a restored state's pages hold sampled clients' rows).
    self.fresh = paging.fresh(self.state) if paging.is_paged(self.state) else None

  @property
  def name(self) -> str:
    """The run's name on the progress bar: its method (or algorithm), and its seed."""
    name = str(self.labels.get("method", self.labels.get("algorithm", self.sim.algorithm.name)))
    return name + (f" seed {self.labels['seed']}" if "seed" in self.labels else "")

  @property
  def checkpointed(self) -> bool:
    return self.ckpt is not None

  def rewind_writers(self) -> None:
    """The writers get this run's rows afresh: a resumed run's restored rows are written
    again (its files may have been replaced since, e.g. by an experiment's rerun)."""
    restored = host.rows(self.collected[0], 0, self.labels) if self.collected else []
    restored += list(self.host_metrics)
    for writer in self.writers:
      writer.rewind(0, self.labels)
      if restored and writer.can_rewind:  # a writer that cannot drop rows keeps its old ones
        writer.write(restored)

  def start(self, done: int) -> None:
    if self.fresh is not None:
      run = "" if self.ckpt is None else self.ckpt.run["fingerprint"]
      folder = None if self.ckpt is None else self.ckpt.states_folder()
      self.states = paging.StateStore.of_run(self.fresh, self.sim.num_clients, folder, run, done)
      if self.ckpt is not None:
        self.ckpt.states = self.states
    if done == 0:
      self._act(done, lambda a: a.at_start)

  def size(self, done: int) -> int:
    size = min(self.chunk, self.rounds - done)
    if self.ckpt is not None:
      size = self.ckpt.size(done, size, self.rounds)
    for action in self.actions:
      size = min(size, action.rounds_to_next(done))
    return size

  def step(self, done: int, size: int) -> None:
    last_good, chunk_data = self.state, None
    if self.chunks is not None:
      chunk_data = self.chunks.get(done, size)
      if self.states is not None:  # this chunk's clients' state, from the disk
        ids = self.chunks.ids(done, size)
        rows = self.chunks.rows(self.states, ids, chunk_data)
        self.state = last_good = paging.with_pages(self.state, ids, rows)
      if done + size < self.rounds:
        self.chunks.prefetch(done + size, self.size(done + size))
    self.state, metrics = self.sim.run(self.state, size, final_round=self.rounds, data=chunk_data)
    metrics = fetch(metrics)  # jax.device_get, or a gather of multi-process arrays
    if self.spends:  # the privacy spent by the end of each round
      link = self.sim.config.uplink
      assert link is not None  # spends only with a private uplink
      metrics["epsilon"] = link.epsilon(np.arange(done + 1, done + size + 1))
    self.collected.append(metrics)
    self.last_metrics = metrics
    chunk_rows = host.rows(metrics, done, self.labels)
    if self.check_finite:  # a diverging chunk's rows up to the divergence: the curve to it
      chunk_rows = list(itertools.takewhile(host.finite_row, chunk_rows))
    for writer in self.writers:
      writer.write(chunk_rows)
    if self.check_finite:
      self._check_chunk(metrics, done, last_good)

  def _check_chunk(self, metrics, done, last_good) -> None:
    """Raises :class:`NonFiniteError` where the chunk diverged, after saving the last good
    state (the start of the chunk, round 0 included) when checkpointing."""
    try:
      raise_if_not_finite(metrics, self.state, done)
    except NonFiniteError as err:
      # a streamed run's chunks read a checked store (_start_streamed)
      store = None if self.chunks is None else cast(streaming.CheckedStore, self.chunks.store)
      streamed = None if store is None else store.data_note(err.round)
      note = data_finiteness_note(self.sim.data, streamed)
      err.args = (f"{err.args[0]} {note}",) + err.args[1:]
      if self.ckpt is not None:
        before = self.collected[:-1]
        self.ckpt.save(done, last_good, _stack(before) if before else {}, self.host_metrics)
      err.metrics, err.host_metrics = _stack(self.collected), list(self.host_metrics)
      raise

  def after(self, done: int, stopping: bool) -> Optional[float]:
    if self.states is not None:  # the chunk's client state back to the disk
      self.states.write(*paging.pages_of(self.state))
      if self.ckpt is None:
        self.states.apply(done)
    rows = self._act(done, lambda a: a.due(done, self.rounds))
    if self.ckpt is not None and (self.ckpt.due(done, self.rounds) or stopping):
      self.ckpt.save(done, self.state, _stack(self.collected), self.host_metrics)
    return _shown(self.last_metrics, rows, self.progress_metric)

  def _act(self, done: int, due):
    """Run the due actions on the state at round ``done``; write and check their rows."""
    labels = self.labels
    rows = [r for r in (_act(a, self.state, done, labels) for a in self.actions if due(a)) if r]
    self.host_metrics.extend(rows)
    finite = [row for row in rows if host.finite_row(row)]  # a diverged row is not written
    for writer in self.writers if finite else ():
      writer.write(finite)
    if self.check_finite:
      try:
        raise_if_rows_not_finite(rows, self.host_metrics)
      except NonFiniteError as err:  # the metrics are stacked only when they are needed
        err.metrics = _stack(self.collected) if self.collected else {}
        raise
    return rows

  def result(self, seconds: float) -> SimulationResult:
    return _result(self.sim, self.state, self.collected, self.rounds, seconds, self.host_metrics)

  def close(self) -> None:
    try:
      if self.chunks is not None:
        self.chunks.close()
    finally:
      try:  # the client state's last write ends before the lock goes, and may fail
        if self.states is not None:
          self.states.close()
      finally:
        host.close_all(self.writers)
        if self.ckpt is not None:
          self.ckpt.close()


def _shown(metrics, rows, name) -> Optional[float]:
  """The progress bar's value: ``name``'s last evaluated value in the chunk's metrics, else
  in its last action row (``None`` when neither holds a number)."""
  if name in metrics and np.any(metrics["evaluated"]):
    values = np.asarray(metrics[name])[np.asarray(metrics["evaluated"])]
    return float(values[-1]) if values.ndim == 1 else None
  if rows and np.ndim(rows[-1].get(name, ())) == 0:
    return float(rows[-1][name])
  return None


def _result(sim, state, collected, rounds, seconds, host_metrics):
  return SimulationResult(
    state.server["params"],
    state.random_params,
    state,
    _stack(collected),
    _ledger(sim, state, collected, rounds),
    seconds,
    host_metrics,
  )


def _act(action, state, done, labels):
  """The action's row at round ``done`` (``None`` when it returns nothing)."""
  out = action(state, done)
  return None if out is None else {"round": done, **labels, **out}


def _ledger(sim, state, collected, rounds):
  """The run's ledger; with faults, totals count only what surviving clients sent."""
  return sim.ledger(state).run_totals(rounds, _stack(collected) if collected else {})


def _stack(chunks):
  return {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}
