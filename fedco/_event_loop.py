"""Per-client Python loops of the contract kit: a client's full-batch step and initial state
(shared with :func:`fedco.testing.loop_reference`), and FedBuff as an event-driven loop, the
reference the kit's ``asynchronous`` check compares ``fedco.simulate(...,
asynchronous=...)`` with (``fedco.testing.async_reference``; decision 112).

One report at a time from a heap of ``(arrival, position)``: a report is trained from the
model of the version its client was dispatched with (every version kept, no ring), its
change scaled by its staleness weight, discarded when too stale; when ``m`` reports are
buffered the server applies them and ``m`` clients not training are dispatched with the new
model. It shares with the runtime only its draws: the key schedule, the first clients
(:func:`fedco.runtime.sampling.sample_clients`), the replacements' scores and
:meth:`fedco.runtime.Delays.durations`.
"""

from __future__ import annotations

import heapq
from typing import Any, Dict, List

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedco.algorithms import base
from fedco.problems import Problem
from fedco.runtime import asynchrony, batching
from fedco.runtime import rounds as rounds_lib
from fedco.runtime.sampling import sample_clients

PyTree = Any


def full_batch_step(problem: Problem, algorithm: base.Algorithm):
  """``step(state, model, batch, weights, rows, round_key, k, t) -> (model, state)``: client
  ``k``'s local step ``t`` on its whole data, with the simulator's keys (jitted once, so a
  Python loop over clients and steps stays fast)."""

  @jax.jit
  def client_step(state, model, batch, weights, rows, round_key, k, t):
    grad_h_fn, kwargs = batching.oracle_args(problem, batch, batch, batch, (weights,) * 3)
    grads = None if grad_h_fn is None else grad_h_fn(model)
    step_key = jax.random.fold_in(jax.random.fold_in(round_key, k), t)  # the simulator's
    step, state = algorithm.update(
      grads,
      state,
      model,
      round_key=round_key,
      client_key=jax.random.fold_in(step_key, rounds_lib.CLIENT_STREAM),
      local_step=t,
      example_rows=rows,
      **kwargs,
    )
    return optax.apply_updates(model, step), state

  return client_step


def initial_state(problem, algorithm, params, batch, weights):
  """A client's initial state, its trackers of the inner value started on its whole data."""
  inner = problem.inner_value(params, batch, weights) if problem.compositional else None
  return base.init_trackers(algorithm.init(params), params, inner)


def async_reference(
  problem,
  algorithm: base.Algorithm,
  data,
  params: PyTree,
  *,
  rounds: int,
  clients_per_round: int,
  asynchronous: asynchrony.Buffered,
  delays: asynchrony.Delays,
  seed: int = 0,
) -> List[Dict[str, PyTree]]:
  """FedBuff's server values after each server step, one report at a time in Python.

  Buffered asynchronous aggregation over ``rounds`` server steps, as Python loops over
  clients and reports.

  What ``fedco.simulate(problem, algorithm, data, params, rounds=rounds, seed=seed,
  batch_size=None, clients_per_round=clients_per_round, asynchronous=asynchronous,
  delays=delays)`` must compute (every client on its whole data, no faults).

  Args:
    problem, algorithm, data, params: as for :func:`fedco.simulate`; ``algorithm`` must send
      only the model.
    rounds: server steps.
    clients_per_round: ``m``, the buffer.
    asynchronous: a :class:`fedco.runtime.Buffered` (``concurrency`` in ``[m, K]``).
    delays: a :class:`fedco.runtime.Delays`.
    seed: the simulation seed.

  Returns:
    The server's values (``{"params": x}``) after each step.

  Raises:
    ValueError: ``algorithm`` cannot run asynchronously (it sends state fields besides the
      model, or its server queries clients' losses).

  Examples:
    >>> import fedco
    >>> servers = fedco.testing.async_reference(
    ...   fedco.testing.default_problem("plain"), fedco.fedavg(0.1, 2),
    ...   fedco.testing.default_data(), fedco.testing.default_params(), rounds=2,
    ...   clients_per_round=1, asynchronous=fedco.runtime.Buffered(2),
    ...   delays=fedco.runtime.Delays(spread=0.5))
    >>> len(servers), sorted(servers[0])
    (2, ['params'])
  """
  plan, n, m = algorithm.plan, data.num_clients, clients_per_round
  reason = asynchrony.unsupported(algorithm)
  if reason is not None:
    raise ValueError(f"asynchronous= does not support {reason}")
  buffered = asynchronous.resolved(m, n)
  max_staleness = int(buffered.max_staleness or 0)  # resolved: always set
  params = base.strong(params)
  aggregator = base.as_aggregator(algorithm.server)
  counts = np.asarray(data.counts)
  full = [
    batching.draw_batch(jax.random.PRNGKey(0), data, k, None, return_rows=True) for k in range(n)
  ]
  step = full_batch_step(problem, algorithm)
  key = jax.random.split(jax.random.PRNGKey(seed))[0]  # the state's first key
  k_time = jax.random.fold_in(jax.random.PRNGKey(seed), asynchrony.TIMING_STREAM)
  dispatch_key = lambda v: asynchrony.dispatch_key(k_time, v)  # the runtime's draws
  took = lambda ids, v: np.asarray(
    delays.durations(
      k_time, jnp.asarray(ids, jnp.int32), jnp.full((len(ids),), plan.local_steps), v
    )
  )
  states = [initial_state(problem, algorithm, params, *full[k][:2]) for k in range(n)]
  server = {"params": params}
  server_state = aggregator.init(server, jnp.asarray(counts))
  models = {0: params}
  first = [int(i) for i in sample_clients(dispatch_key(0), n, buffered.concurrency)]
  flight = {p: (k, 0) for p, k in enumerate(first)}
  heap = [(float(a), p) for p, a in enumerate(took(first, 0))]
  heapq.heapify(heap)
  out: List[Dict[str, PyTree]] = []
  for version in range(rounds):
    key, _, k_round, _, k_agg = jax.random.split(key, 5)
    buffer = []
    for _ in range(m):  # the next m reports, one at a time
      arrival, p = heapq.heappop(heap)
      k, v = flight.pop(p)
      buffer.append((p, k, version - v, arrival))
    uploads, alive = [], []
    for _, k, tau, _ in buffer:
      fresh = tau <= max_staleness
      alive.append(fresh)
      if not fresh:  # discarded: its client's state stays as it was
        uploads.append(server["params"])
        continue
      start = model = models[version - tau]
      for t in range(plan.local_steps):
        model, states[k] = step(states[k], model, *full[k], k_round, jnp.asarray(k), jnp.asarray(t))
      weight = (1.0 + tau) ** -buffered.staleness_exponent
      uploads.append(
        jax.tree.map(lambda x, a, b, s=weight: x + s * (b - a), server["params"], start, model)
      )
    ids = np.array([b[1] for b in buffer])
    alive_a = np.array(alive)
    c = counts[ids].astype(np.float32) if plan.weighting == "samples" else np.ones(m, np.float32)
    c = np.where(alive_a, c, 0.0)
    w = jnp.asarray(c / c.sum() if c.sum() > 0 else c)
    info = base.RoundInfo(
      jnp.asarray(ids), w, jnp.asarray(counts[ids]), n, k_agg, _no_losses, jnp.asarray(alive_a)
    )
    stacked = {"params": jax.tree.map(lambda *v: jnp.stack(v), *uploads)}
    if alive_a.any():
      server, server_state = aggregator.update(server, server_state, stacked, info)
    models[version + 1] = server["params"]
    clock = buffer[-1][3]
    scores = np.asarray(jax.random.uniform(dispatch_key(version + 1), (n,)))
    busy = {k for k, _ in flight.values()}
    new = [int(i) for i in np.argsort(scores, kind="stable") if int(i) not in busy][:m]
    for (p, _, _, _), k, a in zip(buffer, new, clock + took(new, version + 1)):
      flight[p] = (k, version + 1)
      heapq.heappush(heap, (float(a), p))
    out.append(server)
  return out


def _no_losses(*args, **kwargs):
  del args, kwargs
  raise ValueError("asynchronous= runs no server that queries clients' losses")


__all__ = ["async_reference", "full_batch_step", "initial_state"]
