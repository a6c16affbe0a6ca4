"""Many runs in one compiled program: a grid of hyperparameters times seeds, vmapped.

``fedco.sweep`` builds the algorithm once under :func:`fedco.inject_hyperparams`, so every
numeric hyperparameter is state, initialises one simulation state per run (its own seed:
client sampling, batches, faults, the random iterate), writes each run's hyperparameters
into its state, and advances all runs together: one ``lax.scan`` over rounds of a
``vmap`` over runs of the simulator's round, one ``jax.jit`` for every chunk
(:mod:`fedco.runtime.vmapped`). Each run keeps its own metrics, ledger and random iterate.
A run whose state or evaluated metrics stop being finite is frozen at its last finite
state (its later metrics are NaN) and reported with the round and the quantity; the other
runs go on. Results equal separate :func:`fedco.simulate` calls up to float round-off
(batched instead of single products).

Given an :class:`~fedco.algorithms.Algorithm` instead of a factory, the runs are its seeds
alone (no grid). Each seed may have its own data, initial model and ``metrics_data``
(:class:`~fedco.runtime.vmapped.PerSeed`). As :func:`fedco.simulate`, a sweep streams each
run's evaluated rows to metric writers (labelled per run), checkpoints all runs together
and resumes from its newest intact checkpoint, and never drops a Ctrl-C.

With ``mesh=``, the *runs* are laid along the mesh's clients axis (each device advances
``R / D`` whole runs; the run count is padded to a multiple of ``D`` with copies of the last
run, cut off afterwards): independent runs need no communication, so this is the layout
that scales. Within a run, clients are vmapped on its device.

Limits: the problem is shared by all runs (a problem hyperparameter such as a KL
temperature needs one sweep per value).
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import numbers
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from fedco import _validate
from fedco.algorithms.base import Algorithm, inject_hyperparams
from fedco.runtime import checkpoints, driver, host, sweep_io, vmapped
from fedco.runtime.loop import SimulationResult
from fedco.runtime.mesh import CLIENTS, check_mesh, replicated
from fedco.runtime.options import SimOptions
from fedco.runtime.simulator import SimState, Simulator
from fedco.runtime.vmapped import PerSeed

PyTree = Any


@dataclasses.dataclass
class SweepResult:
  """What :func:`sweep` returns: every run's final models, metrics and ledger, stacked.

  Run ``r`` is ``runs[r]``; its slice of every stacked field is index ``r`` of the leading
  axis, and :meth:`simulation` gives it as the :class:`SimulationResult` a separate
  :func:`fedco.simulate` call would have returned (up to float round-off).

  Attributes:
    runs: one dict per run: ``{"seed": s, name: value, ...}`` (grid order, seeds fastest).
    params: the server models after the last round, leaves ``[R, ...]``.
    random_params: each run's model of a uniformly random round, leaves ``[R, ...]``.
    state: the final stacked :class:`SimState` (leaves ``[R, ...]``).
    metrics: per-run, per-round host arrays ``[R, rounds, ...]`` (as
      :attr:`SimulationResult.metrics`); a frozen run's rounds after its divergence are NaN.
    diverged: per run, ``None`` or ``{"round": r, "quantity": name}``: the first round
      whose state (``"state"``) or evaluated metric (its name) was not finite; the run was
      frozen there while the others went on.
    ledgers: per run, the communication ledger (``SimulationResult.ledger``).
    seconds: wall time of the rounds, compilation included.

  Examples:
    FedAvg at a sane and an absurd learning rate, one program: the second run overflows
    in round 2 and is frozen, the first goes on:

    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> import fedco
    >>> x = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 1.0]], np.float32)
    >>> data = fedco.FederatedData.from_clients([{"x": x + k} for k in range(4)])
    >>> problem = fedco.problems.plain(lambda w, e: jnp.sum((w - e["x"]) ** 2))
    >>> result = fedco.sweep(
    ...   problem, fedco.fedavg, data, jnp.zeros(2), rounds=3, batch_size=None,
    ...   grid={"learning_rate": [0.1, 1e10]}, algorithm_kwargs={"local_steps": 1},
    ... )
    >>> result.runs
    [{'learning_rate': 0.1, 'seed': 0}, {'learning_rate': 10000000000.0, 'seed': 0}]
    >>> result.diverged
    [None, {'round': 2, 'quantity': 'objective'}]
    >>> result.metrics["objective"].shape, result.params.shape  # [R, rounds], [R, d]
    ((2, 3), (2, 2))
    >>> first = result.simulation(0)  # run 0 as a fedco.simulate result
    >>> [round(float(v), 2) for v in first.metrics["objective"]]
    [10.43, 7.82, 6.15]
  """

  runs: List[Dict[str, Any]]
  params: PyTree
  random_params: PyTree
  state: SimState
  metrics: Dict[str, np.ndarray]
  diverged: List[Optional[Dict[str, Any]]]
  ledgers: List[Dict[str, Any]]
  seconds: float

  def simulation(self, r: int) -> SimulationResult:
    """Run ``r`` as a :class:`SimulationResult` (``seconds``: the whole sweep's).

    Args:
      r: the run's index in ``runs``, an int in ``[0, R)``.

    Returns:
      The run's :class:`SimulationResult` (its ``host_metrics`` empty).
    """
    one = lambda tree: jax.tree.map(lambda a: a[r], tree)
    return SimulationResult(
      one(self.params),
      one(self.random_params),
      one(self.state),
      {k: v[r] for k, v in self.metrics.items()},
      self.ledgers[r],
      self.seconds,
    )


def _grid_runs(factory, grid, seeds, static):
  names = list(grid)
  parameters = inspect.signature(factory).parameters if factory is not None else {}
  for name in names:
    if factory is None:
      raise ValueError(
        f"grid: {name!r} needs an algorithm factory (fedco.feddro, ...); an "
        f"Algorithm instance sweeps seeds only"
      )
    if name not in parameters or name in static:
      numeric = sorted(p for p in parameters if p not in static)
      raise ValueError(
        f"grid: {name!r} is not a numeric hyperparameter of "
        f"{getattr(factory, '__name__', factory)}; allowed: {numeric}"
      )
    values = grid[name]
    if isinstance(values, np.ndarray) and values.ndim == 1:
      values = grid[name] = list(values)
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
      raise ValueError(f"grid[{name!r}] must be a non-empty list of numbers, got {values!r}")
    for i, value in enumerate(values):  # jnp.asarray of them all must work
      _validate.real(f"grid[{name!r}][{i}]", value)
  if isinstance(seeds, numbers.Integral) and not isinstance(seeds, (bool, np.bool_)):
    raise ValueError(
      f"seeds must be a non-empty list of integers >= 0, got the int {seeds!r}: "
      f"for {int(seeds)} runs pass seeds=range({int(seeds)}), for the seed "
      f"{int(seeds)} alone seeds=[{int(seeds)}]"
    )
  if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Iterable):
    raise ValueError(f"seeds must be a non-empty list of integers >= 0, got {seeds!r}")
  seeds = [_validate.positive_int(f"seeds[{i}]", s, minimum=0) for i, s in enumerate(seeds)]
  if not seeds or len(set(seeds)) != len(seeds):
    raise ValueError(f"seeds must be a non-empty list of distinct integers >= 0, got {seeds}")
  combos = itertools.product(*(grid[n] for n in names))
  return seeds, [{**dict(zip(names, values)), "seed": s} for values in combos for s in seeds]


def _algorithm(algorithm, grid, kwargs, seeds):
  """``(algorithm, runs)``: the injected algorithm of a factory's grid, or the instance."""
  if isinstance(algorithm, Algorithm):
    if kwargs:
      raise ValueError("algorithm_kwargs needs an algorithm factory; got an Algorithm")
    return algorithm, _grid_runs(None, grid, seeds, ())
  overlap = set(grid) & set(kwargs)
  if overlap:
    raise ValueError(f"grid and algorithm_kwargs both set {sorted(overlap)}")
  injected_factory = inject_hyperparams(algorithm)
  seeds, runs = _grid_runs(algorithm, grid, seeds, set(injected_factory.static_args))
  for run in runs:  # every grid point is validated before anything compiles
    algorithm(**kwargs, **{k: v for k, v in run.items() if k != "seed"})
  first = {k: float(v) for k, v in runs[0].items() if k != "seed"}
  return injected_factory(**kwargs, **first), (seeds, runs)


def sweep(
  problem,
  algorithm_factory: Callable[..., Algorithm] | Algorithm,
  data,
  params: PyTree,
  *,
  rounds: int,
  grid: Optional[Dict[str, Sequence[float]]] = None,
  seeds: Sequence[int] = (0,),
  algorithm_kwargs: Optional[Dict[str, Any]] = None,
  chunk_rounds: Optional[int] = None,
  progress: bool = False,
  mesh: Optional[jax.sharding.Mesh] = None,
  checkpoint_dir=None,
  checkpoint_every: Optional[int] = None,
  keep_checkpoints: int = 3,
  metric_writers=(),
  metric_labels: Optional[Sequence[Dict[str, Any]]] = None,
  progress_metric: str = "objective",
  options: Optional[SimOptions] = None,
  **settings,
) -> SweepResult:
  """Run every combination of ``grid`` times ``seeds`` as one vmapped program.

  The algorithm is built once under :func:`fedco.inject_hyperparams`, so every numeric
  hyperparameter is state; each run gets its own seed (client sampling, batches, faults,
  the random iterate) and its hyperparameters written into its state, and all runs advance
  together: one ``lax.scan`` over rounds of a ``vmap`` over runs of the simulator's round,
  one ``jax.jit`` per chunk. Each run keeps its own metrics, ledger and random iterate, and
  equals its separate :func:`fedco.simulate` call up to float round-off. A run whose state or
  evaluated metrics stop being finite is frozen at its last finite state (its later metrics
  are NaN) and reported in ``diverged``; the others go on. As :func:`fedco.simulate`, a
  sweep streams each run's evaluated rows to metric writers (labelled per run), checkpoints
  all runs together and resumes from its newest intact checkpoint. The problem is shared by
  all runs (a problem hyperparameter such as a KL temperature needs one sweep per value).

  Ctrl-C stops the sweep after the running chunk with :class:`fedco.runtime.Interrupted`
  (a checkpoint is saved first when checkpointing; one during the last chunk carries the
  finished ``result``), as :func:`fedco.simulate` does.

  Args:
    problem: the :class:`~fedco.problems.Problem`, as :func:`fedco.simulate` (shared by all
      runs).
    algorithm_factory: a registry factory (``fedco.feddro``, ...), or an ``Algorithm``
      (then the runs are the seeds alone: no ``grid``, no ``algorithm_kwargs``).
    data: the :class:`~fedco.data.FederatedData`, shared by all runs, or a
      :class:`~fedco.runtime.vmapped.PerSeed` with each seed's own (equal shapes).
    params: the initial model, shared by all runs, or a ``PerSeed`` with each seed's own.
    rounds: rounds per run, an int ``>= 1``.
    grid: ``{hyperparameter: [values]}``: numeric arguments of the factory (learning rate,
      ``beta``, ``gamma``, server rates, ...; not its static ``local_steps`` or
      ``optimizer``), each a non-empty list of finite numbers; runs are their Cartesian
      product. Every point is validated by the factory before anything compiles. Default:
      no grid.
    seeds: simulation seeds, a non-empty sequence of distinct ints ``>= 0`` (``range(n)``
      for ``n`` runs; a bare int is refused); each grid point runs once per seed. Default
      ``(0,)``.
    algorithm_kwargs: a dict of the factory's other arguments (``local_steps``, ``case``,
      ...), none of them in ``grid``.
    chunk_rounds: rounds per jitted call, an int ``>= 1`` (default: all, at most 100).
    progress: show a progress bar. Default ``False``.
    mesh: a mesh with a ``"clients"`` axis (:func:`fedco.runtime.client_mesh`) to lay the
      runs along: each of its ``D`` devices advances ``R / D`` whole runs (the run count is
      padded to a multiple of ``D`` with copies of the last run, cut off afterwards), and
      within a run clients are vmapped on its device. ``None`` (default): one device.
    checkpoint_dir: as :func:`fedco.simulate`: every run's state, freeze round and metrics
      so far in one checkpoint; a sweep finding its own checkpoint resumes (bit-identical to
      an uninterrupted sweep), another's is refused. ``None`` (default): no checkpoints.
    checkpoint_every: rounds between checkpoints, an int ``>= 1`` (default: every chunk).
    keep_checkpoints: how many checkpoints to keep, an int ``>= 1``. Default 3.
    metric_writers: :class:`fedco.runtime.host.RowWriter` s receiving each run's evaluated
      rows after every chunk (a frozen run's up to its divergence).
    metric_labels: one dict of row labels per run, in ``runs`` order (default: the run's
      ``runs`` entry).
    progress_metric: the metric the bar shows (its mean over the runs still finite).
      Default ``"objective"``.
    options: a :class:`~fedco.runtime.SimOptions`, shared by all runs (each field
      documented there; ``metrics_data`` may be a ``PerSeed``; a ``privacy`` with a target
      epsilon is spent over ``rounds``, ``metrics["epsilon"]`` per run and round).
      Default: every default.
    **settings: fields of ``options`` by keyword, replacing its values.
  Returns:
    A :class:`SweepResult`: ``runs`` (one dict per run), stacked ``params``,
    ``random_params``, ``state`` and ``metrics`` with a leading run axis ``R``, per-run
    ``diverged`` and ``ledgers``, and ``seconds``.

  Raises:
    ValueError: a ``grid`` name that is not a numeric hyperparameter of the factory (or a
      grid or ``algorithm_kwargs`` with an ``Algorithm``), grid values or ``seeds`` that
      are not allowed, ``metric_labels`` without one dict per run, a ``PerSeed`` without
      one value per seed or with unequal shapes, a ``mesh`` without a ``"clients"`` axis, or
      any of :func:`fedco.simulate`'s argument errors.
    Interrupted: after a Ctrl-C, at the end of the running chunk.

  Examples:
    Two FedAvg learning rates times two seeds (each seed samples its own 2 of the 4 clients
    per round), 4 runs in one program:

    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> import fedco
    >>> x = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 1.0]], np.float32)
    >>> data = fedco.FederatedData.from_clients([{"x": x + k} for k in range(4)])
    >>> problem = fedco.problems.plain(lambda w, e: jnp.sum((w - e["x"]) ** 2))
    >>> result = fedco.sweep(
    ...   problem, fedco.fedavg, data, jnp.zeros(2), rounds=3, batch_size=None,
    ...   clients_per_round=2, grid={"learning_rate": [0.02, 0.1]}, seeds=[0, 1],
    ...   algorithm_kwargs={"local_steps": 1},
    ... )
    >>> [(run["learning_rate"], run["seed"]) for run in result.runs]
    [(0.02, 0), (0.02, 1), (0.1, 0), (0.1, 1)]
    >>> result.metrics["objective"].shape  # [runs, rounds]
    (4, 3)
    >>> final = result.metrics["objective"][:, -1].reshape(2, 2)  # [learning rate, seed]
    >>> [round(float(v), 1) for v in final.mean(axis=1)]  # mean over the seeds
    [12.1, 6.5]
    >>> result.runs[int(np.argmin(final))]  # the best run
    {'learning_rate': 0.1, 'seed': 0}
  """
  rounds = _validate.positive_int("rounds", rounds)
  chunk = (
    min(rounds, 100)
    if chunk_rounds is None
    else _validate.positive_int("chunk_rounds", chunk_rounds)
  )
  mesh = check_mesh(mesh)
  grid = dict(grid or {})
  algorithm, (seeds, runs) = _algorithm(
    algorithm_factory, grid, dict(algorithm_kwargs or {}), seeds
  )
  labels = [dict(l) for l in (runs if metric_labels is None else metric_labels)]
  if len(labels) != len(runs):
    raise ValueError(f"metric_labels must hold one dict per run ({len(runs)}), got {len(labels)}")
  options = SimOptions.of(options, settings).over(rounds)
  metrics_data = options.metrics_data  # per run (a PerSeed) or shared: placed below
  options = dataclasses.replace(options, metrics_data=None)
  devices = 1 if mesh is None else mesh.shape[CLIENTS]
  padded = runs + [runs[-1]] * (-len(runs) % devices)  # copies of the last run, cut off later
  run_seeds = [run["seed"] for run in padded]
  first = lambda v: v.values[0] if isinstance(v, PerSeed) else v
  sim = Simulator(problem, algorithm, first(data), options)
  if isinstance(params, PerSeed):  # Simulator.init's checks, each seed's on its data
    params = PerSeed([sim._checked_params(p) for p in params.values])
  else:
    params = sim._checked_params(params)
  if not isinstance(data, PerSeed):
    data = sim.data
  if not isinstance(metrics_data, PerSeed):
    metrics_data = jax.tree.map(jnp.asarray, metrics_data)
  axes = {}  # per input, the vmap axis of each leaf: 0 (one per run) or None (shared)
  (data, axes["data"]), (params, axes["params"]), (metrics_data, axes["metrics_data"]) = (
    vmapped.per_run(name, value, seeds, run_seeds)
    for name, value in (("data", data), ("params", params), ("metrics_data", metrics_data))
  )
  values = {k: jnp.asarray([run[k] for run in padded], jnp.result_type(float)) for k in grid}
  keys = jnp.stack([jax.random.PRNGKey(s) for s in run_seeds])
  jit_init, jit_chunk = {}, {}
  if mesh is not None:  # runs along the mesh; shared inputs on every device
    along = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(CLIENTS))

    def place(value, axes):
      leaves, treedef = jax.tree.flatten(value)
      axes = (
        [axes] * len(leaves)
        if axes is None or isinstance(axes, int)
        else jax.tree.leaves(axes, is_leaf=lambda x: x is None)
      )
      return treedef.unflatten(
        [jax.device_put(a, along if x == 0 else replicated(mesh)) for a, x in zip(leaves, axes)]
      )

    params, data = place(params, axes["params"]), place(data, axes["data"])
    metrics_data = place(metrics_data, axes["metrics_data"])
    keys, values = jax.device_put((keys, values), along)
    per_round = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, CLIENTS))
    jit_init, jit_chunk = {"out_shardings": along}, {"out_shardings": (along, along, per_round)}
  run_chunk = vmapped.chunk_program(sim.config, axes, rounds, **jit_chunk)
  start = time.perf_counter()
  states = vmapped.init_program(sim.config, axes, **jit_init)(params, keys, values, data)
  frozen = jnp.zeros((len(padded),), jnp.int32)
  if mesh is not None:
    frozen = jax.device_put(frozen, along)
  job = _Sweep(
    sim,
    runs,
    rounds,
    chunk,
    run_chunk,
    (data, metrics_data),
    (states, frozen),
    log=sweep_io.RunRows(labels, metric_writers, len(runs)),
    name=sweep_io.bar_name(labels, algorithm),
    progress_metric=progress_metric,
  )
  done = 0
  if checkpoint_dir is not None:
    every = checkpoints.every_round(checkpoint_every, chunk)
    job.ckpt = checkpoints.SweepCheckpoint(
      checkpoint_dir, keep_checkpoints, every, sim, runs, (params, data, metrics_data), job.carry
    )
    done, job.carry, job.log.collected = job.ckpt.restore(rounds)
  job.log.rewind()
  return driver.drive(
    job, rounds, done, progress=progress, progress_metric=progress_metric, start=start
  )


@dataclasses.dataclass(eq=False)
class _Sweep:
  """:func:`sweep`'s runs, advanced together chunk by chunk by
  :func:`fedco.runtime.driver.drive`."""

  sim: Simulator
  runs: List[Dict[str, Any]]
  rounds: int
  chunk: int
  run_chunk: Callable
  inputs: Tuple[Any, Any]  # (data, metrics_data), as the chunk program takes them
  carry: Tuple[Any, Any]  # (states, frozen): every run's state and freeze round
  log: Any = None
  name: str = ""
  progress_metric: str = "objective"
  ckpt: Optional[checkpoints.SweepCheckpoint] = None

  @property
  def checkpointed(self) -> bool:
    return self.ckpt is not None

  def start(self, done: int) -> None:
    del done  # nothing to open

  def size(self, done: int) -> int:
    if self.ckpt is None:
      return min(self.chunk, self.rounds - done)
    return self.ckpt.size(done, self.chunk, self.rounds)

  def step(self, done: int, size: int) -> None:
    states, frozen = self.carry
    states, frozen, metrics = self.run_chunk(states, frozen, *self.inputs, length=size)
    self.carry = (states, frozen)
    self.log.chunk(metrics, done, self.sim)

  def after(self, done: int, stopping: bool) -> Optional[float]:
    if self.ckpt is not None and (self.ckpt.due(done, self.rounds) or stopping):
      self.ckpt.save(done, self.carry, self.log.collected)
    return self.log.shown(self.progress_metric)

  def result(self, seconds: float) -> SweepResult:
    states, frozen = self.carry
    return _result(self.sim, self.runs, states, frozen, self.log.collected, self.rounds, seconds)

  def close(self) -> None:
    try:
      host.close_all(self.log.writers)
    finally:
      if self.ckpt is not None:
        self.ckpt.close()


def _result(sim, runs, states, frozen, collected, rounds, seconds) -> SweepResult:
  """The finished sweep's :class:`SweepResult`."""
  metrics = dict(collected)
  diverged = vmapped.divergences(np.asarray(frozen)[: len(runs)], metrics)
  n = len(runs)  # (slices only where runs were padded: each slice compiles a program)
  states = jax.tree.map(lambda a: a if a.shape[0] == n else a[:n], states)
  ledger = sim.ledger(jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), states))
  faults = {k: v for k, v in metrics.items() if k in ("survivors", "local_steps")}
  ledgers = [
    ledger.run_totals(rounds, {k: v[r] for k, v in faults.items()}) for r in range(len(runs))
  ]
  return SweepResult(
    runs, states.server["params"], states.random_params, states, metrics, diverged, ledgers, seconds
  )


__all__ = ["PerSeed", "SweepResult", "sweep"]
