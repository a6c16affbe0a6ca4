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
from typing import Any, Callable, Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedco import _validate
from fedco import privacy as privacy_lib
from fedco.algorithms.base import Algorithm, get_field
from fedco.data.federated import FederatedData
from fedco.problems.base import Problem
from fedco.runtime import config
from fedco.runtime import rounds as rounds_lib
from fedco.runtime.ledger import Ledger, _tree_size
from fedco.runtime.mesh import CLIENTS, client_mesh, replicated
from fedco.runtime.rounds import SimState

PyTree = Any


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
    metrics_fn: ``params -> dict of scalars/arrays``, evaluated on the server model; with
      ``metrics_data``, ``(params, metrics_data) -> dict``.
    metrics_data: a pytree of arrays ``metrics_fn`` reads (held-out sets, say), passed into
      the compiled rounds as an argument: runs that differ only in it compile to one
      program (and a persistent compilation cache serves the others), where arrays a
      ``metrics_fn`` closes over are constants of each run's own program.
    mesh: a ``jax.sharding.Mesh`` with a ``"clients"`` axis (see :func:`client_mesh`); each
      round's clients are laid along it (``vmap`` with ``spmd_axis_name`` plus sharding
      constraints). A round's client count that the axis does not divide is padded with
      masked clients that neither train nor count. ``None``: one device. With a
      :class:`~fedco.data.blocks.ClientBlockData` (multi-process data from
      :func:`fedco.runtime.distributed.global_data`) the examples stay sharded where they are
      and every round has one slot per client block: each client trains on the device
      holding its data, and unsampled clients are masked instead of moved.
    participation: the probability that each of a round's clients survives the round
      (client dropout); a dropped client neither trains nor counts in any average, and a
      round whose clients all drop leaves the server as it was.
    straggler_prob: the probability that a surviving client is a straggler this round and
      does only a uniform number of local steps in ``{1, ..., I - 1}``; a straggler counts
      in the averages with the work it did.
    compression: ``{field: codec}`` (:mod:`fedco.compression`) for fields the plan sends
      (``"params"`` and its state fields): each client's upload of the field is its delta
      from the server's copy, encoded by the codec (state kept per client); the ledger
      counts the codec's bits. See :mod:`fedco.runtime.uplink`.
    privacy: a :func:`fedco.privacy.gaussian` mechanism: every sent field clipped per
      client and Gaussian noise added where the server combines them; :meth:`epsilon` is
      the epsilon spent (``fedco.simulate`` calibrates a target epsilon to its rounds and
      reports it per round as ``epsilon``).
    eval_every: evaluate (objective and ``metrics_fn``) after every ``eval_every``-th round,
      after round 1 and after the run's last round (:meth:`run`'s ``final_round``); other
      rounds skip the work (``lax.cond``) and hold NaN, and ``metrics["evaluated"]`` marks
      the evaluated rounds.
  """

  def __init__(
    self,
    problem: Problem,
    algorithm: Algorithm,
    data: FederatedData,
    *,
    clients_per_round: Optional[int] = None,
    batch_size: Optional[int] = 32,
    outer_batch_size: Optional[int] = -1,
    paired_batches: bool = False,
    evaluate: bool = True,
    exact_grad_norm: bool = False,
    metrics_fn: Optional[Callable[[PyTree], Dict[str, Any]]] = None,
    eval_every: int = 1,
    mesh: Optional[jax.sharding.Mesh] = None,
    participation: float = 1.0,
    straggler_prob: float = 0.0,
    compression=None,
    privacy=None,
    metrics_data=None,
  ):
    self.config = cfg = config.make_config(
      problem,
      algorithm,
      data,
      clients_per_round=clients_per_round,
      batch_size=batch_size,
      outer_batch_size=outer_batch_size,
      paired_batches=paired_batches,
      evaluate=evaluate,
      exact_grad_norm=exact_grad_norm,
      metrics_fn=metrics_fn,
      eval_every=eval_every,
      mesh=mesh,
      participation=participation,
      straggler_prob=straggler_prob,
      compression=compression,
      privacy=privacy,
    )
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

  def init(self, params: PyTree, seed=0) -> SimState:
    """Every client's state from ``params`` and one mini-batch ``g_k(x_0)``; then the plan's
    init fields are averaged so all clients start from the same ``(x_bar_0, y_bar_0)``."""
    if isinstance(seed, (bool, float, str)) or seed is None:
      raise ValueError(f"seed must be an int or a PRNG key, got {seed!r}")
    key = jax.random.PRNGKey(seed) if isinstance(seed, (int, np.integer)) else seed
    params = self._checked_params(params)
    if self.mesh is not None:
      params, key = jax.device_put((params, key), self._replicated)
    return self._init_jit(params, key, self.data)

  def _checked_params(self, params):
    """``params`` as arrays, refused when they do not fit the data and problem."""
    return config.check_params(params, self.data, self.problem)

  def run(self, state: SimState, rounds: int, *, final_round: Optional[int] = None):
    """Advance ``rounds`` rounds in one jitted program; returns ``(state, metrics)``.

    ``final_round`` is the run's last round, evaluated whatever ``eval_every`` says
    (default: this call's last round; :func:`fedco.simulate` passes its ``rounds``, so its
    chunks share one program)."""
    _validate.positive_int("rounds", rounds)
    if final_round is None:
      final_round = -1  # a traced sentinel: this call's last round (see run_rounds)
    final_round = _validate.positive_int("final_round", final_round, minimum=-1)
    if self.mesh is not None:  # same input shardings every call: no second compilation
      state = jax.device_put(state, self._replicated)
    return self._run(state, self.data, self.metrics_data, np.int32(final_round), rounds=rounds)

  def ledger(self, state: SimState) -> Ledger:
    """Floats and bytes per participating client per round, split by what was sent."""
    steps = self.plan.local_steps
    field = lambda f: (
      state.server["params"]
      if f == "params"
      else jax.tree.map(lambda a: a[0], get_field(state.clients, f))
    )
    size = lambda f: _tree_size(field(f))
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

    dtype = lambda f: jnp.result_type(*jax.tree.leaves(field(f)))
    itemsize = lambda f: np.dtype(dtype(f)).itemsize

    def message_bytes(f):  # one message of the field: the codec's bits, or its floats
      if f in codecs:
        return codecs[f].payload_bits(size(f), dtype(f)) / 8
      return size(f) * itemsize(f)

    up_bytes = {f: messages[f] * message_bytes(f) for f in up}
    down_bytes = {f: down[f] * itemsize(f) for f in down}
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
    """Epsilon spent after ``rounds`` rounds (int or sequence) under ``privacy``, else
    ``None``."""
    link = self.config.uplink
    return None if link is None else link.epsilon(rounds)


def _run_rounds(cfg, state, data, metrics_data, final_round, *, rounds):
  """``run_rounds`` with ``final_round`` traced; ``-1``: this call's last round."""
  final_round = jnp.where(final_round < 0, state.round + rounds, final_round)
  return rounds_lib.run_rounds(cfg, state, data, rounds, final_round, metrics_data)


__all__ = ["CLIENTS", "SimState", "Simulator", "client_mesh"]
