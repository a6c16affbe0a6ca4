"""The pure round: the CommPlan interpreter, written against a :class:`RunConfig` and its
client layout, with no simulator object. ``Simulator`` jits these functions per instance.

A round: sample clients, lay them into slots (:mod:`~fedco.runtime.layouts`), broadcast the
plan's round fields, refresh ``round_start`` fields, run the clients' local steps
(:mod:`~fedco.runtime.local`: a ``lax.scan`` of the ``vmap``-ed algorithm ``update``,
averaging ``every_step`` fields after each step, or chunks of clients each running its own
steps), hand the surviving clients' values to the server aggregator, write the slots back,
keep a uniformly random round's model, and evaluate.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, NamedTuple

import jax
import jax.numpy as jnp

from fedco.algorithms.base import RoundInfo, get_field, init_trackers, set_fields
from fedco.runtime import adaptive_clip, asynchrony, evaluation, local
from fedco.runtime.batching import draw, run_float
from fedco.runtime.faults import draw_faults
from fedco.runtime.local import CLIENT_STREAM as CLIENT_STREAM  # fedco.testing reads it
from fedco.runtime.local import broadcast, mean
from fedco.runtime.mesh import place
from fedco.runtime.paging import take_clients, write_clients

PyTree = Any


class SimState(NamedTuple):
  r"""Everything the simulation carries between rounds (a pytree).

  :meth:`fedco.Simulator.init` builds it and :meth:`fedco.Simulator.run` advances it;
  :func:`fedco.simulate` returns the final one as ``SimulationResult.state``, and
  :class:`~fedco.runtime.RoundAction` s receive it. Being a pytree of arrays, it can be
  checkpointed (:mod:`fedco.checkpoint`) and a run resumed from it.

  Attributes:
    round: rounds completed so far (an ``int32`` scalar).
    key: the PRNG key for the next round.
    server: ``{"params": x, field: value}`` for the round-synchronised state fields.
    server_opt_state: the server transform's state.
    shared: ``{field: mean}`` for the every-step fields (FedDRO's ``y_bar``).
    clients: every client's algorithm state, stacked on a leading ``[K]`` axis (a
      streamed run with persistent client state holds only its chunk's clients, as
      :class:`Pages`; :mod:`~fedco.runtime.streaming`).
    random_params: the averaged model of a uniformly random completed round (reservoir
      sampling), the iterate the FedDRO/DS-FedDRO theorems return.
    uplink: every client's codec state per compressed field (``{field: [K, ...]}``,
      :mod:`~fedco.runtime.uplink`); ``()`` without compression (:class:`Pages` when
      streamed, as ``clients``).
    schedule: under ``sampling="epochs"``, the current epoch's PRNG key (its permutation
      of the clients); ``()`` otherwise.
    timing: with ``delays``, the simulated clock and, under ``asynchronous``, the clients
      in flight and the ring of recent server models (:class:`~fedco.runtime.asynchrony.Timing`);
      ``()`` otherwise.

  Examples:
    FedDRO's initial state on the log form of client-level KL-DRO over 4 clients: the
    shared tracker starts at :math:`\bar y_0 = g(x_0)`, the vector of client losses
    (whole-data batches here), and every client holds its own copy of it:

    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> import fedco
    >>> x = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 1.0]], np.float32)
    >>> data = fedco.FederatedData.from_clients([{"x": x + k} for k in range(4)]).with_owner()
    >>> loss = lambda w, e: jnp.sum((w - e["x"]) ** 2)
    >>> problem = fedco.problems.client_kl_dro_log(loss, gamma=1.0, num_clients=4)
    >>> sim = fedco.Simulator(problem, fedco.feddro(0.05, 2), data, batch_size=None)
    >>> state = sim.init(jnp.zeros(2), seed=0)
    >>> int(state.round), sorted(state.server), sorted(state.shared)
    (0, ['params'], ['y'])
    >>> [round(float(v), 2) for v in state.shared["y"]]
    [2.25, 7.75, 17.25, 30.75]
    >>> state.clients.y.shape  # [K, p]
    (4, 4)
  """

  round: jax.Array
  key: jax.Array
  server: Dict[str, PyTree]
  server_opt_state: Any
  shared: Dict[str, PyTree]
  clients: Any
  random_params: PyTree
  uplink: Any = ()
  schedule: Any = ()
  timing: Any = ()


def client_weights(cfg, counts, mask=None):
  """Averaging weights (sum 1): uniform or by data size; masked slots weigh 0."""
  mask = jnp.ones(counts.shape, bool) if mask is None else mask
  ones = jnp.ones(counts.shape, run_float())
  c = jnp.where(mask, counts.astype(run_float()) if cfg.plan.weighting == "samples" else ones, 0.0)
  total = jnp.sum(c)
  return jnp.where(total > 0, c / jnp.where(total > 0, total, 1.0), 0.0)


def client_init(cfg, params, k_init, k, view, template=False):
  """Client ``k``'s initial state: its trackers filled from one mini-batch ``g_k(x_0)``
  drawn with ``fold_in(k_init, k)`` (the streamed pass draws the same,
  ``streaming.initial_means``). ``template``: from zeros of its shape instead (a streamed
  run's initial state, whose trackers the pass fills: no client's batch is computed)."""
  inner_value = None
  if cfg.problem.compositional:
    batch, w = draw(jax.random.fold_in(k_init, k), view, cfg.batch_size, cfg.layout.max_count)
    inner_value = cfg.problem.inner_value(params, batch, w)
    inner_value = jax.tree.map(jnp.zeros_like, inner_value) if template else inner_value
  return stored(cfg.plan, init_trackers(cfg.algorithm.init(params), params, inner_value))


def stored(plan, clients):
  """``clients`` (one client's state or a stack) as kept between rounds: the plan's
  ``round_local`` fields ``None``."""
  return set_fields(clients, **{f: None for f in plan.round_local})


def with_round_local(cfg, clients, params, slots: int):
  """The round's ``slots`` clients (their stored state) with the ``round_local`` fields as
  zeros of their shapes in ``algorithm.init(params)``."""
  if not cfg.plan.round_local:
    return clients
  template = jax.eval_shape(cfg.algorithm.init, params)
  zeros = lambda s: jnp.zeros((slots,) + s.shape, s.dtype)
  return set_fields(
    clients, **{f: jax.tree.map(zeros, get_field(template, f)) for f in cfg.plan.round_local}
  )


def init_state(cfg, params, key, data, template=False) -> SimState:
  """Every client's state from ``params`` and one mini-batch ``g_k(x_0)`` (``template``: see
  :func:`client_init`); then the plan's init fields are averaged so all clients start from
  the same ``(x_bar_0, y_bar_0)``."""
  timing = asynchrony.init_timing(cfg, params, key, data.counts)
  key, k_init = jax.random.split(key)  # key: state_key's
  plan, n, layout = cfg.plan, cfg.num_clients, cfg.layout
  one = functools.partial(client_init, cfg, params, k_init, template=template)
  clients = layout.cut(layout.map(one)(*layout.init_views(data)))
  w = client_weights(cfg, data.counts)
  # A plain problem's clients all start alike (init reads no data): their mean is any one's,
  # exactly (a weighted sum would round it, and hold every client's copy to compute it).
  average = (
    mean if cfg.problem.compositional else lambda tree, w: jax.tree.map(lambda a: a[0], tree)
  )
  up = cfg.uplink
  if up is not None and up.private:  # the trackers' common start is the clients' data too
    k_noise = jax.random.fold_in(k_init, UPLINK_STREAM)
    means = {
      f: up.private_init_mean(f, get_field(clients, f), w, jax.random.fold_in(k_noise, i))
      for i, f in enumerate(plan.init_fields)
    }
  else:
    means = {f: average(get_field(clients, f), w) for f in plan.init_fields}
  clients = set_fields(clients, **{f: broadcast(v, n) for f, v in means.items()})
  first = cfg.algorithm.init(params)  # a round_local field's start: every client's alike
  server = {
    "params": params,
    **{
      f: get_field(first, f) if f in plan.round_local else average(get_field(clients, f), w)
      for f in plan.every_round
    },
  }
  shared = {f: average(get_field(clients, f), w) for f in plan.every_step}
  uplink = ()
  if up is not None and up.codecs:
    uplink = up.init(server, shared, clients, n)
  return SimState(
    jnp.zeros([], jnp.int32),
    key,
    server,
    cfg.aggregator.init(server, data.counts),
    shared,
    clients,
    params,
    uplink,
    jnp.zeros_like(key) if cfg.sampling == "epochs" else (),
    timing,
  )


def _client_losses(cfg, data, params, ids, key):
  """Each listed client's loss of ``params`` on one fresh mini-batch (server queries)."""

  def one(k, view):
    batch, weights = draw(
      jax.random.fold_in(key, k), view, cfg.outer_batch_size, cfg.layout.max_count
    )
    return cfg.problem.client_objective(params, batch, weights)

  return cfg.layout.client_losses(data, one, ids)


def _refresh_inner(cfg, cst, params, ckeys, views, w, channel=None):
  """``round_start`` fields = mean (or the plan's reduction) over the round's clients of
  ``g_k(x_bar)``. ``channel = (codec states, key, ids, alive)`` sends the fields the uplink
  handles through it; returns ``(cst, codec states)``."""
  keys = jax.vmap(jax.random.fold_in, (0, None))(ckeys, cfg.plan.local_steps)

  problem = cfg.problem
  unlinked = cfg.plan.round_start_value == "pre_link" and problem.outer_link is not None

  def inner_at_server(key, view):
    batch, weights = draw(key, view, cfg.batch_size, cfg.layout.max_count)
    value = problem.inner_value(params, batch, weights)
    if unlinked:  # the query loss before the link, on a fresh query batch
      query, query_weights = draw(
        jax.random.fold_in(key, 1), view, cfg.outer_batch_size, cfg.layout.max_count
      )
      value = problem.unlinked_outer_value(value, query, query_weights)
    return value

  values = cfg.layout.map(inner_at_server)(keys, views)
  reduce = cfg.plan.round_start_reduce
  plain = lambda: mean(values, w) if reduce is None else reduce(values, w)
  if channel is None:
    value = plain()
    return set_fields(
      cst, **{f: broadcast(value, ckeys.shape[0]) for f in cfg.plan.round_start}
    ), None
  ust, key, ids, alive = channel
  up, fields = cfg.uplink, {}
  for i, f in enumerate(cfg.plan.round_start):
    if not up.handles(f):
      fields[f] = plain()
      continue
    k = jax.random.fold_in(key, i)
    if reduce is None:
      fields[f], ust = up.send_mean(f, values, None, w, ust, k, ids, alive)
    else:
      sent, ust = up.send_each(f, values, None, w, ust, k, ids, alive, shared_noise=False)
      fields[f] = reduce(sent, w)
  return set_fields(cst, **{f: broadcast(v, ckeys.shape[0]) for f, v in fields.items()}), ust


def round_step(cfg, data, flat, state: SimState, final_round, metrics_data=None, due_round=None):
  """One round of the plan: ``state -> (state, metrics)`` (pure; ``flat`` is
  :func:`~fedco.runtime.evaluation.flat_examples`; ``final_round``, the run's last round,
  is always evaluated; ``metrics_data``, the second argument of ``metrics_fn`` if any;
  ``due_round``, the round this one completes, given unbatched by a sweep so that whether
  an evaluation is due stays one branch for all its runs, defaults to ``state.round + 1``)."""
  plan, n, layout, mesh, up = cfg.plan, cfg.num_clients, cfg.layout, cfg.mesh, cfg.uplink
  slots = layout.slots
  key, k_sample, k_round, k_res, k_agg = jax.random.split(state.key, 5)
  # The uplink's randomness: its own stream (a constant no split index or client id
  # reaches), so it is independent of the sampling and runs without one keep every draw.
  k_up = None if up is None else jax.random.fold_in(state.key, UPLINK_STREAM)
  real, schedule, buffer = asynchrony.round_clients(cfg, state, k_sample)
  ids, mask, pick = layout.round_slots(real)
  cst = with_round_local(
    cfg, take_clients(layout, state.clients, ids), state.server["params"], slots
  )
  cst = set_fields(
    cst,
    **{f: broadcast(state.server[f], slots) for f in plan.every_round},
    **{f: broadcast(state.shared[f], slots) for f in plan.every_step},
  )
  start = asynchrony.start_models(cfg, state, buffer, slots)  # the server's, synchronously
  views = layout.views(data, ids)
  alive, steps = draw_faults(cfg, k_sample, ids, mask, views.count)
  alive = asynchrony.fresh(cfg, alive, buffer)  # reports staler than the ring: discarded
  w = client_weights(cfg, views.count, alive)
  ckeys = jax.vmap(jax.random.fold_in, (None, 0))(k_round, ids)
  ust = () if up is None else take_clients(layout, state.uplink, ids)
  if plan.round_start:
    channel = None
    if up is not None and up.fields(plan.round_start):
      assert k_up is not None  # set whenever there is an uplink
      channel = (ust, jax.random.fold_in(k_up, 0), ids, alive)
    cst, sent = _refresh_inner(cfg, cst, state.server["params"], ckeys, views, w, channel)
    ust = ust if sent is None else sent
  if plan.round_start_loss:
    _, losses = evaluation.client_objectives(cfg, state.server["params"], data, flat)
    cst = set_fields(cst, **{f: jnp.take(losses, ids, mode="clip") for f in plan.round_start_loss})
  params, cst, ckeys = place((start, cst, ckeys), mesh)
  step_channel = () if up is None else up.fields(plan.every_step)
  if cfg.client_chunk is None:
    params, cst, ust = local.vmapped_steps(
      cfg, k_round, k_up, params, cst, ust, ckeys, views, alive, steps, w, ids
    )
  else:  # clients independent within the round (no every_step fields): ust unchanged
    params, cst = local.chunked_steps(
      cfg, k_round, params, cst, ckeys, views, jnp.where(alive, steps, 0)
    )
  shared = (
    {f: mean(get_field(cst, f), w) for f in plan.every_step}
    if not step_channel
    else {f: jax.tree.map(lambda a: a[0], get_field(cst, f)) for f in plan.every_step}
  )
  params = asynchrony.scaled_changes(cfg, state, buffer, start, params)
  uploads = {"params": params, **{f: get_field(cst, f) for f in plan.every_round + plan.report}}
  client_losses: Callable[..., Any] = functools.partial(_client_losses, cfg, data)
  bounds, bits = adaptive_clip.bounds_of(cfg, state), {}
  if up is not None:
    uploads, ust, bits = _send_round_end(cfg, state, uploads, w, ust, k_up, ids, alive, bounds)
    if up.private:
      client_losses = _unprivate_losses
  client_values = jax.tree.map(pick, uploads)
  info = RoundInfo(real, pick(w), pick(views.count), n, k_agg, client_losses, pick(alive))
  server, server_opt_state = cfg.aggregator.update(
    state.server, state.server_opt_state, client_values, info
  )
  if bounds is not None:  # adaptive clipping: the bounds move with the round's noised bits
    assert k_up is not None
    k_bits = jax.random.fold_in(k_up, ADAPTIVE_STREAM)
    server_opt_state = adaptive_clip.advance(up, server_opt_state, bits, alive, k_bits)
  if cfg.may_drop:  # a round nobody survived changes nothing on the server
    anyone = jnp.any(alive)
    server, server_opt_state, shared = jax.tree.map(
      lambda new, old: jnp.where(anyone, new, old),
      (server, server_opt_state, shared),
      (state.server, state.server_opt_state, state.shared),
    )
  cst = set_fields(cst, **{f: broadcast(server[f], slots) for f in plan.every_round})
  clients = write_clients(layout, state.clients, stored(plan, cst), ids, mask)
  uplink = state.uplink
  if up is not None and up.codecs:
    uplink = write_clients(layout, state.uplink, ust, ids, mask)
  completed = state.round + 1
  keep = jax.random.uniform(k_res) * completed.astype(jnp.float32) < 1.0
  random_params = jax.tree.map(
    lambda a, b: jnp.where(keep, a, b), server["params"], state.random_params
  )
  timing = asynchrony.advance(cfg, state, buffer, server["params"], ids, steps, alive, data.counts)
  new_state = SimState(
    completed,
    key,
    server,
    server_opt_state,
    shared,
    clients,
    random_params,
    uplink,
    schedule,
    timing,
  )
  metrics = evaluation.maybe_metrics(
    cfg, completed, server["params"], data, flat, final_round, metrics_data, due_round
  )
  metrics["clients"] = real
  if bounds is not None:
    metrics.update({f"clip_{f}": b for f, b in bounds.items()})  # the round's bounds
  if cfg.may_drop:
    metrics["survivors"] = pick(alive)
  metrics.update(asynchrony.metrics(timing, buffer))
  if cfg.varied_steps:
    metrics["local_steps"] = pick(jnp.where(alive, steps, 0))
  return new_state, metrics


# Folded into a key for the uplink's draws: beyond any client id and split index.
UPLINK_STREAM = 0x75706C6B
# Folded into the uplink's key for adaptive clipping's count noise.
ADAPTIVE_STREAM = 0x61646170


def _send_round_end(cfg, state, uploads, w, ust, k_up, ids, alive, bounds=None):
  """The round-end uploads of the fields the uplink handles, as the server decodes them:
  the model and ``every_round`` fields as deltas from the server's copies, ``report``
  fields as they are. Noise lands once on the weighted mean unless the server reads every
  client's values (a ``ServerAggregator``) or the field is a report. With adaptive
  clipping (``bounds``), also each adapted field's bits: which clients were within it."""
  up, out, bits = cfg.uplink, dict(uploads), {}
  for i, f in enumerate(uploads):
    if not up.handles(f):
      continue
    report = f in cfg.plan.report and f not in cfg.plan.every_round and f != "params"
    reference = None if report else state.server[f]
    bound = None if bounds is None else bounds.get(f)
    if bound is not None:
      bits[f] = adaptive_clip.within(uploads[f], reference, bound)
    out[f], ust = up.send_each(
      f,
      uploads[f],
      reference,
      w,
      ust,
      jax.random.fold_in(k_up, 1000 + i),
      ids,
      alive,
      shared_noise=not (report or up.server_reads_each),
      bound=bound,
    )
  return out, ust, bits


def _unprivate_losses(*args, **kwargs):
  del args, kwargs
  raise ValueError(
    "this algorithm's server queries client losses outside its communication "
    "plan (DRFA's loss queries), which privacy does not cover; run it "
    "without privacy="
  )


def run_rounds(cfg, state: SimState, data, rounds: int, final_round=None, metrics_data=None):
  """``rounds`` rounds as one ``lax.scan``: ``(state, stacked metrics)``. ``final_round``
  (the run's last round, evaluated whatever ``eval_every`` says) defaults to this call's
  last round."""
  flat = evaluation.flat_examples(cfg, data)
  final_round = state.round + rounds if final_round is None else final_round
  return jax.lax.scan(
    lambda s, _: round_step(cfg, data, flat, s, final_round, metrics_data),
    state,
    None,
    length=rounds,
  )
