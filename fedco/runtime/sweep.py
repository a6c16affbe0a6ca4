"""Many runs in one compiled program: a grid of hyperparameters times seeds, vmapped.

``fedco.sweep`` builds the algorithm once under :func:`fedco.inject_hyperparams`, so every
numeric hyperparameter is state, initialises one simulation state per run (its own seed:
client sampling, batches, faults, the random iterate), writes each run's hyperparameters
into its state, and advances all runs together: one ``lax.scan`` over rounds of a
``vmap`` over runs of the simulator's round, one ``jax.jit`` for every chunk. Each run keeps
its own metrics, ledger and random iterate. A run whose state or evaluated metrics stop
being finite is frozen at its last finite state (its later metrics are NaN) and reported
with the round and the quantity; the other runs go on. Results equal separate
:func:`fedco.simulate` calls up to float round-off (batched instead of single products).

With ``mesh=``, the *runs* are laid along the mesh's clients axis (each device advances
``R / D`` whole runs; the run count is padded to a multiple of ``D`` with copies of the last
run, cut off afterwards): independent runs need no communication, so this is the layout
that scales. Within a run, clients are vmapped on its device.

Limits: the problem and data are shared by all runs (a problem hyperparameter such as a KL
temperature needs one sweep per value); no checkpoints yet.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import numbers
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedco import _validate
from fedco import privacy as privacy_lib
from fedco.algorithms.base import (Algorithm, InjectedServerState, get_field, inject_hyperparams,
                                   set_fields)
from fedco.runtime import evaluation, host, rounds as rounds_lib
from fedco.runtime.mesh import CLIENTS, check_mesh, replicated
from fedco.runtime.simulator import SimState, Simulator

PyTree = Any


@dataclasses.dataclass
class SweepResult:
  """What :func:`sweep` returns; run ``r`` is ``runs[r]``.

  Attributes:
    runs: one dict per run: ``{"seed": s, name: value, ...}`` (grid order, seeds fastest).
    params: the server models after the last round, leaves ``[R, ...]``.
    random_params: each run's model of a uniformly random round, leaves ``[R, ...]``.
    state: the final stacked :class:`SimState` (leaves ``[R, ...]``).
    metrics: per-run, per-round host arrays ``[R, rounds, ...]`` (as
      :attr:`SimulationResult.metrics`); a frozen run's rounds after its divergence are NaN.
    diverged: per run, ``None`` or ``{"round": r, "quantity": name}``: the first round
      whose state (``"state"``) or evaluated metric (its name) was not finite.
    ledgers: per run, the communication ledger (``SimulationResult.ledger``).
    seconds: wall time of the rounds, compilation included.
  """
  runs: List[Dict[str, Any]]
  params: PyTree
  random_params: PyTree
  state: SimState
  metrics: Dict[str, np.ndarray]
  diverged: List[Optional[Dict[str, Any]]]
  ledgers: List[Dict[str, Any]]
  seconds: float


def _grid_runs(factory, grid, seeds, static):
  names = list(grid)
  parameters = inspect.signature(factory).parameters
  for name in names:
    if name not in parameters or name in static:
      numeric = sorted(p for p in parameters if p not in static)
      raise ValueError(f"grid: {name!r} is not a numeric hyperparameter of "
                       f"{getattr(factory, '__name__', factory)}; allowed: {numeric}")
    values = grid[name]
    if isinstance(values, np.ndarray) and values.ndim == 1:
      values = grid[name] = list(values)
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
      raise ValueError(f"grid[{name!r}] must be a non-empty list of numbers, got {values!r}")
    for i, value in enumerate(values):  # jnp.asarray of them all must work
      _validate.real(f"grid[{name!r}][{i}]", value)
  if isinstance(seeds, numbers.Integral) and not isinstance(seeds, (bool, np.bool_)):
    raise ValueError(f"seeds must be a non-empty list of integers >= 0, got the int {seeds!r}: "
                     f"for {int(seeds)} runs pass seeds=range({int(seeds)}), for the seed "
                     f"{int(seeds)} alone seeds=[{int(seeds)}]")
  if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Iterable):
    raise ValueError(f"seeds must be a non-empty list of integers >= 0, got {seeds!r}")
  seeds = [_validate.positive_int(f"seeds[{i}]", s, minimum=0) for i, s in enumerate(seeds)]
  if not seeds:
    raise ValueError("seeds must be a non-empty list of integers >= 0")
  combos = itertools.product(*(grid[n] for n in names))
  return [{**dict(zip(names, values)), "seed": s} for values in combos for s in seeds]


def _set_hyperparams(state: SimState, values: Dict[str, jax.Array]) -> SimState:
  """One run's state with its hyperparameters, in every client's state and the server's."""
  hp = dict(get_field(state.clients, "hyperparams"))
  for name, value in values.items():
    hp[name] = jnp.broadcast_to(value.astype(hp[name].dtype), hp[name].shape)
  clients = set_fields(state.clients, hyperparams=hp)
  server_opt_state = state.server_opt_state
  if isinstance(server_opt_state, InjectedServerState):
    shp = dict(server_opt_state.hyperparams)
    shp.update({k: v.astype(shp[k].dtype) for k, v in values.items() if k in shp})
    server_opt_state = server_opt_state._replace(hyperparams=shp)
  return state._replace(clients=clients, server_opt_state=server_opt_state)


def _all_finite(tree) -> jax.Array:
  leaves = [jnp.all(jnp.isfinite(a)) for a in jax.tree.leaves(tree)
            if jnp.issubdtype(jnp.result_type(a), jnp.inexact)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.ones([], bool)


def _per_run(mask, leaf):
  """A ``[R]`` mask shaped to broadcast against a ``[R, ...]`` leaf."""
  return mask.reshape((-1,) + (1,) * (leaf.ndim - 1))


def _finite_metrics(metrics) -> jax.Array:
  """Whether this round's evaluated metrics are finite (unevaluated rounds hold NaN)."""
  evaluated = metrics.get("evaluated", jnp.ones([], bool))
  floats = {k: v for k, v in metrics.items() if k not in ("evaluated", "clients")}
  return ~evaluated | _all_finite(floats)


def sweep(problem, algorithm_factory: Callable[..., Algorithm], data, params: PyTree, *,
          rounds: int, grid: Optional[Dict[str, Sequence[float]]] = None,
          seeds: Sequence[int] = (0,), algorithm_kwargs: Optional[Dict[str, Any]] = None,
          chunk_rounds: Optional[int] = None, progress: bool = False,
          mesh: Optional[jax.sharding.Mesh] = None, **simulator_kwargs) -> SweepResult:
  """Run every combination of ``grid`` times ``seeds`` as one vmapped program.

  Args:
    problem, data: as :func:`fedco.simulate` (shared by all runs).
    algorithm_factory: a registry factory (``fedco.feddro``, ...).
    params: the initial model, shared by all runs.
    rounds: rounds per run.
    grid: ``{hyperparameter: [values]}``, numeric arguments of the factory (learning rate,
      ``beta``, ``gamma``, server rates, ...); runs are their Cartesian product.
    seeds: simulation seeds (client sampling, batches, faults); each grid point runs once
      per seed.
    algorithm_kwargs: the factory's other arguments (``local_steps``, ``case``, ...).
    chunk_rounds: rounds per jitted call (default: all, at most 100).
    progress: print a progress line per chunk.
    mesh: a mesh with a ``"clients"`` axis (:func:`fedco.runtime.client_mesh`) to lay the
      runs along; ``None``: one device.
    **simulator_kwargs: forwarded to :class:`Simulator` (``batch_size``, ``eval_every``,
      ``metrics_fn``, faults, ``compression``, ``privacy`` (a target epsilon is spent over
      ``rounds``; ``metrics["epsilon"]`` per run and round), ...).

  Ctrl-C stops the sweep after the running chunk with :class:`fedco.runtime.Interrupted`
  (a sweep keeps no checkpoints; one during the last chunk carries the finished
  ``result``), as :func:`fedco.simulate` does.
  """
  rounds = _validate.positive_int("rounds", rounds)
  chunk = min(rounds, 100) if chunk_rounds is None else _validate.positive_int(
      "chunk_rounds", chunk_rounds)
  mesh = check_mesh(mesh)
  grid, kwargs = dict(grid or {}), dict(algorithm_kwargs or {})
  overlap = set(grid) & set(kwargs)
  if overlap:
    raise ValueError(f"grid and algorithm_kwargs both set {sorted(overlap)}")
  injected_factory = inject_hyperparams(algorithm_factory)
  runs = _grid_runs(algorithm_factory, grid, seeds, set(injected_factory.static_args))
  for run in runs:  # every grid point is validated before anything compiles
    algorithm_factory(**kwargs, **{k: v for k, v in run.items() if k != "seed"})
  first = {k: v for k, v in runs[0].items() if k != "seed"}
  algorithm = injected_factory(**kwargs, **{k: float(v) for k, v in first.items()})
  private = simulator_kwargs.get("privacy")
  if isinstance(private, privacy_lib.ClientDP):
    simulator_kwargs["privacy"] = private.over(rounds)
  sim = Simulator(problem, algorithm, data, **simulator_kwargs)
  params = sim._checked_params(params)  # Simulator.init's checks
  devices = 1 if mesh is None else mesh.shape[CLIENTS]
  padded = runs + [runs[-1]] * (-len(runs) % devices)  # copies of the last run, cut off later
  values = {k: jnp.asarray([run[k] for run in padded], jnp.result_type(float)) for k in grid}
  keys = jnp.stack([jax.random.PRNGKey(run["seed"]) for run in padded])
  by_run = {}
  if mesh is not None:  # runs along the mesh; the data and initial model on every device
    along = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(CLIENTS))
    params, data = jax.device_put((params, sim.data), replicated(mesh))
    keys, values = jax.device_put((keys, values), along)
    by_run = {"out_shardings": along}
    per_round = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, CLIENTS))
  else:
    data = sim.data

  @functools.partial(jax.jit, **by_run)
  def init_all(params, keys, values, data):
    def one(key, hp):
      return _set_hyperparams(rounds_lib.init_state(sim.config, params, key, data), hp)
    return jax.vmap(one)(keys, values)

  @functools.partial(jax.jit, static_argnames="length",
                     **({} if mesh is None else {"out_shardings": (along, along, per_round)}))
  def run_chunk(states, frozen, data, metrics_data, length):
    flat = evaluation.flat_examples(sim.config, data)

    def one_round(carry, _):
      states, frozen = carry
      new, metrics = jax.vmap(
          lambda s: rounds_lib.round_step(sim.config, data, flat, s, rounds, metrics_data))(states)
      ok = jax.vmap(_all_finite)(new) & jax.vmap(_finite_metrics)(metrics)
      stop = (frozen == 0) & ~ok
      frozen = jnp.where(stop, new.round, frozen)
      keep_old = frozen > 0
      states = jax.tree.map(lambda a, b: jnp.where(_per_run(keep_old, a), a, b), states, new)
      masked = jax.tree.map(
          lambda m: m if not jnp.issubdtype(m.dtype, jnp.inexact) else jnp.where(
              _per_run(keep_old & ~stop, m), jnp.nan, m), metrics)
      return (states, frozen), masked

    (states, frozen), metrics = jax.lax.scan(one_round, (states, frozen), None, length=length)
    return states, frozen, metrics

  start = time.perf_counter()
  states = init_all(params, keys, values, data)
  frozen = jnp.zeros((len(padded),), jnp.int32)
  if mesh is not None:
    frozen = jax.device_put(frozen, along)
  bar = host.ProgressBar(rounds, label=f"sweep of {len(runs)} {algorithm.name} runs",
                        enabled=progress)
  collected, done = [], 0
  try:
    with host.interrupt_guard() as stop:
      if stop.requested:  # Ctrl-C came before this sweep (a guard around a loop of runs)
        raise host.Interrupted(f"interrupted a sweep of {len(runs)} runs before round 1",
                               0)
      while done < rounds:
        size = min(chunk, rounds - done)
        states, frozen, metrics = run_chunk(states, frozen, data, sim.metrics_data, length=size)
        collected.append({k: np.swapaxes(np.asarray(v), 0, 1)[:len(runs)]
                          for k, v in metrics.items()})
        done += size
        bar.update(done)
        if stop.requested:  # a sweep keeps no checkpoints: its rows are the result
          err = host.Interrupted(f"interrupted a sweep of {len(runs)} runs after round "
                                 f"{done} of {rounds}", done)
          if done == rounds:
            err.result = _result(sim, runs, states, frozen, collected, rounds,
                                 time.perf_counter() - start, padded)
          raise err
  finally:
    bar.close()
  return _result(sim, runs, states, frozen, collected, rounds, time.perf_counter() - start,
                 padded)


def _result(sim, runs, states, frozen, collected, rounds, seconds, padded) -> SweepResult:
  """The finished sweep's :class:`SweepResult`."""
  metrics = {k: np.concatenate([c[k] for c in collected], axis=1) for k in collected[0]}
  diverged = _divergences(np.asarray(frozen)[:len(runs)], metrics)
  link = sim.config.uplink
  if link is not None and link.private and link.noise_multiplier > 0:  # as simulate's
    metrics["epsilon"] = np.tile(link.epsilon(np.arange(1, rounds + 1)), (len(runs), 1))
  if len(padded) > len(runs):
    states = jax.tree.map(lambda a: a[:len(runs)], states)
  ledger = sim.ledger(jax.tree.map(lambda a: a[0], states))
  faults = {k: v for k, v in metrics.items() if k in ("survivors", "local_steps")}
  ledgers = [ledger.run_totals(rounds, {k: v[r] for k, v in faults.items()})
             for r in range(len(runs))]
  return SweepResult(runs, states.server["params"], states.random_params, states, metrics,
                     diverged, ledgers, seconds)


def _divergences(frozen, metrics):
  """``None`` or ``{"round", "quantity"}`` per run from the freeze rounds (1-based)."""
  out = []
  for r, round_ in enumerate(frozen.tolist()):
    if round_ == 0:
      out.append(None)
      continue
    quantity = "state"  # the model or a tracker, unless an evaluated metric says more
    evaluated = "evaluated" not in metrics or bool(metrics["evaluated"][r][round_ - 1])
    names = (k for k in metrics if k not in ("evaluated", "clients")) if evaluated else ()
    for name in sorted(names, key=lambda k: k != "objective"):
      value = np.asarray(metrics[name][r][round_ - 1])
      if np.issubdtype(value.dtype, np.floating) and not np.all(np.isfinite(value)):
        quantity = name
        break
    out.append({"round": int(round_), "quantity": quantity})
  return out


__all__ = ["SweepResult", "sweep"]
