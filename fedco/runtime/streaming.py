"""Clients streamed from a :class:`~fedco.data.ClientStore`: only a chunk's clients in memory.

The clients a round samples depend only on the PRNG key the state carries, and each round's
key only on the previous one (``round_step`` splits it before anything else), so the host
can list every round's sampled clients before running them (:func:`schedule`). For each
chunk of rounds :class:`Chunks` reads the union of its sampled clients from the store into
a :class:`~fedco.FederatedData` whose ``counts`` are every client's and whose ``offsets``
point into the chunk's rows (other clients are not read: no round of the chunk asks for
them); the compiled rounds are unchanged, batches are drawn by position inside a client,
so a streamed run equals the in-memory one bit for bit. The chunk's row capacity is fixed
for the whole run (the largest sum of sampled clients' rows over any ``chunk_rounds``
consecutive rounds), so every chunk, a resumed run's included, runs one compiled program,
and the next chunk is read by a host thread while the current one runs.

Persistent client state (SCAFFOLD's control variates, Ditto's personal models, a codec's
error feedback) is streamed too: the device holds only the chunk's clients' rows, the disk
the rest (:mod:`~fedco.runtime.paging`).

Compositional problems stream too. An algorithm whose trackers start from the inner value
(``pending_or``) and are averaged over all clients before round 1 (the plan's ``at_init``
fields: Local-SCGD(M), FedDRO, DS-FedDRO, FedAvg-CO, MBSGD, GCIVR) gets those means from one
pass over the store before the first round (:func:`initial_means`, a block of clients at a
time; equal to the in-memory means up to float summation order); one whose state does not
depend on the data (ComFedL, the MAML methods) needs none. A tracker of each client's own
first inner value that the plan does not average (Local-MOML's ``u``) is computed from the
client's rows in the chunk the first time a round samples it (:class:`OwnStart`), as the
in-memory start computes it, and kept with the client's state on disk after.

Not streamed (refused with a ``ValueError`` naming the option): the exact objective over
all clients (``evaluate=True``, ``exact_grad_norm``), plans whose round start or server
reads every client's loss (``round_start_loss``, DRFA's loss queries), a tracker of each
client's own first inner value that the plan sends but does not average, per-example state (``num_examples``: a chunk numbers its examples anew), a mesh, and client
blocks. Under client-level privacy the pass clips each client's initial trackers and adds
the noise once to their sum, as the in-memory start does.
"""

from __future__ import annotations

import concurrent.futures
import functools
from typing import Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import keystr

from fedco import _labels
from fedco.algorithms.base import Pending, get_field, set_fields
from fedco.data.federated import FederatedData
from fedco.data.store import ClientStore
from fedco.runtime import config as config_lib
from fedco.runtime import rounds as rounds_lib
from fedco.runtime import sampling
from fedco.runtime.batching import ClientView
from fedco.runtime.checks import data_not_finite
from fedco.runtime.layouts import VIEW_COMPACT


def pending_fields(cfg, params) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
  """``(averaged, private)``: the plan's ``at_init`` fields holding a tracker that
  ``init(params)`` leaves to each client's inner value (:class:`Pending` ``"inner"``), and
  the paths of such trackers in no ``at_init`` field; ``((), ())`` for a plain problem."""
  return _split(cfg.plan, _inner_trackers(cfg, params))


def _split(plan, trackers):
  """:func:`pending_fields` of the trackers :func:`_inner_trackers` found."""
  averaged, private = [], []
  for names, path in trackers:
    fields = [f for f in plan.init_fields if f in names]
    averaged += fields[-1:]
    private += [] if fields else [path]
  return tuple(dict.fromkeys(averaged)), tuple(private)


def _inner_trackers(cfg, params):
  """``[(names on its path, its path)]`` of every tracker ``init(params)`` leaves to each
  client's inner value; ``[]`` for a plain problem."""
  if not cfg.problem.compositional:
    return []
  state = jax.eval_shape(cfg.algorithm.init, params)  # Pending is structure: it stays
  paths = jax.tree_util.tree_flatten_with_path(state, is_leaf=lambda x: isinstance(x, Pending))[0]
  return [  # "inner_jacobian" (zeros of a shape) does not depend on the data
    ([getattr(k, "name", getattr(k, "key", None)) for k in path], f"state{keystr(path)}")
    for path, leaf in paths
    if isinstance(leaf, Pending) and leaf.kind == "inner"
  ]


def check(cfg, params) -> Tuple[str, ...]:
  """Refuse what a streamed run cannot do (see the module); return the ``at_init`` fields
  whose trackers :func:`with_initial_means` averages (:func:`pending_fields`)."""
  plan, trackers = cfg.plan, _inner_trackers(cfg, params)
  pending, _ = _split(plan, trackers)
  per_example = "num_examples" in getattr(cfg.algorithm, "arguments", {})
  sent = [  # a client's own first inner value, also the server's or shared copy's start
    path
    for names, path in trackers
    if not set(names) & set(plan.init_fields)
    and set(names) & set(plan.every_round + plan.every_step)
  ]
  refused = {
    "evaluate=True (the exact objective reads every client; pass evaluate=False and a "
    "metrics_fn with metrics_data)": cfg.evaluate,
    "exact_grad_norm=True": cfg.exact_grad_norm,
    "a mesh": cfg.mesh is not None,
    "a plan whose round start reads every client's loss (round_start_loss)": bool(
      cfg.plan.round_start_loss
    ),
    "a server that queries clients' losses (queries_losses)": bool(
      getattr(cfg.aggregator, "queries_losses", False)
    ),
    "per-example state (num_examples: a chunk numbers its examples anew)": per_example,
    "asynchronous= (which clients report when is decided inside the compiled round, so "
    "no chunk can be read ahead)": cfg.asynchronous is not None,
    f"a tracker of each client's own first inner value that the plan sends but does not "
    f"average at init ({', '.join(sent)}: its server or shared copy would start from every "
    f"client's)": bool(sent),
  }
  bad = [what for what, yes in refused.items() if yes]
  if bad:
    raise ValueError(f"data is a ClientStore (streamed clients), which does not support {bad[0]}")
  return pending


#: ``int [rounds, m]``: the clients each round samples, replayed from the state's first key
#: (:func:`fedco.runtime.sampling.schedule`): what a streamed run reads ahead.
schedule = sampling.schedule


def template(store: ClientStore) -> FederatedData:
  """A :class:`FederatedData` with the store's clients and client 0's rows only: what the
  simulator is built and initialised with (its shapes and counts, not its rows, matter).
  Client 0's rows are checked as an in-memory run's data are (its labels by
  ``Simulator.init``, its finiteness by a divergence's data note)."""
  rows = store.read([0])
  return _assemble(store, np.array([0]), rows, int(store.counts[0]))


def checked(sim, params, store: ClientStore):
  """:func:`check`'s fields, and ``store`` as a :class:`CheckedStore` whose reads check the
  rows' labels against the classes ``sim``'s problem gives them (found by tracing it on
  ``sim.data``, the :func:`template`, as ``Simulator.init`` does) and their finiteness."""
  averaged = check(sim.config, params)
  with _labels.recording() as seen:
    config_lib.check_params(params, sim.data, sim.problem)
  labels = []
  for path, num_classes, what in seen:  # the store's fields are an example dict's keys
    if len(path) == 1 and getattr(path[0], "key", None) in store.fields:
      labels.append((path[0].key, num_classes, what))
  return averaged, CheckedStore(store, tuple(dict.fromkeys(labels)))


class CheckedStore(ClientStore):
  """A :class:`~fedco.data.ClientStore` (the same files, opened once) whose :meth:`read`
  also checks the rows it read as an in-memory run checks its data (:func:`check_rows`).

  Args:
    store: the opened store.
    labels: ``(field, num_classes, what)`` checks, in the order the problem makes them.
  """

  def __init__(self, store: ClientStore, labels=()):  # pylint: disable=super-init-not-called
    self.__dict__.update(vars(store))
    self.labels = labels
    self.non_finite: Optional[Tuple[int, str]] = None  # (first round using it, data note)

  def read(self, ids, out=None, first_round: int = 1):
    """:meth:`ClientStore.read`, then :func:`check_rows`; the first non-finite row read is
    kept with ``first_round``, the first round that uses it, for :meth:`data_note`."""
    out = super().read(ids, out)
    note = check_rows(self, np.asarray(ids, np.int64), out, self.labels)
    if note is not None and (self.non_finite is None or first_round < self.non_finite[0]):
      self.non_finite = (first_round, note)
    return out

  def data_note(self, round_: int) -> Optional[str]:
    """The data note of a divergence at ``round_``: the first non-finite row that rounds up
    to ``round_`` read, if any (a row read ahead for later rounds is not blamed)."""
    if self.non_finite is not None and self.non_finite[0] <= round_:
      return self.non_finite[1]
    return None


def _first_bad(ids, counts, offsets, bad):
  """``(client, row of the store)`` of the first ``True`` of ``bad`` (a flag per row read,
  clients ``ids`` in order)."""
  at = int(np.argmax(bad))
  ends = np.cumsum(counts[ids])
  i = int(np.searchsorted(ends, at, side="right"))
  return int(ids[i]), int(offsets[ids[i]] + at - (ends[i] - counts[ids[i]]))


def check_rows(store: ClientStore, ids, rows, labels) -> Optional[str]:
  """Check the rows of clients ``ids`` read from ``store`` (``rows``, from row 0) as an
  in-memory run checks its data, naming the client and its row in the store (the row
  ``FederatedData.from_clients`` of the same clients gives it): labels past a problem's
  classes (``labels``: ``(field, num_classes, what)``) raise the same ``LabelError``; the
  first non-finite row is returned as the data note an in-memory run's divergence carries
  (``None`` if all are finite): as in memory, non-finite data end a run only when they make
  it diverge (decision 94). Vectorized over the rows."""
  ids = np.asarray(ids, np.int64)
  n = int(store.counts[ids].sum())
  for field, num_classes, what in labels:
    values = rows[field][:n].reshape(n, -1)
    bad = ((values < 0) | (values >= num_classes)).any(axis=1)
    if bad.any():
      client, row = _first_bad(ids, store.counts, store.offsets, bad)
      value = values[int(np.argmax(bad))]
      value = int(value[(value < 0) | (value >= num_classes)][0])
      name = "data.examples" + keystr((jax.tree_util.DictKey(field),))
      raise _labels.out_of_range(name, client, row, value, num_classes, what)
  for field, (dtype, _) in store.fields.items():
    if dtype.kind in "fc":
      bad = ~np.isfinite(rows[field][:n].reshape(n, -1)).all(axis=1)
      if bad.any():
        client, row = _first_bad(ids, store.counts, store.offsets, bad)
        return data_not_finite(keystr((jax.tree_util.DictKey(field),)), client, row)
  return None


def _assemble(store, ids, rows, capacity) -> FederatedData:
  k = store.num_clients
  counts = store.counts[ids]
  offsets = np.zeros(k, np.int32)
  offsets[ids] = np.concatenate([[0], np.cumsum(counts)[:-1]])
  owner = np.zeros(capacity, np.int32)
  owner[: counts.sum()] = np.repeat(ids, counts)
  return FederatedData(
    examples=jax.tree.map(jnp.asarray, rows),
    counts=jnp.asarray(store.counts, jnp.int32),
    offsets=jnp.asarray(offsets),
    flat_rows=jnp.arange(capacity, dtype=jnp.int32),
    flat_owner=jnp.asarray(owner),
    max_count=store.max_count,
  )


def _most_distinct(sampled: np.ndarray, window: int) -> int:
  """The most distinct clients in any ``window`` consecutive rounds of ``sampled``
  (``[R, m]``, distinct within a round), in O(R m): an entry of round ``r`` whose client
  was last sampled in round ``p`` is new in the windows starting at ``max(p + 1, r - window
  + 1) .. r``."""
  num_rounds, m = sampled.shape
  flat = sampled.ravel()
  rounds = np.repeat(np.arange(num_rounds), m)
  order = np.lexsort((rounds, flat))
  prev = np.full(flat.size, -1)
  same = flat[order][1:] == flat[order][:-1]
  prev[order[1:][same]] = rounds[order[:-1][same]]
  lo = np.maximum(prev + 1, rounds - window + 1)
  counts = np.zeros(num_rounds + 1, np.int64)
  np.add.at(counts, np.maximum(lo, 0), 1)
  np.add.at(counts, rounds + 1, -1)
  return int(np.cumsum(counts)[: num_rounds - window + 1].max())


INIT_BLOCK = 1024  # clients a block of the initial pass reads


def _init_key(key):
  """The key ``init_state`` draws each client's first mini-batch from (the second of its
  split of the seed's key; :func:`~fedco.runtime.paging.state_key` is the first)."""
  return jax.random.split(key)[1]


def _clients_init(cfg, params, k_init, data, ids):
  """The initial states (``client_init``'s) of clients ``ids``, stacked, from ``data``
  (a chunk or a block holding their rows)."""
  one = functools.partial(rounds_lib.client_init, cfg, params, k_init)
  views = ClientView(data.examples, data.offsets[ids], data.counts[ids], data.flat_rows)
  return jax.vmap(one, in_axes=(0, VIEW_COMPACT))(ids, views)


def initial_means(cfg, fields, store: ClientStore, params, key, block: int = 0):
  """``init_state``'s means of the ``at_init`` ``fields`` over every client of ``store``
  (each client's trackers from one mini-batch ``g_k(x_0)``, as ``init_state`` draws it from
  ``key``), read ``block`` clients at a time: ``{field: mean}``. Under privacy each
  client's value is clipped in its block and the noise added once to the sum, with
  ``init_state``'s key and scale."""
  k_init = _init_key(key)
  block = block or INIT_BLOCK
  weights = np.asarray(rounds_lib.client_weights(cfg, jnp.asarray(store.counts)))
  n = store.num_clients
  block = min(block, n)
  starts = range(0, n, block)
  capacity = max(int(store.counts[s : s + block].sum()) for s in starts)
  sums = jax.jit(functools.partial(_block_sums, cfg, tuple(fields)))
  total = None
  for s in starts:
    ids = np.arange(s, min(s + block, n))
    rows = {f: np.zeros((capacity,) + sh, d) for f, (d, sh) in store.fields.items()}
    data = _assemble(store, ids, _read(store, ids, rows, 1), capacity)
    pad = block - ids.size  # a fixed block: one program; padding weighs 0
    part = sums(
      params,
      k_init,
      data,
      jnp.asarray(np.concatenate([ids, np.full(pad, ids[0])]), jnp.int32),
      jnp.asarray(np.concatenate([weights[ids], np.zeros(pad, weights.dtype)])),
    )
    total = part if total is None else jax.tree.map(jnp.add, total, part)
  up = cfg.uplink
  if up is not None and up.private:
    assert total is not None  # starts holds at least one block
    k_noise = jax.random.fold_in(k_init, rounds_lib.UPLINK_STREAM)  # init_state's
    keys = {f: jax.random.fold_in(k_noise, i) for i, f in enumerate(cfg.plan.init_fields)}
    total = {f: up.init_noise(f, v, jnp.max(weights), keys[f]) for f, v in total.items()}
  return total


def _block_sums(cfg, fields, params, k_init, data, ids, weights):
  """The weighted sums over clients ``ids`` of their initial ``fields`` (only these are
  computed: the rest of each client's state is compiled away)."""
  states = _clients_init(cfg, params, k_init, data, ids)
  up = cfg.uplink
  if up is not None and up.private:  # each client's value clipped; the noise comes once
    return {f: up.clipped_sum(f, get_field(states, f), weights) for f in fields}
  return {f: rounds_lib.mean(get_field(states, f), weights) for f in fields}


def with_initial_means(sim, store: ClientStore, state, fields, seed):
  """A streamed run's initial ``state`` with the means of its ``at_init`` ``fields`` (those
  holding trackers of the inner value, :func:`check`) from one pass over the store
  (:func:`initial_means`): in every client's (every page's) fields, the server's
  ``every_round`` and the shared ``every_step`` ones, and the server transform's state
  started from that server."""
  cfg = sim.config
  if not fields:
    return state
  means = initial_means(cfg, fields, store, state.server["params"], sim.seed_key(seed))
  pages = state.clients
  rows = jax.tree.leaves(pages.values)[0].shape[0]
  values = set_fields(pages.values, **{f: rounds_lib.broadcast(v, rows) for f, v in means.items()})
  server = {**state.server, **{f: v for f, v in means.items() if f in cfg.plan.every_round}}
  return state._replace(
    clients=pages._replace(values=values),
    server=server,
    server_opt_state=cfg.aggregator.init(server, jnp.asarray(store.counts, jnp.int32)),
    shared={**state.shared, **{f: v for f, v in means.items() if f in cfg.plan.every_step}},
  )


class OwnStart:
  """The initial trackers of each client's own first inner value that the plan does not
  average (Local-MOML's ``u``), for clients a chunk samples for the first time: computed
  from their rows in the chunk's data with ``init_state``'s key and batch (the averaged
  ``at_init`` fields are the fresh row's), so a streamed run starts each client as the
  in-memory one does. A client never sampled has no row (``unpaged`` reads it fresh).

  Args:
    sim: the run's :class:`~fedco.runtime.Simulator` (built on :func:`template`).
    params: the initial model ``x_0``.
    seed: the run's seed.
  """

  def __init__(self, sim, params, seed):
    self.cfg, self.params = sim.config, params
    self.k_init = _init_key(sim.seed_key(seed))
    self._rows = jax.jit(functools.partial(_own_rows, sim.config))

  @classmethod
  def of(cls, sim, params, seed) -> "OwnStart | None":
    """An :class:`OwnStart` where the algorithm has such trackers, else ``None``."""
    return cls(sim, params, seed) if pending_fields(sim.config, params)[1] else None

  def __call__(self, states, ids, data: FederatedData, rows):
    """``rows`` (:meth:`StateStore.read`'s, of clients ``ids``) with the first rows of the
    clients that have none in ``states`` computed from ``data`` (the chunk's)."""
    new = ~states.has_rows(ids) & (ids < self.cfg.num_clients)
    if not new.any():
      return rows
    own = self._rows(self.params, self.k_init, data, jnp.asarray(ids), jnp.asarray(new), rows[0])
    return (jax.device_get(own),) + tuple(rows[1:])


def _own_rows(cfg, params, k_init, data, ids, new, rows):
  """``rows`` with clients ``new``'s replaced by their initial state, ``client_init``'s, and
  its ``at_init`` fields from ``rows`` (the fresh row's means)."""
  safe = jnp.minimum(ids, cfg.num_clients - 1)  # padding computes a row it does not keep
  own = _clients_init(cfg, params, k_init, data, safe)
  own = set_fields(own, **{f: get_field(rows, f) for f in cfg.plan.init_fields})
  keep = lambda o, r: jnp.where(new.reshape(new.shape + (1,) * (r.ndim - 1)), o, r)
  return jax.tree.map(keep, own, rows)


def _read(store, ids, out, first_round):
  """``store.read(ids, out)``, checked where ``store`` is a :class:`CheckedStore`."""
  if isinstance(store, CheckedStore):
    return store.read(ids, out, first_round=first_round)
  return store.read(ids, out)


class Chunks:
  """Reads each chunk's clients from the store, the next one ahead on a host thread."""

  def __init__(self, store: ClientStore, sampled: np.ndarray, chunk_rounds: int):
    self.store, self.sampled = store, sampled
    self.own: "OwnStart | None" = None  # set once the run's initial state exists
    per_round = store.counts[sampled].sum(axis=1)  # rows each round reads (repeats counted)
    window = min(chunk_rounds, len(per_round))
    sums = np.convolve(per_round, np.ones(window, np.int64), mode="valid")
    self.capacity = int(sums.max())  # any chunk of at most chunk_rounds rounds fits
    self.pages = _most_distinct(sampled, window)  # a chunk's client state rows on the device
    self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fedco-stream")
    self._ahead: Tuple[Tuple[int, int], concurrent.futures.Future] | None = None

  def rows(self, states, ids, data: FederatedData):
    """The client state rows of the chunk's clients ``ids`` from ``states`` (a
    :class:`~fedco.runtime.StateStore`), with first rows from :attr:`own` where set."""
    rows = states.read(ids)
    return rows if self.own is None else self.own(states, ids, data, rows)

  def ids(self, start: int, size: int) -> np.ndarray:
    """int32 ``[pages]``: the distinct clients of rounds ``start + 1 .. start + size``,
    sorted, padded with ``K`` (a :class:`~fedco.runtime.Pages`' ``ids``)."""
    ids = np.full(self.pages, self.store.num_clients, np.int32)
    chunk = self._clients(start, size)
    ids[: chunk.size] = chunk
    return ids

  def _clients(self, start: int, size: int) -> np.ndarray:
    return np.unique(self.sampled[start : start + size])

  def _read(self, start: int, size: int):
    ids = self._clients(start, size)
    rows = {f: np.zeros((self.capacity,) + s, d) for f, (d, s) in self.store.fields.items()}
    return ids, _read(self.store, ids, rows, start + 1)

  def get(self, start: int, size: int) -> FederatedData:
    """The data of rounds ``start + 1 .. start + size`` (0-based ``start``); a refusal of
    their rows (:func:`check_rows`, also when the host thread read them) is one line."""
    ahead, self._ahead = self._ahead, None
    try:
      if ahead is not None and ahead[0] == (start, size):
        ids, rows = ahead[1].result()
      else:
        ids, rows = self._read(start, size)
    except ValueError as err:  # one line, not the host thread's frames
      raise err.with_traceback(None) from None
    return _assemble(self.store, ids, rows, self.capacity)

  def prefetch(self, start: int, size: int) -> None:
    """Start reading rounds ``start + 1 .. start + size`` on the host thread."""
    if size > 0 and start + size <= len(self.sampled):
      self._ahead = ((start, size), self._pool.submit(self._read, start, size))

  def close(self) -> None:
    self._pool.shutdown(wait=True, cancel_futures=True)
