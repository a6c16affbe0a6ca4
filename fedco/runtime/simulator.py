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

import functools
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
from fedco.runtime.batching import _float, draw_batch, oracle_args
from fedco.runtime.checks import _check_dtypes, _check_kinds, _scalar
from fedco.runtime.distributed import ClientBlockData
from fedco.runtime.ledger import Ledger, _tree_size

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


def _mean(tree, w):
  return jax.tree.map(lambda a: jnp.tensordot(w.astype(a.dtype), a, axes=1), tree)


def _broadcast(tree, m):
  return jax.tree.map(lambda a: jnp.broadcast_to(a, (m,) + jnp.shape(a)), tree)


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
    params = self._checked_params(params)
    if self.mesh is not None:
      params, key = jax.device_put((params, key), self._replicated)
    return self._init(params, key, self.data)

  def _checked_params(self, params):
    """``params`` as arrays, refused (``ValueError``) when their dtypes or shapes do not fit
    the data and problem."""
    params = jax.tree.map(jnp.asarray, params)
    _check_dtypes(params, self.data.examples)
    self._check_shapes(params)
    return params

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

  def _flat_examples(self, data):
    """The examples of the flat ``(row, owner)`` list that evaluation reads. Client-block
    data's flat list is every row in order: no gather (it would move rows)."""
    return data.examples if self.resident else jax.tree.map(lambda a: a[data.flat_rows],
                                                            data.examples)

  def _run_rounds(self, state, data, rounds: int):
    flat_examples = self._flat_examples(data)
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
