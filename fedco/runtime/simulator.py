"""The one-program federated simulator.

Clients are stacked on a leading axis and ``vmap``-ed; the local steps of a round are a
``lax.scan``; a chunk of rounds is a ``lax.scan`` over rounds inside one ``jax.jit``. The
runtime contains no algorithm math: it reads the algorithm's :class:`CommPlan`, draws
batches, calls ``update``, averages what the plan says and hands pseudo-gradients to the
algorithm's server transform.

Randomness is explicit: the round key is folded with each client's *id* and then with the
step index, so a client's batches do not depend on which other clients were sampled or on
how clients are laid out over devices. One seed gives one result.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, Dict, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedco import _validate
from fedco.algorithms.base import (Algorithm, RoundInfo, as_aggregator, get_field,
                                   init_trackers, set_fields)
from fedco.data.federated import FederatedData
from fedco.problems.base import Problem
from fedco.runtime import host
from fedco.runtime.distributed import ClientBlockData, fetch

PyTree = Any
CLIENTS = "clients"


def client_mesh(num_devices: Optional[int] = None) -> jax.sharding.Mesh:
  """A one-axis ``("clients",)`` mesh over the first ``num_devices`` devices (default all)."""
  available = jax.device_count()
  num = available if num_devices is None else num_devices
  if isinstance(num, bool) or not isinstance(num, int) or not 1 <= num <= available:
    raise ValueError(f"num_devices must be an integer in [1, {available}] (the devices "
                     f"present), got {num_devices!r}")
  return jax.sharding.Mesh(np.array(jax.devices()[:num]), (CLIENTS,))


class SimState(NamedTuple):
  """Everything the simulation carries between rounds (a pytree).

  Attributes:
    round: rounds completed so far.
    key: the PRNG key for the next round.
    server: ``{"params": x, field: value}`` for the round-synchronised state fields.
    server_opt_state: the server transform's state.
    shared: ``{field: mean}`` for the every-step fields (FedDRO's ``y_bar``).
    clients: every client's algorithm state, stacked on a leading ``[K]`` axis.
    random_params: the averaged model of a uniformly random completed round (reservoir
      sampling), the iterate the FedDRO/DS-FedDRO theorems return.
  """
  round: jax.Array
  key: jax.Array
  server: Dict[str, PyTree]
  server_opt_state: Any
  shared: Dict[str, PyTree]
  clients: Any
  random_params: PyTree


class Ledger(NamedTuple):
  """Floats each participating client sends (up) and receives (down) per round, by item.

  ``per_step_up`` are the items sent after every local step (FedDRO's ``y``), counted in
  ``up`` for a full round of ``local_steps``; a straggler sends them only for the steps it
  did, and a dropped client sends nothing up (:meth:`as_dict` with the run's fault record).
  """
  up: Dict[str, int]
  down: Dict[str, int]
  clients_per_round: int
  per_step_up: Dict[str, int] = {}
  local_steps: int = 1

  def per_round(self) -> Dict[str, int]:
    """Total floats over all participating clients in one round, both directions."""
    return {"up": self.clients_per_round * sum(self.up.values()),
            "down": self.clients_per_round * sum(self.down.values())}

  def as_dict(self, rounds: int, survivors=None, local_steps=None) -> Dict[str, Any]:
    """Per-client items and run totals; ``survivors`` (``bool [rounds, m]``) and
    ``local_steps`` (``[rounds, m]``, steps each client did) count only what was sent."""
    totals = self.per_round()
    total_up, total_down = totals["up"] * rounds, totals["down"] * rounds
    if survivors is not None:
      alive = np.asarray(survivors, bool)
      steps = np.where(alive, np.asarray(local_steps), 0)
      per_step = sum(self.per_step_up.values())
      per_round = sum(self.up.values()) - self.local_steps * per_step
      total_up = int(alive.sum()) * per_round + int(steps.sum()) * per_step
      total_down = alive.size * sum(self.down.values())
    return {"up_per_client_per_round": dict(self.up),
            "down_per_client_per_round": dict(self.down),
            "clients_per_round": self.clients_per_round,
            "rounds": rounds,
            "total_up": int(total_up),
            "total_down": int(total_down)}


def draw_batch(key, index_row, count, examples, batch_size: Optional[int], *,
               return_rows: bool = False):
  """One client's batch: rows gathered by index, and their weights (summing to 1).

  ``batch_size=None`` takes the client's whole data (deterministic; padding rows weigh 0).
  Otherwise ``batch_size`` positions are drawn uniformly with replacement from the client's
  ``count`` examples. ``return_rows=True`` also returns the drawn rows of ``examples``
  (``int32 [b]``), the examples' global ids (primal-dual DRO keeps one weight per row).
  """
  if batch_size is None:
    rows = index_row
    weights = (jnp.arange(index_row.shape[0]) < count).astype(_float()) / count
  else:
    pos = jax.random.randint(key, (batch_size,), 0, count)
    rows = index_row[pos]
    weights = jnp.full((batch_size,), 1.0 / batch_size, _float())
  batch = jax.tree.map(lambda a: a[rows], examples)
  return (batch, weights, rows) if return_rows else (batch, weights)


def oracle_args(problem: Problem, inner_batch, outer_batch, next_inner_batch=None,
                weights=(None, None, None)):
  """The keyword arguments an algorithm's ``update`` takes, bound to the given batches.

  Returns ``(grad_h_fn, kwargs)``: ``grad_h_fn(params)`` is ``grad h(x; outer_batch)`` (or
  ``None`` without an extra term), and ``kwargs`` holds ``inner_fn``, ``outer_fn`` and
  ``next_inner_fn`` for compositional problems and, when there is an extra term,
  ``extra_fn`` (the value of ``h``), ``example_losses_fn`` (``x -> [b]``, the per-example
  values ``h(x; xi_i)`` of the outer batch, for sample-reweighting baselines such as
  FastDRO) and ``example_weights`` (``[b]``, the outer batch's weights; 0 on padding).
  Weights default to uniform means.
  """

  def _w(batch, w):
    if w is not None:
      return w
    n = jax.tree.leaves(batch)[0].shape[0]
    return jnp.full((n,), 1.0 / n, _float())

  next_inner_batch = inner_batch if next_inner_batch is None else next_inner_batch
  wg, wf, wn = (_w(b, w) for b, w in zip((inner_batch, outer_batch, next_inner_batch), weights))
  kwargs = {}
  if problem.compositional:
    kwargs = dict(
        inner_fn=lambda x: problem.inner_value(x, inner_batch, wg),
        outer_fn=lambda y: problem.outer_value(y, outer_batch, wf),
        next_inner_fn=lambda x: problem.inner_value(x, next_inner_batch, wn))
  grad_h = None
  if problem.extra is not None:
    grad_h = lambda x: problem.extra_grad(x, outer_batch, wf)
    kwargs["extra_fn"] = lambda x: problem.extra_value(x, outer_batch, wf)
    kwargs["example_losses_fn"] = lambda x: jax.vmap(problem.extra, in_axes=(None, 0))(
        x, outer_batch)
    kwargs["example_weights"] = wf
  return grad_h, kwargs


def _float():
  """The run's float type for weights: float64 under ``jax_enable_x64``, else float32 (a mean
  over float32 values casts the weights down; float64 runs keep every digit)."""
  return jnp.result_type(float)


def _tree_size(tree) -> int:
  return int(sum(np.prod(np.shape(leaf)) for leaf in jax.tree.leaves(tree)))


def _mean(tree, w):
  return jax.tree.map(lambda a: jnp.tensordot(w.astype(a.dtype), a, axes=1), tree)


def _broadcast(tree, m):
  return jax.tree.map(lambda a: jnp.broadcast_to(a, (m,) + jnp.shape(a)), tree)


class NonFiniteError(FloatingPointError):
  """A run produced a non-finite value.

  Attributes:
    round: the first evaluated round with a non-finite metric (or the chunk's last round).
    metrics: host metrics of every round up to and including the failing chunk.
  """

  def __init__(self, message, round_, metrics):
    super().__init__(message)
    self.round, self.metrics = round_, metrics


@dataclasses.dataclass
class SimulationResult:
  """What :func:`simulate` returns.

  Attributes:
    params: the server model after the last round.
    random_params: the server model of a uniformly random round.
    state: the final :class:`SimState` (resume with ``Simulator.run``).
    metrics: per-round host arrays: ``objective``, ``client_losses`` ``[R, K]``,
      ``grad_norm`` (if asked), user metrics, ``evaluated`` (which rounds were evaluated;
      the others hold NaN) and ``clients`` (sampled ids ``[R, m]``).
    ledger: communication per client per round and in total.
    seconds: wall time of the rounds (compilation included).
  """
  params: PyTree
  random_params: PyTree
  state: SimState
  metrics: Dict[str, np.ndarray]
  ledger: Dict[str, Any]
  seconds: float


class Simulator:
  """Runs an algorithm on a problem over federated data, a chunk of rounds per jit call.

  Args:
    problem: the :class:`~fedco.problems.Problem`.
    algorithm: the :class:`~fedco.algorithms.Algorithm`.
    data: the :class:`~fedco.data.FederatedData`.
    clients_per_round: ``m`` clients sampled without replacement each round; ``None``
      means all ``K``.
    batch_size: examples per inner (and next-inner) batch per step; ``None`` is each
      client's whole data (deterministic).
    outer_batch_size: examples per outer / extra batch (``b1``); defaults to ``batch_size``.
    paired_batches: the outer (and extra) batch of a step is its inner batch, the same rows,
      instead of an independent draw (needs ``outer_batch_size == batch_size``). For
      problems whose outer data must belong to the inner sample, e.g. MAML over episodes of
      random tasks (E4, :mod:`fedco.data.omniglot`): an episode's query sets score the
      parameters adapted on its own support sets. The next-inner batch stays independent.
    evaluate: compute the exact objective and per-client losses.
    exact_grad_norm: also the norm of the exact gradient of the objective (small problems).
    metrics_fn: ``params -> dict of scalars/arrays``, evaluated on the server model.
    mesh: a ``jax.sharding.Mesh`` with a ``"clients"`` axis (see :func:`client_mesh`); each
      round's clients are laid along it (``vmap`` with ``spmd_axis_name`` plus sharding
      constraints). A round's client count that the axis does not divide is padded with
      masked clients that neither train nor count. ``None``: one device. With a
      :class:`~fedco.runtime.distributed.ClientBlockData` (multi-process data from
      :func:`fedco.runtime.distributed.global_data`) the examples stay sharded where they are
      and every round has one slot per client block: each client trains on the device
      holding its data, and unsampled clients are masked instead of moved.
    participation: the probability that each of a round's clients survives the round
      (client dropout); a dropped client neither trains nor counts in any average, and a
      round whose clients all drop leaves the server as it was.
    straggler_prob: the probability that a surviving client is a straggler this round and
      does only a uniform number of local steps in ``{1, ..., I - 1}``; a straggler counts
      in the averages with the work it did.
    eval_every: evaluate (objective and ``metrics_fn``) after every ``eval_every``-th round
      and after round 1; other rounds skip the work (``lax.cond``) and hold NaN, and
      ``metrics["evaluated"]`` marks the evaluated rounds.
  """

  def __init__(self, problem: Problem, algorithm: Algorithm, data: FederatedData, *,
               clients_per_round: Optional[int] = None, batch_size: Optional[int] = 32,
               outer_batch_size: Optional[int] = -1, paired_batches: bool = False,
               evaluate: bool = True,
               exact_grad_norm: bool = False,
               metrics_fn: Optional[Callable[[PyTree], Dict[str, Any]]] = None,
               eval_every: int = 1, mesh: Optional[jax.sharding.Mesh] = None,
               participation: float = 1.0, straggler_prob: float = 0.0):
    if not isinstance(problem, Problem):
      raise ValueError(f"problem must be a fedco Problem, got {type(problem).__name__}")
    if not isinstance(algorithm, Algorithm):
      hint = ""
      if isinstance(algorithm, optax.GradientTransformation):
        hint = ("; optax.chain and optax.inject_hyperparams drop the communication plan: use "
                "fedco.chain / fedco.inject_hyperparams, which keep it")
      raise ValueError(f"algorithm must be a fedco Algorithm, got "
                       f"{type(algorithm).__name__}{hint}")
    if not isinstance(data, FederatedData):
      raise ValueError(f"data must be a fedco FederatedData, got {type(data).__name__}")
    _check_kinds(problem, algorithm)
    n = data.num_clients
    m = n if clients_per_round is None else clients_per_round
    if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= n:
      raise ValueError(f"clients_per_round must be an integer in [1, {n}] (the number of "
                       f"clients), got {clients_per_round!r}")
    if batch_size is not None:
      _validate.positive_int("batch_size", batch_size)
    if outer_batch_size == -1:
      outer_batch_size = batch_size
    if outer_batch_size is not None:
      _validate.positive_int("outer_batch_size", outer_batch_size)
    self.problem, self.algorithm = problem, algorithm
    self.num_clients, self.clients_per_round = n, m
    if not isinstance(paired_batches, bool):
      raise ValueError(f"paired_batches must be a bool, got {paired_batches!r}")
    if paired_batches and outer_batch_size != batch_size:
      raise ValueError(f"paired_batches=True draws the outer batch as the inner one, so "
                       f"outer_batch_size must equal batch_size={batch_size!r}, got "
                       f"{outer_batch_size!r}")
    self.paired_batches = paired_batches
    self.batch_size, self.outer_batch_size = batch_size, outer_batch_size
    self.evaluate, self.exact_grad_norm, self.metrics_fn = evaluate, exact_grad_norm, metrics_fn
    self.eval_every = _validate.positive_int("eval_every", eval_every)
    self.data = data
    if mesh is not None and (not isinstance(mesh, jax.sharding.Mesh)
                             or CLIENTS not in mesh.axis_names):
      raise ValueError(f"mesh must be a jax.sharding.Mesh with a {CLIENTS!r} axis (see "
                       f"fedco.runtime.client_mesh), got {mesh!r}")
    self.mesh = mesh
    # Client-block data (fedco.runtime.distributed) is resident: slot i is client i's block.
    self.resident = isinstance(data, ClientBlockData)
    if self.resident and mesh is not None and data.num_blocks % mesh.shape[CLIENTS]:
      raise ValueError(f"data has {data.num_blocks} client blocks, not a multiple of the "
                       f"mesh's {mesh.shape[CLIENTS]} {CLIENTS!r} positions; build it with "
                       "fedco.runtime.distributed.global_data on the same mesh")
    if self.resident and mesh is not None and any(
        isinstance(getattr(leaf, "sharding", None), jax.sharding.NamedSharding)
        and leaf.sharding.mesh != mesh for leaf in jax.tree.leaves(data.examples)):
      raise ValueError("data's examples are laid out on another mesh than mesh=; build them "
                       "with fedco.runtime.distributed.global_data on the same mesh")
    if mesh is not None:
      self._replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
      if not self.resident:  # placed once, so every run sees the same input shardings
        self.data = jax.device_put(data, self._replicated)
    _validate.open_unit("participation", participation, closed_right=True)
    if not (isinstance(straggler_prob, (int, float)) and 0 <= straggler_prob < 1):
      raise ValueError(f"straggler_prob must be a number in [0, 1), got {straggler_prob!r}")
    self.participation, self.straggler_prob = participation, straggler_prob
    self.faults = participation < 1 or straggler_prob > 0
    self.plan = algorithm.plan
    self.aggregator = as_aggregator(algorithm.server)
    self._run = jax.jit(self._run_rounds, static_argnames="rounds")
    self._init_jit = jax.jit(self._init_clients)

  # ---- pieces ------------------------------------------------------------------------

  def _client_weights(self, counts, mask=None):
    """Averaging weights (sum 1): uniform or by data size; masked slots weigh 0."""
    mask = jnp.ones(counts.shape, bool) if mask is None else mask
    c = counts.astype(_float()) if self.plan.weighting == "samples" else jnp.ones(
        counts.shape, _float())
    c = jnp.where(mask, c, 0.0)
    total = jnp.sum(c)
    return jnp.where(total > 0, c / jnp.where(total > 0, total, 1.0), 0.0)

  def _client_step(self, examples, round_key, local_step, params, cstate, key, index_row,
                   count, row_offset=None):
    kg, kf, kn = jax.random.split(key, 3)
    if self.paired_batches:  # same key and size: the outer batch is the inner batch's rows
      kf = kg
    bg, wg = draw_batch(kg, index_row, count, examples, self.batch_size)
    bf, wf, rows = draw_batch(kf, index_row, count, examples, self.outer_batch_size,
                              return_rows=True)
    bn, wn = draw_batch(kn, index_row, count, examples, self.batch_size)
    grad_h_fn, kwargs = oracle_args(self.problem, bg, bf, bn, (wg, wf, wn))
    grad_h = None if grad_h_fn is None else grad_h_fn(params)
    if row_offset is not None:  # resident: block-local rows -> compact example ids
      rows = rows + row_offset
    return self.algorithm.update(grad_h, cstate, params, round_key=round_key,
                                 local_step=local_step, example_rows=rows, **kwargs)

  def init(self, params: PyTree, seed=0) -> SimState:
    """Every client's state from ``params`` and one mini-batch ``g_k(x_0)``; then the plan's
    init fields are averaged so all clients start from the same ``(x_bar_0, y_bar_0)``."""
    if isinstance(seed, (bool, float, str)) or seed is None:
      raise ValueError(f"seed must be an int or a PRNG key, got {seed!r}")
    key = jax.random.PRNGKey(seed) if isinstance(seed, (int, np.integer)) else seed
    params = jax.tree.map(jnp.asarray, params)
    _check_dtypes(params, self.data.examples)
    self._check_shapes(params)
    if self.mesh is not None:
      params, key = jax.device_put((params, key), self._replicated)
    return self._init(params, key, self.data)

  def _check_shapes(self, params):
    """Trace the problem on one example so shape mismatches surface as a clear ValueError."""
    # Shapes only: indexing a multi-process array on the host would move a row.
    example = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a)[1:], jnp.result_type(a)),
                           self.data.examples)
    problem = self.problem

    def trace():
      if problem.extra is not None:
        _scalar("extra", jax.eval_shape(problem.extra, params, example))
      if problem.compositional:
        y = jax.eval_shape(problem.inner, params, example)
        if problem.outer_uses_data:
          _scalar("outer", jax.eval_shape(problem.outer, y, example))
        else:
          _scalar("outer", jax.eval_shape(problem.outer, y))

    try:
      trace()
    except (TypeError, ValueError, IndexError, KeyError) as err:
      shapes = lambda t: jax.tree.map(lambda a: tuple(np.shape(a)), t)
      raise ValueError(
          f"params and data do not fit problem {problem.name!r}: params shapes "
          f"{shapes(params)}, one example's shapes {shapes(example)}; evaluating the problem "
          f"on them failed with {type(err).__name__}: {str(err).splitlines()[0]}") from None

  def _init(self, params, key, data):
    """Every client's initial state (traced; ``init`` runs it through a per-instance jit,
    never a global cache keyed on ``self``, so a dropped simulator is collected)."""
    return self._init_jit(params, key, data)

  def _init_clients(self, params, key, data):
    key, k_init = jax.random.split(key)
    n = self.num_clients
    ids = jnp.arange(n)

    def client_init(k, index_row, count, examples):
      inner_value = None
      if self.problem.compositional:
        batch, w = draw_batch(jax.random.fold_in(k_init, k), index_row, count, examples,
                              self.batch_size)
        inner_value = self.problem.inner_value(params, batch, w)
      return init_trackers(self.algorithm.init(params), params, inner_value)

    if self.resident:  # each block initialises where it lives; padding blocks are cut off
      _, examples, index, counts, _ = self._blocks(data)
      clients = self._vmap(client_init)(jnp.arange(counts.shape[0]), index, counts, examples)
      clients = jax.tree.map(lambda a: a[:n], clients)
    else:
      clients = jax.vmap(client_init, in_axes=(0, 0, 0, None))(ids, data.index, data.counts,
                                                              data.examples)
    w = self._client_weights(data.counts)
    means = {f: _mean(get_field(clients, f), w) for f in self.plan.init_fields}
    clients = set_fields(clients, **{f: _broadcast(v, n) for f, v in means.items()})
    server = {"params": params}
    for f in self.plan.every_round:
      server[f] = _mean(get_field(clients, f), w)
    shared = {f: _mean(get_field(clients, f), w) for f in self.plan.every_step}
    return SimState(jnp.zeros([], jnp.int32), key, server,
                    self.aggregator.init(server, data.counts), shared, clients, params)

  def _sample(self, key):
    n, m = self.num_clients, self.clients_per_round
    if m == n:
      return jnp.arange(n)
    return jnp.sort(jax.random.permutation(key, n)[:m])

  def _client_losses(self, data, params, ids, key):
    """Each listed client's loss of ``params`` on one fresh mini-batch (server queries)."""

    def one(k, index_row, count, examples):
      batch, weights = draw_batch(jax.random.fold_in(key, k), index_row, count, examples,
                                  self.outer_batch_size)
      return self.problem.client_objective(params, batch, weights)

    if self.resident:  # every block answers on its own device, then the listed ones are kept
      _, examples, index, counts, _ = self._blocks(data)
      losses = self._vmap(one)(jnp.arange(counts.shape[0]), index, counts, examples)
      return jnp.take(losses, ids, axis=0, mode="clip")
    return jax.vmap(lambda k: one(k, data.index[k], data.counts[k], data.examples))(ids)

  def _vmap(self, fn):
    """``vmap`` over client slots, laid along the mesh's clients axis when there is one."""
    return jax.vmap(fn, spmd_axis_name=None if self.mesh is None else CLIENTS)

  def _blocks(self, data):
    """Resident layout, one slot per block: ``(ids, examples, index, counts, offsets)``.

    ``ids`` are the slots' clients (``K`` on padding blocks), ``examples`` the blocks
    ``[B, max_n, ...]`` (a reshape of the sharded rows: no data moves), ``index`` block-local
    rows (a padding block reads its own rows with client ``K - 1``'s pattern and weight 0),
    ``counts``, and ``offsets`` the id of each client's first example in the compact
    numbering (clients' examples in order, no padding: ``sum(counts[:k])``), so the
    ``example_rows`` an algorithm sees are the ones a one-process ``FederatedData`` of the
    same clients gives (primal-dual DRO keeps a weight per id).
    """
    n, rows, b = self.num_clients, data.max_count, data.num_blocks
    ids = jnp.minimum(jnp.arange(b), n)
    real = jnp.minimum(ids, n - 1)
    examples = jax.tree.map(lambda a: a.reshape((b, rows) + a.shape[1:]), data.examples)
    index = jnp.take(data.index, real, axis=0) - (real * rows)[:, None]
    counts = jnp.take(data.counts, real)
    starts = jnp.cumsum(data.counts.astype(jnp.int32)) - data.counts.astype(jnp.int32)
    offsets = jnp.take(starts, real)
    return (ids,) + self._place((examples, index, counts, offsets))

  def _refresh_inner(self, data, cst, params, ckeys, index, counts, w, blocks=None):
    """``round_start`` fields = mean over the round's clients of ``g_k(x_bar)``."""
    keys = jax.vmap(jax.random.fold_in, (0, None))(ckeys, self.plan.local_steps)

    def inner_at_server(key, index_row, count, examples):
      batch, weights = draw_batch(key, index_row, count, examples, self.batch_size)
      return self.problem.inner_value(params, batch, weights)

    if blocks is None:
      values = jax.vmap(inner_at_server, in_axes=(0, 0, 0, None))(keys, index, counts,
                                                                   data.examples)
    else:  # resident: each slot reads its own block
      values = self._vmap(inner_at_server)(keys, index, counts, blocks)
    mean = _mean(values, w)
    slots = ckeys.shape[0]
    return set_fields(cst, **{f: _broadcast(mean, slots) for f in self.plan.round_start})

  def _slots(self):
    """Client slots per round: ``m`` rounded up to a multiple of the mesh's clients axis."""
    m = self.clients_per_round
    if self.resident:  # one slot per client block, sampled or not
      return self.data.num_blocks
    if self.mesh is None:
      return m
    d = self.mesh.shape[CLIENTS]
    return -(-m // d) * d

  def _place(self, tree):
    """Lay the leading (client-slot) axis of every leaf along the mesh's clients axis."""
    if self.mesh is None:
      return tree
    sharding = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec(CLIENTS))
    return jax.tree.map(lambda a: jax.lax.with_sharding_constraint(a, sharding), tree)

  def _round(self, data, flat_examples, state: SimState, _):
    plan, m, n = self.plan, self.clients_per_round, self.num_clients
    slots = self._slots()
    key, k_sample, k_round, k_res, k_agg = jax.random.split(state.key, 5)
    real = self._sample(k_sample)
    pick = lambda a: a[:m]  # the sampled clients' slots
    if self.resident:
      # Slot i is client i, on the device holding its data; padding blocks carry id n.
      # Unsampled clients are masked like padding (weight 0, writes dropped), not moved.
      ids = jnp.minimum(jnp.arange(slots), n)
      mask = ids < n if m == n else jnp.zeros((slots,), bool).at[real].set(True)
      if m < n:
        pick = lambda a: jnp.take(a, real, axis=0)
    else:
      # Padding slots carry the out-of-range id n: they gather a clipped (real) client's
      # data, weigh 0 in every average, are hidden from the aggregator and their writes are
      # dropped.
      ids = jnp.concatenate([real, jnp.full((slots - m,), n, real.dtype)])
      mask = jnp.arange(slots) < m
    direct = slots == n and m == n
    take = lambda a: a if direct else jnp.take(a, ids, axis=0, mode="clip")
    cst = jax.tree.map(take, state.clients)
    cst = set_fields(cst, **{f: _broadcast(state.server[f], slots) for f in plan.every_round},
                       **{f: _broadcast(state.shared[f], slots) for f in plan.every_step})
    params = _broadcast(state.server["params"], slots)
    index, counts = take(data.index), take(data.counts)
    examples, blocks, extra = data.examples, None, ()
    if self.resident:
      _, blocks, index, counts, offsets = self._blocks(data)
      examples, extra = blocks, (offsets,)
    alive, steps = self._faults(k_sample, ids, mask)
    w = self._client_weights(counts, alive)
    ckeys = jax.vmap(jax.random.fold_in, (None, 0))(k_round, ids)
    if plan.round_start:
      cst = self._refresh_inner(data, cst, state.server["params"], ckeys, index, counts, w,
                                blocks)
    if plan.round_start_loss:
      _, losses = self.problem.evaluate(state.server["params"], flat_examples, data.flat_owner,
                                        data.flat_weights(), n)
      cst = set_fields(cst, **{f: jnp.take(losses, ids, mode="clip")
                            for f in plan.round_start_loss})
    params, cst, index, counts, ckeys = self._place((params, cst, index, counts, ckeys))
    step_fn = jax.vmap(self._client_step,
                       in_axes=(None if blocks is None else 0, None, None, 0, 0, 0, 0, 0)
                       + (0,) * len(extra),
                       spmd_axis_name=None if self.mesh is None else CLIENTS)

    def local_step(carry, t):
      params, cst = carry
      skeys = jax.vmap(jax.random.fold_in, (0, None))(ckeys, t)
      updates, new_cst = step_fn(examples, k_round, t, params, cst, skeys, index, counts,
                                 *extra)
      new_params = optax.apply_updates(params, updates)
      if self.faults:  # dropped clients and finished stragglers keep what they had
        active = alive & (t < steps)
        keep = lambda new, old: jnp.where(
            active.reshape(active.shape + (1,) * (new.ndim - 1)), new, old)
        new_params = jax.tree.map(keep, new_params, params)
        new_cst = jax.tree.map(keep, new_cst, cst)
      params, cst = new_params, new_cst
      if plan.every_step:
        cst = set_fields(cst, **{f: _broadcast(_mean(get_field(cst, f), w), slots)
                              for f in plan.every_step})
      return self._place((params, cst)), None

    (params, cst), _ = jax.lax.scan(local_step, (params, cst), jnp.arange(plan.local_steps))
    shared = {f: _mean(get_field(cst, f), w) for f in plan.every_step}
    client_values = jax.tree.map(pick, {
        "params": params, **{f: get_field(cst, f) for f in plan.every_round + plan.report}})
    info = RoundInfo(real, pick(w), pick(counts), n, k_agg,
                     functools.partial(self._client_losses, data), pick(alive))
    server, server_opt_state = self.aggregator.update(
        state.server, state.server_opt_state, client_values, info)
    if self.faults:  # a round nobody survived changes nothing on the server
      anyone = jnp.any(alive)
      server, server_opt_state, shared = jax.tree.map(
          lambda new, old: jnp.where(anyone, new, old), (server, server_opt_state, shared),
          (state.server, state.server_opt_state, state.shared))
    cst = set_fields(cst, **{f: _broadcast(server[f], slots) for f in plan.every_round})
    write = jnp.where(mask, ids, n)  # padding and unsampled (resident) slots are dropped
    clients = cst if direct else jax.tree.map(
        lambda a, b: a.at[write].set(b, mode="drop"), state.clients, cst)
    completed = state.round + 1
    keep = jax.random.uniform(k_res) * completed.astype(jnp.float32) < 1.0
    random_params = jax.tree.map(lambda a, b: jnp.where(keep, a, b), server["params"],
                                 state.random_params)
    new_state = SimState(completed, key, server, server_opt_state, shared, clients,
                         random_params)
    metrics = self._maybe_metrics(completed, server["params"], data, flat_examples)
    metrics["clients"] = real
    if self.faults:
      metrics["survivors"] = pick(alive)
      metrics["local_steps"] = pick(jnp.where(alive, steps, 0))
    return new_state, metrics

  def _faults(self, key, ids, mask):
    """Which slots survive the round, and how many local steps each does."""
    steps_all = jnp.full(ids.shape, self.plan.local_steps, jnp.int32)
    if not self.faults:
      return mask, steps_all
    per_client = jax.vmap(jax.random.fold_in, (None, 0))

    def draw(k):
      k_drop, k_strag, k_steps = jax.random.split(k, 3)
      survives = jax.random.bernoulli(k_drop, self.participation)
      straggles = jax.random.bernoulli(k_strag, self.straggler_prob)
      few = jax.random.randint(k_steps, (), 1, max(self.plan.local_steps, 2))
      return survives, jnp.where(straggles & (self.plan.local_steps > 1), few,
                                 self.plan.local_steps)

    survives, steps = jax.vmap(draw)(per_client(jax.random.fold_in(key, 1), ids))
    return mask & survives, steps.astype(jnp.int32)

  def _maybe_metrics(self, completed, params, data, flat_examples):
    """Metrics after round ``completed``, or NaN placeholders on rounds that skip them."""
    compute = lambda p: self._metrics(p, data, flat_examples)
    if self.eval_every == 1:
      out = compute(params)
      return {**out, "evaluated": jnp.ones([], bool)} if out else {}
    shapes = jax.eval_shape(compute, params)
    if not shapes:
      return {}
    skip = lambda p: jax.tree.map(lambda s: jnp.full(s.shape, jnp.nan, s.dtype)
                                  if jnp.issubdtype(s.dtype, jnp.inexact)
                                  else jnp.zeros(s.shape, s.dtype), shapes)
    due = (completed == 1) | (completed % self.eval_every == 0)
    out = jax.lax.cond(due, compute, skip, params)
    return {**out, "evaluated": due}

  def _metrics(self, params, data, flat_examples):
    out = {}
    if self.evaluate:
      weights = data.flat_weights()

      def objective(p):
        return self.problem.evaluate(p, flat_examples, data.flat_owner, weights,
                                     self.num_clients)

      if self.exact_grad_norm:
        (obj, losses), grad = jax.value_and_grad(objective, has_aux=True)(params)
        out["grad_norm"] = optax.global_norm(grad)
      else:
        obj, losses = objective(params)
      out["objective"], out["client_losses"] = obj, losses
    if self.metrics_fn is not None:
      out.update(self.metrics_fn(params))
    return out

  def _run_rounds(self, state, data, rounds: int):
    # Client-block data's flat list is every row in order: no gather (it would move rows).
    flat_examples = data.examples if self.resident else jax.tree.map(
        lambda a: a[data.flat_rows], data.examples)
    return jax.lax.scan(lambda s, x: self._round(data, flat_examples, s, x), state, None,
                        length=rounds)

  # ---- public ------------------------------------------------------------------------

  def run(self, state: SimState, rounds: int):
    """Advance ``rounds`` rounds in one jitted program; returns ``(state, metrics)``."""
    _validate.positive_int("rounds", rounds)
    if self.mesh is not None:  # same input shardings every call: no second compilation
      state = jax.device_put(state, self._replicated)
    return self._run(state, self.data, rounds=rounds)

  def ledger(self, state: SimState) -> Ledger:
    """Floats per participating client per round, split by what was sent."""
    n, steps = self.num_clients, self.plan.local_steps
    d = _tree_size(state.server["params"])
    up = {"params": d}
    for f in self.plan.every_round:
      up[f] = _tree_size(get_field(state.clients, f)) // n
    for f in self.plan.every_step:
      up[f] = steps * (_tree_size(get_field(state.clients, f)) // n)
    for f in self.plan.round_start:
      up[f] = up.get(f, 0) + _tree_size(get_field(state.clients, f)) // n
    down = dict(up)
    for f in self.plan.report:  # sent up only
      up[f] = up.get(f, 0) + _tree_size(get_field(state.clients, f)) // n
    per_step = {f: _tree_size(get_field(state.clients, f)) // n for f in self.plan.every_step}
    return Ledger(up, down, self.clients_per_round, per_step, steps)


def _scalar(name, shape_dtype):
  if tuple(shape_dtype.shape) != ():
    raise ValueError(f"the problem's {name} function must return a scalar, got shape "
                     f"{tuple(shape_dtype.shape)}")


_LOW_PRECISION = (jnp.float16, jnp.bfloat16)


def _check_dtypes(params, examples):
  """fedco computes in float32 (or float64): refuse half precision clearly."""
  for what, tree in (("params", params), ("data.examples", examples)):
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
      if jnp.asarray(leaf).dtype in _LOW_PRECISION:
        raise ValueError(
            f"{what}{jax.tree_util.keystr(path)} has dtype {jnp.asarray(leaf).dtype}; fedco's "
            "trackers and averages need float32 or float64. Cast first, e.g. "
            "jax.tree.map(lambda a: a.astype(jnp.float32), tree)")


def _check_kinds(problem: Problem, algorithm: Algorithm):
  kind = algorithm.problem_kind
  if kind == "plain":
    if problem.extra is None:
      raise ValueError(f"{algorithm.name} trains on the extra (non-compositional) term, but "
                       f"problem {problem.name!r} has none; use fedco.problems.plain(loss)")
    return
  if not problem.compositional:
    raise ValueError(f"{algorithm.name} needs a compositional problem (inner and outer), got "
                     f"the plain problem {problem.name!r}")
  if problem.kind != kind:
    raise ValueError(f"{algorithm.name} solves {kind}-inner problems, but problem "
                     f"{problem.name!r} is {problem.kind}-inner")


def simulate(problem: Problem, algorithm: Algorithm, data: FederatedData, params: PyTree, *,
             rounds: int, seed=0, chunk_rounds: Optional[int] = None, progress: bool = False,
             check_finite: bool = True, checkpoint_dir=None,
             checkpoint_every: Optional[int] = None, keep_checkpoints: int = 3,
             progress_metric: str = "objective", metric_writers=(),
             metric_labels: Optional[Dict[str, Any]] = None,
             **simulator_kwargs) -> SimulationResult:
  """Run ``rounds`` rounds and collect the per-round metrics on the host.

  Rounds run in chunks of ``chunk_rounds`` (default: all of them, at most 100); each chunk is
  one jitted ``lax.scan``, and the host logs, checks and checkpoints between chunks.

  Args:
    problem, algorithm, data: see :class:`Simulator`.
    params: the initial model ``x_bar_0``.
    rounds: number of rounds ``>= 1``.
    seed: an int or a PRNG key.
    chunk_rounds: rounds per jitted call.
    progress: print a progress line with rounds per second and ``progress_metric``.
    progress_metric: the scalar metric the progress line shows (``"objective"`` or one of
      ``metrics_fn``'s).
    check_finite: stop with :class:`NonFiniteError` (a ``FloatingPointError``) naming the
      first evaluated round whose metrics, or the server model, stop being finite; it
      carries the metrics collected so far. With checkpointing, the last good state (the
      start of the failing chunk) is saved first.
    checkpoint_dir: save the whole simulation state and the metrics so far there (see
      :mod:`fedco.checkpoint`); if it already holds a checkpoint, the run resumes from the
      newest one and ends bit-identical to an uninterrupted run.
    checkpoint_every: rounds between checkpoints (default: every chunk).
    keep_checkpoints: how many checkpoints to keep.
    metric_writers: :class:`fedco.runtime.host.MetricWriter` s (``JsonlWriter``,
      ``CsvWriter``, ``TensorBoardWriter``) that receive every chunk's evaluated rows as
      soon as the chunk is done; a resumed run first rewinds them to its checkpoint.
    metric_labels: fields added to every written row (default
      ``{"algorithm": algorithm.name}``).
    **simulator_kwargs: forwarded to :class:`Simulator`.

  Ctrl-C is deferred to the end of the running chunk: the chunk's rows are written, a
  checkpoint is saved (when checkpointing) and :class:`~fedco.runtime.host.Interrupted`
  (a ``KeyboardInterrupt``) says up to which round; a second Ctrl-C stops at once.
  """
  rounds = _validate.positive_int("rounds", rounds)
  chunk = min(rounds, 100) if chunk_rounds is None else _validate.positive_int(
      "chunk_rounds", chunk_rounds)
  sim = Simulator(problem, algorithm, data, **simulator_kwargs)
  state = sim.init(params, seed)
  collected, done, ckpt = [], 0, None
  if checkpoint_dir is not None:
    from fedco import checkpoint as checkpoint_lib  # orbax loads only when asked for
    every = chunk if checkpoint_every is None else _validate.positive_int(
        "checkpoint_every", checkpoint_every)
    ckpt = checkpoint_lib.Checkpointer(checkpoint_dir, keep=keep_checkpoints)
    if ckpt.latest_round() is not None:
      done, state, history = ckpt.restore(state)
      if done > rounds:
        raise ValueError(f"{checkpoint_dir} holds round {done}, past rounds={rounds}; use "
                         "another checkpoint_dir or more rounds")
      collected = [history] if history else []
  writers = tuple(metric_writers)
  labels = {"algorithm": algorithm.name} if metric_labels is None else dict(metric_labels)
  for writer in writers:
    writer.rewind(done, labels)
  bar = host.ProgressBar(rounds, label=algorithm.name, enabled=progress, initial=done)
  start = time.perf_counter()
  try:
    with host.interrupt_guard() as stop:
      while done < rounds:
        size = min(chunk, rounds - done)
        if ckpt is not None:
          size = min(size, every - done % every)
        last_good = state
        state, metrics = sim.run(state, size)
        metrics = fetch(metrics)  # jax.device_get, or a gather of multi-process arrays
        collected.append(metrics)
        if check_finite:
          try:
            _check_finite(metrics, state, done)
          except NonFiniteError as err:
            if ckpt is not None and collected[:-1]:
              ckpt.save(done, last_good, _stack(collected[:-1]))
            err.metrics = _stack(collected)
            for writer in writers:
              writer.write(host.rows(metrics, done, labels))
            raise
        for writer in writers:
          writer.write(host.rows(metrics, done, labels))
        done += size
        if ckpt is not None and (done % every == 0 or done == rounds or stop.requested):
          ckpt.save(done, state, _stack(collected))
        shown = None
        if progress_metric in metrics and np.any(metrics["evaluated"]):
          values = np.asarray(metrics[progress_metric])[np.asarray(metrics["evaluated"])]
          shown = float(values[-1]) if values.ndim == 1 else None
        bar.update(done, shown, progress_metric)
        if stop.requested and done < rounds:
          raise host.Interrupted(
              f"interrupted after round {done} of {rounds}: the metrics of rounds 1-{done}"
              + (" and a checkpoint are" if ckpt is not None else " are") + " written",
              done)
  finally:
    bar.close()
    host.close_all(writers)
    if ckpt is not None:
      ckpt.close()
  seconds = time.perf_counter() - start
  return SimulationResult(state.server["params"], state.random_params, state, _stack(collected),
                          _ledger(sim, state, collected, rounds), seconds)


def _ledger(sim, state, collected, rounds):
  """The run's ledger; with faults, totals count only what surviving clients sent."""
  ledger = sim.ledger(state)
  metrics = _stack(collected) if collected else {}
  if "survivors" not in metrics:
    return ledger.as_dict(rounds)
  return ledger.as_dict(rounds, metrics["survivors"], metrics["local_steps"])


def _stack(chunks):
  return {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}


def _check_finite(metrics, state, rounds_before):
  """Stop at the first evaluated round whose metrics (objective first) are not finite."""
  evaluated = np.asarray(metrics.get("evaluated", []), bool)
  names = sorted((k for k, v in metrics.items()
                  if k not in ("evaluated", "clients") and np.issubdtype(np.asarray(v).dtype,
                                                                      np.floating)),
                 key=lambda k: k != "objective")
  first = None
  for name in names:
    values = np.asarray(metrics[name]).reshape(evaluated.shape[0], -1)
    bad = np.flatnonzero(evaluated & ~np.all(np.isfinite(values), axis=1))
    if bad.size and (first is None or bad[0] < first[0]):
      first = (int(bad[0]), name, values[bad[0]])
  if first is not None:
    r = rounds_before + first[0] + 1
    values = first[2]
    if values.size == 1:
      what = f"{first[1]} is {values[0]}"
    else:  # a per-client metric: name the clients
      bad_clients = np.flatnonzero(~np.isfinite(values)).tolist()
      what = (f"{first[1]} is not finite for client(s) {bad_clients} "
              f"(values {values[bad_clients].tolist()})")
    raise NonFiniteError(
        f"round {r}: {what}; the last evaluated round before it was finite. "
        "Lower the learning rate or check the problem's exp/log terms.", r, None)
  leaves = jax.tree.leaves(fetch(state.server["params"]))
  if not all(bool(np.all(np.isfinite(np.asarray(l)))) for l in leaves):
    last = int(fetch(state.round))
    raise NonFiniteError(
        f"rounds {rounds_before + 1}-{last}: the server model has non-finite "
        "values", last, None)
