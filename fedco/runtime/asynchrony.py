r"""Simulated time and buffered asynchronous aggregation (FedBuff; decision 112).

``SimOptions.delays`` (a :class:`Delays`) gives every client's local work a simulated
duration, so a run reports ``metrics["time"]``, the simulated clock after each round:

* a **synchronous** round lasts as long as its slowest surviving client;
* under ``SimOptions.asynchronous`` (a :class:`Buffered`: FedBuff, Nguyen et al. 2022) the
  server keeps ``concurrency`` clients training at once, each from the server model of the
  version it was dispatched with; a "round" is one server step: the ``m =
  clients_per_round`` earliest reports (the buffer) are applied, each client's change
  :math:`\Delta_k = x_k^{\rm end} - x_k^{\rm start}` scaled by the staleness weight
  :math:`s(\tau_k) = (1 + \tau_k)^{-a}` (:math:`\tau_k`: server steps since its dispatch),
  and the ``m`` clients that reported are replaced by ``m`` clients drawn uniformly from
  those not training, dispatched with the new model at the step's time. The last
  ``max_staleness + 1`` server models live in a ring in the state; a report staler than
  ``max_staleness`` is discarded (it counts as a dropped client). Everything, the event
  order included, is inside the compiled round: no Python per client.

Refilling the ``m`` freed places when the buffer is applied, not at each report, keeps the
step exactly vectorisable: no client dispatched during a buffer can report into it, so the
buffer is exactly the ``m`` earliest of the ``concurrency`` reports outstanding (the
event-driven transcription in ``tests/test_asynchrony.py`` checks it). FedBuff as published
dispatches a replacement at each report with the model of that moment, the same version for
all but the last of a buffer's replacements.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedco import _validate
from fedco.runtime.batching import run_float
from fedco.runtime.faults import planned_steps
from fedco.runtime.local import broadcast
from fedco.runtime.sampling import sample, sample_clients

PyTree = Any

# Folded into the run's first key for the timing's key: apart from every other stream.
TIMING_STREAM = 0x74696D65
# Folded into the timing key: client speeds, per-dispatch jitter, replacement draws.
_SPEED, _SLOW, _JITTER, _DISPATCH = 1, 2, 3, 4


@dataclasses.dataclass(frozen=True)
class Delays:
  r"""Simulated durations of clients' local work, deterministic per seed.

  A client ``k`` dispatched to take ``s`` local steps reports after

  .. math::

    \text{latency} + s \cdot \text{step\_time} \cdot v_k \cdot e^{\sigma_j z},
    \qquad v_k = e^{\sigma_c z_k} \cdot (\text{straggler\_slowdown if } k
    \text{ is a straggler}),

  with :math:`z_k, z` standard normal: :math:`z_k` fixed per client and seed (how fast its
  device is), :math:`z` fresh per dispatch (what else it is doing). A fixed fraction of the
  clients, chosen per seed, are stragglers. The same seed gives the same speeds to a
  synchronous and an asynchronous run.

  Attributes:
    step_time: a number > 0: the duration of one local step at speed 1 (default 1).
    latency: a number >= 0: the fixed cost of a dispatch, download and upload (default 0).
    spread: :math:`\sigma_c \ge 0`, the spread of log speeds across clients (default 0).
    jitter: :math:`\sigma_j \ge 0`, the spread of log durations per dispatch (default 0).
    straggler_fraction: a number in ``[0, 1]``: the share of clients that are stragglers
      (default 0).
    straggler_slowdown: a number >= 1: how many times slower a straggler is (default 10).

  Examples:
    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> delays = fedco.runtime.Delays(step_time=2.0, latency=1.0)
    >>> delays.durations(jax.random.PRNGKey(0), jnp.arange(3), jnp.array([1, 2, 3]), 0)
    Array([3., 5., 7.], dtype=float32)
  """

  step_time: float = 1.0
  latency: float = 0.0
  spread: float = 0.0
  jitter: float = 0.0
  straggler_fraction: float = 0.0
  straggler_slowdown: float = 10.0

  def __post_init__(self):
    _validate.positive("delays.step_time", self.step_time)
    for name in ("latency", "spread", "jitter"):
      _validate.interval(f"delays.{name}", getattr(self, name), 0, None, closed_low=True)
    _validate.interval(
      "delays.straggler_fraction", self.straggler_fraction, 0, 1, closed_low=True, closed_high=True
    )
    _validate.interval(
      "delays.straggler_slowdown", self.straggler_slowdown, 1, None, closed_low=True
    )

  def speeds(self, key, ids) -> jax.Array:
    """Each client's duration multiplier :math:`v_k` (its stragglers' slowdown included)."""
    dtype = run_float()
    one = lambda k, i: jax.random.normal(jax.random.fold_in(k, i), (), dtype)
    z = jax.vmap(one, (None, 0))(jax.random.fold_in(key, _SPEED), ids)
    uniform = lambda k, i: jax.random.uniform(jax.random.fold_in(k, i), (), dtype)
    slow = jax.vmap(uniform, (None, 0))(jax.random.fold_in(key, _SLOW), ids)
    factor = jnp.where(slow < self.straggler_fraction, self.straggler_slowdown, 1.0)
    return jnp.exp(self.spread * z) * factor.astype(dtype)

  def durations(self, key, ids, steps, dispatch) -> jax.Array:
    """How long clients ``ids`` take for ``steps`` local steps when dispatched at server
    step (or round) ``dispatch``."""
    dtype = run_float()
    k = jax.random.fold_in(jax.random.fold_in(key, _JITTER), dispatch)
    z = jax.vmap(lambda i: jax.random.normal(jax.random.fold_in(k, i), (), dtype))(ids)
    work = steps.astype(dtype) * self.step_time * self.speeds(key, ids)
    return self.latency + work * jnp.exp(self.jitter * z)


@dataclasses.dataclass(frozen=True)
class Buffered:
  r"""Buffered asynchronous aggregation (FedBuff): ``SimOptions.asynchronous``.

  The buffer is ``clients_per_round`` reports (``m``); a run's "round" is one server step.

  Attributes:
    concurrency: an int in ``[m, K]``: clients training at once.
    max_staleness: an int >= 0: the stalest report applied (older ones are discarded); the
      state keeps ``max_staleness + 1`` server models. ``None`` (default):
      ``4 * ceil(concurrency / m)``, four times the staleness of a client of average speed.
    staleness_exponent: :math:`a \ge 0` of the weight :math:`(1 + \tau)^{-a}` on a report
      :math:`\tau` server steps stale; ``0`` weighs every report alike. Default ``0.5``
      (FedBuff's :math:`1/\sqrt{1 + \tau}`).

  Examples:
    >>> import fedco
    >>> fedco.runtime.Buffered(30).resolved(10, 100).max_staleness
    12
  """

  concurrency: int
  max_staleness: Optional[int] = None
  staleness_exponent: float = 0.5

  def __post_init__(self):
    _validate.positive_int("asynchronous.concurrency", self.concurrency)
    if self.max_staleness is not None:
      _validate.positive_int("asynchronous.max_staleness", self.max_staleness, minimum=0)
    _validate.interval(
      "asynchronous.staleness_exponent", self.staleness_exponent, 0, None, closed_low=True
    )

  def resolved(self, clients_per_round: int, num_clients: int) -> "Buffered":
    """These settings checked against a run's ``m`` and ``K``, ``max_staleness`` set."""
    _validate.positive_int(
      "asynchronous.concurrency",
      self.concurrency,
      minimum=clients_per_round,
      maximum=num_clients,
      note="clients_per_round (the buffer) to the number of clients",
    )
    stale = self.max_staleness
    if stale is None:
      stale = 4 * -(-self.concurrency // clients_per_round)
    return dataclasses.replace(self, max_staleness=stale)

  def weights(self, staleness) -> jax.Array:
    """:math:`(1 + \\tau)^{-a}` for each report's staleness ``tau``."""
    return (1.0 + staleness.astype(run_float())) ** -self.staleness_exponent


def checked(algorithm, o, m: int, n: int, layout):
  """``(delays, asynchronous)`` checked: a ``Delays`` or ``None``, and a ``Buffered``
  resolved against ``m`` and ``n`` (with ``Delays()`` when it has none) where the run can
  take it: an algorithm that sends only the model, clients in memory, uniform sampling."""
  delays, buffered = o.delays, o.asynchronous
  if delays is not None and not isinstance(delays, Delays):
    raise ValueError(f"delays must be a fedco.runtime.Delays, got {delays!r}")
  if buffered is None:
    return delays, None
  if not isinstance(buffered, Buffered):
    raise ValueError(f"asynchronous must be a fedco.runtime.Buffered, got {buffered!r}")
  reason = unsupported(algorithm)
  refused = {
    reason or "": reason is not None,
    f"sampling={o.sampling!r} (clients are dispatched as others report)": o.sampling != "uniform",
    "client blocks (multi-process data)": layout.resident,
    "straggler_prob (delays= says how slow each client is)": o.straggler_prob > 0,
    "privacy (its accounting assumes rounds of uniformly sampled clients)": o.privacy is not None,
  }
  bad = [what for what, yes in refused.items() if yes]
  if bad:
    raise ValueError(f"asynchronous= does not support {bad[0]}")
  return delays or Delays(), buffered.resolved(m, n)


def unsupported(algorithm) -> Optional[str]:
  """Why ``algorithm`` cannot run asynchronously (``None``: it can): its clients send or
  receive state fields besides the model, or its server queries clients' losses."""
  plan = algorithm.plan
  if plan.fields or plan.round_start_loss:
    return (
      f"{algorithm.name}, whose clients also send or receive the state fields "
      f"{list(plan.fields) + list(plan.round_start_loss)} (it takes algorithms that send "
      "only the model)"
    )
  if getattr(algorithm.server, "queries_losses", False):
    return f"{algorithm.name}, whose server queries clients' losses"
  return None


class Timing(NamedTuple):
  """A run's simulated clock (``SimState.timing``) and, asynchronously, its clients in flight.

  Attributes:
    clock: the simulated time after the rounds completed so far.
    key: the delays' key (fixed for the run).
    ring: asynchronous runs: the last ``max_staleness + 1`` server models, model version
      ``v`` at ``v mod (max_staleness + 1)``; ``()`` otherwise.
    ids: the clients training (``[concurrency]``).
    version: the model version each started from.
    arrival: when each reports.

  Examples:
    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> import fedco
    >>> data = fedco.FederatedData.from_clients([{"x": np.full((2, 1), k, np.float32)} for k in range(4)])
    >>> problem = fedco.plain(lambda w, e: jnp.sum((w - e["x"]) ** 2))
    >>> sim = fedco.Simulator(problem, fedco.fedavg(0.1, 2), data, batch_size=None,
    ...                       clients_per_round=1, asynchronous=fedco.runtime.Buffered(2))
    >>> timing = sim.init(jnp.zeros(1), seed=0).timing
    >>> timing.ids.shape, timing.ring.shape  # 2 in flight; 4 * ceil(2 / 1) + 1 models
    ((2,), (9, 1))
  """

  clock: jax.Array
  key: jax.Array
  ring: PyTree = ()
  ids: Any = ()
  version: Any = ()
  arrival: Any = ()


def init_timing(cfg, params, key, counts):
  """A run's :class:`Timing` at round 0 (``()`` without ``delays``): the first
  ``concurrency`` clients dispatched with model version 0."""
  if cfg.delays is None:
    return ()
  key = jax.random.fold_in(key, TIMING_STREAM)
  clock = jnp.zeros([], run_float())
  if cfg.asynchronous is None:
    return Timing(clock, key)
  buffered, n = cfg.asynchronous, cfg.num_clients
  ids = sample_clients(dispatch_key(key, 0), n, buffered.concurrency).astype(jnp.int32)
  arrival = cfg.delays.durations(key, ids, planned_steps(cfg, counts[ids]), 0)
  ring = jax.tree.map(
    lambda a: jnp.broadcast_to(a, (buffered.max_staleness + 1,) + a.shape), params
  )
  version = jnp.zeros(ids.shape, jnp.int32)
  return Timing(clock, key, ring, ids, version, arrival)


def dispatch_key(key, version):
  """The key of the replacement draw after server step ``version`` (0: the first dispatch)."""
  return jax.random.fold_in(jax.random.fold_in(key, _DISPATCH), version)


class Buffer(NamedTuple):
  """An asynchronous server step's reports: where they sit among the clients in flight
  (``positions``, in the order they arrive) and how stale each is (``staleness``)."""

  positions: jax.Array
  staleness: jax.Array


def round_clients(cfg, state, key):
  """``(clients, schedule, buffer)``: a synchronous round's sampled clients (``buffer``
  ``None``), or an asynchronous step's buffer, the ``m`` earliest reports outstanding
  (ties to the lower position), in the order they arrive."""
  if cfg.asynchronous is None:
    return sample(cfg, key, state) + (None,)
  timing = state.timing
  _, positions = jax.lax.top_k(-timing.arrival, cfg.clients_per_round)
  buffer = Buffer(positions, state.round - timing.version[positions])
  return timing.ids[positions], state.schedule, buffer


def start_models(cfg, state, buffer: Optional[Buffer], slots: int):
  """Each slot's starting model: the server's, or under a ``buffer`` the ring's model of
  its client's version (padding slots: the server's)."""
  server = state.server["params"]
  if buffer is None:
    return broadcast(server, slots)
  where = state.timing.version[buffer.positions] % (cfg.asynchronous.max_staleness + 1)
  pad = slots - where.shape[0]
  return jax.tree.map(
    lambda ring, x: jnp.concatenate([ring[where], jnp.broadcast_to(x, (pad,) + x.shape)]),
    state.timing.ring,
    server,
  )


def _padded(values, slots: int, fill):
  return jnp.concatenate([values, jnp.full((slots - values.shape[0],), fill, values.dtype)])


def fresh(cfg, alive, buffer: Optional[Buffer]):
  """``alive`` without the reports staler than ``max_staleness`` (their models are gone)."""
  if buffer is None:
    return alive
  return alive & _padded(buffer.staleness <= cfg.asynchronous.max_staleness, alive.shape[0], False)


def scaled_changes(cfg, state, buffer: Optional[Buffer], start, end):
  """What the server's mean reads of each slot: its model (synchronously), or ``server +
  s(tau) (end - start)``, so a weighted mean's pseudo-gradient is the buffer's mean change
  scaled by staleness."""
  if buffer is None:
    return end
  slots = jax.tree.leaves(start)[0].shape[0]
  weights = _padded(cfg.asynchronous.weights(buffer.staleness), slots, 0.0)

  def one(x, a, b):
    s = weights.astype(a.dtype).reshape(weights.shape + (1,) * (a.ndim - 1))
    return x + s * (b - a)

  return jax.tree.map(one, state.server["params"], start, end)


def advance(cfg, state, buffer: Optional[Buffer], params, ids, steps, alive, counts):
  """The timing after this round (``()`` without ``delays``). Synchronously, the clock
  moves by the slowest surviving client's duration. Asynchronously, to the buffer's last
  report; the new model ``params`` enters the ring as the next version, and the clients
  that reported are replaced by clients not training, dispatched now with it."""
  timing = state.timing
  if cfg.delays is None:
    return timing
  if buffer is None:
    took = cfg.delays.durations(timing.key, ids, steps, state.round)
    return timing._replace(clock=timing.clock + jnp.max(jnp.where(alive, took, 0.0)))
  n, m, positions = cfg.num_clients, cfg.clients_per_round, buffer.positions
  version = state.round + 1
  clock = jnp.max(timing.arrival[positions])
  released = jnp.zeros(timing.ids.shape, bool).at[positions].set(True)
  scores = jax.random.uniform(dispatch_key(timing.key, version), (n,))
  scores = scores.at[jnp.where(released, n, timing.ids)].set(2.0, mode="drop")  # busy
  _, new = jax.lax.top_k(-scores, m)  # the m lowest scores of the clients not training
  new = new.astype(jnp.int32)
  took = cfg.delays.durations(timing.key, new, planned_steps(cfg, counts[new]), version)
  size = cfg.asynchronous.max_staleness + 1
  return Timing(
    clock,
    timing.key,
    jax.tree.map(lambda ring, x: ring.at[version % size].set(x), timing.ring, params),
    timing.ids.at[positions].set(new),
    timing.version.at[positions].set(version),
    timing.arrival.at[positions].set(clock + took),
  )


def metrics(timing, buffer: Optional[Buffer]):
  """The round's ``time`` (with ``delays``) and its reports' ``staleness`` (asynchronously)."""
  out = {"time": timing.clock} if isinstance(timing, Timing) else {}
  if buffer is not None:
    out["staleness"] = buffer.staleness
  return out


__all__ = ["Buffered", "Delays", "Timing"]
