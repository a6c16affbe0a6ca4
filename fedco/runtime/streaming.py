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

Not streamed (refused with a ``ValueError`` naming the option): the exact objective over
all clients (``evaluate=True``, ``exact_grad_norm``), plans whose round start or server
reads every client's loss (``round_start_loss``, DRFA's loss queries), compositional
problems (their initial state reads every client), a mesh, and client blocks.
"""

from __future__ import annotations

import concurrent.futures
import functools
from typing import Tuple

import jax
import jax.numpy as jnp
import numpy as np

from fedco.data.federated import FederatedData
from fedco.data.store import ClientStore
from fedco.runtime import rounds as rounds_lib


def check(cfg) -> None:
  """Refuse what a streamed run cannot do (see the module)."""
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
    "a compositional problem (its initial state reads every client)": cfg.problem.compositional,
  }
  bad = [what for what, yes in refused.items() if yes]
  if bad:
    raise ValueError(f"data is a ClientStore (streamed clients), which does not support {bad[0]}")


@functools.partial(jax.jit, static_argnames=("num_clients", "clients_per_round", "rounds"))
def _schedule(key, *, num_clients, clients_per_round, rounds):
  def one(key, _):
    key, k_sample, *_ = jax.random.split(key, 5)  # as round_step splits it
    return key, rounds_lib.sample_clients(k_sample, num_clients, clients_per_round)

  return jax.lax.scan(one, key, None, length=rounds)[1]


def schedule(key, num_clients: int, clients_per_round: int, rounds: int) -> np.ndarray:
  """``int [rounds, m]``: the clients each of ``rounds`` rounds from state key ``key``
  samples (``round_step``'s draw, replayed)."""
  return np.asarray(
    _schedule(key, num_clients=num_clients, clients_per_round=clients_per_round, rounds=rounds)
  )


def template(store: ClientStore) -> FederatedData:
  """A :class:`FederatedData` with the store's clients and client 0's rows only: what the
  simulator is built and initialised with (its shapes and counts, not its rows, matter)."""
  rows = store.read([0])
  return _assemble(store, np.array([0]), rows, int(store.counts[0]))


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


class Chunks:
  """Reads each chunk's clients from the store, the next one ahead on a host thread."""

  def __init__(self, store: ClientStore, sampled: np.ndarray, chunk_rounds: int):
    self.store, self.sampled = store, sampled
    per_round = store.counts[sampled].sum(axis=1)  # rows each round reads (repeats counted)
    window = min(chunk_rounds, len(per_round))
    sums = np.convolve(per_round, np.ones(window, np.int64), mode="valid")
    self.capacity = int(sums.max())  # any chunk of at most chunk_rounds rounds fits
    self.pages = _most_distinct(sampled, window)  # a chunk's client state rows on the device
    self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fedco-stream")
    self._ahead: Tuple[Tuple[int, int], concurrent.futures.Future] | None = None

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
    self.store.read(ids, out=rows)
    return ids, rows

  def get(self, start: int, size: int) -> FederatedData:
    """The data of rounds ``start + 1 .. start + size`` (0-based ``start``)."""
    if self._ahead is not None and self._ahead[0] == (start, size):
      ids, rows = self._ahead[1].result()
    else:
      ids, rows = self._read(start, size)
    self._ahead = None
    return _assemble(self.store, ids, rows, self.capacity)

  def prefetch(self, start: int, size: int) -> None:
    """Start reading rounds ``start + 1 .. start + size`` on the host thread."""
    if size > 0 and start + size <= len(self.sampled):
      self._ahead = ((start, size), self._pool.submit(self._read, start, size))

  def close(self) -> None:
    self._pool.shutdown(wait=True, cancel_futures=True)
