"""Per-client state of a streamed run: a chunk's clients on the device, the rest on disk.

A stateful algorithm (SCAFFOLD's control variates, Ditto's personal models, a codec's error
feedback) keeps state per client. In memory that is a ``[K, ...]`` stack in the
:class:`~fedco.runtime.SimState`; a streamed run (:mod:`~fedco.runtime.streaming`) holds
instead :class:`Pages`: the rows of the ``P`` clients of the chunk it runs (``P``: the most
distinct clients any chunk samples). A round finds its clients' rows by their position in
the pages' sorted ids (:func:`take_clients`, :func:`write_clients`). Between chunks the host
writes the pages back to a :class:`StateStore` on disk and reads the next chunk's. A client
no round has sampled yet has no row: it starts from the state every client of a plain
problem starts from (:func:`to_pages`). State memory on the device is O(clients per
chunk); the host holds the rows written back since the last checkpoint (O(clients sampled
between checkpoints): checkpoint often with many clients), the disk those of every client
sampled so far; and the run equals the in-memory one bit for bit. Checkpoints and the run's
fingerprint hold the pages cut to one row (:func:`compact`), so a resumed run may change
``rounds`` or ``chunk_rounds``.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedco.runtime import state_files
from fedco.runtime.state_folders import remove_temporary, temporary_folder  # noqa: F401

__all__ = ["Pages", "StateStore", "unpaged"]


class Pages(NamedTuple):
  """Per-client state of a few clients, in place of every client's ``[K]`` stack.

  A streamed run (:mod:`~fedco.runtime.streaming`) keeps its persistent client state on
  disk and holds on the device only the clients of the chunk it runs: ``ids`` (int32
  ``[P]``) are their ids, sorted, padded with ``K``; ``values`` hold their states on a
  leading ``[P]`` axis, row ``i`` for client ``ids[i]``. A round reads and writes its
  clients' rows by their position in ``ids``.

  Attributes:
    ids: int32 ``[P]``: the clients whose state the pages hold, sorted; padding ``K``.
    values: their states, the algorithm's (or the codecs') client state with a leading
      ``[P]`` axis.

  Examples:
    A streamed, stateful run's final state holds its last chunk's clients (see
    :class:`~fedco.runtime.StateStore` for the whole run):

    >>> import jax.numpy as jnp
    >>> import fedco
    >>> pages = fedco.runtime.Pages(jnp.array([1, 4, 6]), {"c": jnp.zeros((3, 2))})
    >>> pages.ids.tolist(), pages.values["c"].shape  # clients 1 and 4; K = 6 pads
    ([1, 4, 6], (3, 2))
  """

  ids: jax.Array
  values: Any


def take_clients(layout, tree, ids):
  """Per-client values (a ``[K]`` stack or :class:`Pages`) -> the slots' values."""
  if isinstance(tree, Pages):
    local = jnp.searchsorted(tree.ids, ids)
    return jax.tree.map(lambda a: jnp.take(a, local, axis=0, mode="clip"), tree.values)
  return layout.take(tree, ids)


def write_clients(layout, old, new, ids, mask):
  """The slots' values written back into the per-client values (``[K]`` or :class:`Pages`);
  slots outside ``mask`` (padding, unsampled resident clients) are dropped."""
  if isinstance(old, Pages):
    where = jnp.where(mask, jnp.searchsorted(old.ids, ids), old.ids.shape[0])
    put = lambda a, b: a.at[where].set(b, mode="drop")
    return old._replace(values=jax.tree.map(put, old.values, new))
  if layout.direct:
    return new
  where = jnp.where(mask, ids, layout.num_clients)
  return jax.tree.map(lambda a, b: a.at[where].set(b, mode="drop"), old, new)


def to_pages(state, pages: int, num_clients: int):
  """``state`` with its per-client trees as :class:`Pages` of ``pages`` rows, all ``ids``
  padding and every row client 0's initial state (a plain problem's clients all start from
  the same state; the host fills in a chunk's real clients before it runs)."""

  def page(tree):
    if not jax.tree.leaves(tree):
      return tree
    rows = jax.tree.map(lambda a: jnp.broadcast_to(a[0], (pages,) + a.shape[1:]), tree)
    return Pages(jnp.full((pages,), num_clients, jnp.int32), rows)

  return state._replace(clients=page(state.clients), uplink=page(state.uplink))


def _parts(state):
  """``(clients, uplink)``: each a :class:`Pages` or ``None``."""
  return tuple(t if isinstance(t, Pages) else None for t in (state.clients, state.uplink))


def _replace_pages(state, fn):
  """``state`` with ``fn(i, pages)`` in place of each :class:`Pages` (``i``: 0 for
  ``clients``, 1 for ``uplink``); a tree that is not paged stays as it is."""
  trees = (state.clients, state.uplink)
  new = [t if p is None else fn(i, p) for i, (t, p) in enumerate(zip(trees, _parts(state)))]
  return state._replace(clients=new[0], uplink=new[1])


def state_key(key):
  """The key a state starts with, from the seed's key (:func:`~fedco.runtime.rounds.init_state`
  keeps the first of its split): what the host replays the sampling from."""
  return jax.random.split(key)[0]


def is_paged(state) -> bool:
  """Whether ``state`` holds per-client state as pages (a streamed, stateful run)."""
  return any(p is not None for p in _parts(state))


def compact(state):
  """``state`` with each :class:`Pages` cut to its first row: what checkpoints and the run's
  fingerprint hold (the rows live in the :class:`StateStore`, and the row count follows the
  run's ``rounds`` and ``chunk_rounds``, which a resumed run may change)."""
  return _replace_pages(
    state, lambda i, p: Pages(p.ids[:1], jax.tree.map(lambda a: a[:1], p.values))
  )


def fresh(state):
  """One client's initial state (the pages' rows of an initial paged state, all alike)."""
  return jax.device_get(
    tuple(() if p is None else jax.tree.map(lambda a: a[0], p.values) for p in _parts(state))
  )


def pages_of(state):
  """``(ids, rows)`` of a paged state, on the host (what :meth:`StateStore.write` takes)."""
  parts = _parts(state)
  ids = next(p.ids for p in parts if p is not None)
  return jax.device_get((ids, tuple(() if p is None else p.values for p in parts)))


def with_pages(state, ids, rows):
  """``state`` with the pages of clients ``ids`` holding ``rows`` (from :meth:`StateStore.read`)."""
  ids = jnp.asarray(ids, jnp.int32)
  return _replace_pages(state, lambda i, p: Pages(ids, jax.tree.map(jnp.asarray, rows[i])))


def unpaged(state, store: "StateStore"):
  """``state`` with every client's state from ``store`` in place of its pages.

  Args:
    state: a paged state of a streamed run (e.g. its ``SimulationResult.state``).
    store: that run's :class:`StateStore` (:meth:`StateStore.open`).

  Returns:
    The :class:`~fedco.runtime.SimState` with ``clients`` (and ``uplink``) as ``[K, ...]``
    stacks, as an in-memory run holds them: for stores whose ``K`` clients fit in memory.
    A client never sampled reads the fresh state (for Local-MOML, whose memories start
    from each client's own data, not the start it would have had).

  Examples:
    Client 2 has a row on disk; the others read the fresh state (see :class:`StateStore`
    for a whole streamed run):

    >>> import tempfile
    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> import fedco
    >>> fresh = ({"c": np.zeros(2, np.float32)}, ())  # (algorithm's, codecs'): one client
    >>> states = fedco.runtime.StateStore(tempfile.mkdtemp(), fresh, num_clients=4)
    >>> states.write([2], ({"c": np.ones((1, 2), np.float32)}, ()))
    >>> pages = fedco.runtime.Pages(jnp.array([2, 4]), {"c": jnp.ones((2, 2))})
    >>> state = fedco.runtime.SimState(0, None, {}, (), {}, pages, None)
    >>> fedco.runtime.unpaged(state, states).clients["c"][:, 0].tolist()
    [0.0, 0.0, 1.0, 0.0]
  """
  rows = store.read(np.arange(store.num_clients))
  return _replace_pages(state, lambda i, p: rows[i])


def _no_rows(fresh):
  return np.zeros((0,), np.int64), [np.zeros((0,) + a.shape, a.dtype) for a in fresh]


def _merge(old, new):
  """Rows ``(sorted ids, [leaf rows])``: ``old``'s and ``new``'s, ``new``'s where both."""
  keep = ~np.isin(old[0], new[0])
  ids = np.concatenate([old[0][keep], new[0]])
  order = np.argsort(ids, kind="stable")
  return ids[order], [np.concatenate([o[keep], n])[order] for o, n in zip(old[1], new[1])]


def _overlay(rows, ids, out) -> None:
  """Writes ``rows``' values into ``out`` (``[len(ids), ...]`` per leaf) where ``ids`` has them."""
  have, values = rows
  if not have.size:
    return
  pos = np.searchsorted(have, ids)
  hit = (pos < have.size) & (have[np.minimum(pos, have.size - 1)] == ids)
  for o, v in zip(out, values):
    o[hit] = v[pos[hit]]


class StateStore:
  """Every client's persistent state on disk; a chunk's clients' rows go in and out.

  Files in ``directory`` (:mod:`fedco.runtime.state_files`, decision 95): ``rows.bin``,
  dense records, one a sampled client (a client takes the next slot the first time its row
  is written; a record holds a crc32, the client's id and its state's bytes), so disk grows
  by one record per sampled client; ``index.npz`` (the client of each slot);
  ``fresh.npz``, the state a client starts from; ``store.json`` (the round the files hold,
  the run's fingerprint, the other files' checksums); ``journal-<round>.npz``, one per
  retained checkpoint. Every file is checksummed and verified when read: a damaged one is
  a one-line ``ValueError`` naming it (and the client, for a row), never used.

  Consistency with checkpoints: rows written back after a chunk stay in memory (pending)
  until the next checkpoint. :meth:`journal` writes them, with the rows they replace, to
  that round's journal (atomically) before the checkpoint; :meth:`apply` writes them into
  the files after it, on a host thread, recording its intent first. A run killed anywhere
  resumes from the newest intact checkpoint, and :meth:`recover` brings the files to its
  round along the journals: forward (a journal not applied yet) or back (the newest
  checkpoint was damaged or lost: its rows are undone), so a streamed run falls back to an
  older checkpoint exactly as an in-memory one. :meth:`keep_journals` drops the journals
  of checkpoints no longer kept. Without checkpoints, each chunk's rows are applied at once.

  Args:
    directory: the folder of the files; created, or emptied of this class's files when
      ``create`` (no other file in it is touched). Temporary files a killed write left
      there are removed (so only the process holding the run's ``checkpoint_dir`` lock may
      construct one; :meth:`open` only reads).
    fresh: one client's initial state, ``(algorithm's state, codecs' state)`` (``()`` for
      one that is not paged), arrays without a leading axis.
    num_clients: ``K``.
    run: the run's fingerprint (a string), checked against the files.
    create: a new store (every client fresh) rather than opening the existing one.
    durable: flush every :meth:`apply` to the disk and record it (``False``: a run's
      temporary store, never reopened, skips the flushes and the index).

  :func:`fedco.simulate` keeps the store in ``<checkpoint_dir>/client_state`` when it
  checkpoints (where it stays after the run), else in a temporary ``fedco-client-state-*``
  folder (``TMPDIR`` decides where) that it removes at the end; such a folder holds an
  owner file the run holds locked (``flock``), and the next run removes the folders whose
  owner file no process holds (:func:`remove_abandoned`).

  Examples:
    A streamed SCAFFOLD run over 6 clients, 2 a round, in chunks of 2 rounds: the device
    holds the last chunk's 4 clients' control variates, the disk every sampled client's,
    one record each:

    >>> import os, tempfile
    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> import fedco
    >>> rng = np.random.default_rng(0)
    >>> clients = [{"x": rng.normal(size=(4, 2)).astype(np.float32)} for _ in range(6)]
    >>> folder = tempfile.mkdtemp()
    >>> store = fedco.data.write_store(os.path.join(folder, "clients"), clients)
    >>> loss = lambda w, e: jnp.sum((w - e["x"]) ** 2)
    >>> result = fedco.simulate(
    ...   fedco.plain(loss), fedco.scaffold(0.1, 2), store, jnp.zeros(2), rounds=4,
    ...   chunk_rounds=2, clients_per_round=2, batch_size=2, evaluate=False,
    ...   checkpoint_dir=os.path.join(folder, "ckpt"),
    ... )
    >>> result.metrics["clients"].tolist()  # sampled in rounds 1-2, then 3-4
    [[3, 4], [1, 3], [0, 4], [3, 5]]
    >>> result.state.clients.ids.tolist()  # the device's pages: rounds 3-4's clients
    [0, 3, 4, 5]
    >>> directory = os.path.join(folder, "ckpt", "client_state")
    >>> states = fedco.runtime.StateStore.open(directory, result.state)
    >>> states.touched.astype(int).tolist()  # client 2 was never sampled: no row on disk
    [1, 1, 0, 1, 1, 1]
    >>> sorted(n for n in os.listdir(directory) if not n.startswith("journal"))
    ['fresh.npz', 'index.npz', 'rows.bin', 'store.json']
    >>> os.path.getsize(os.path.join(directory, "rows.bin"))  # 5 records of 8 + 4 + 8
    100
    >>> fedco.runtime.unpaged(result.state, states).clients.c_plus.shape  # [K, p]
    (6, 2)
  """

  def __init__(
    self,
    directory,
    fresh,
    num_clients: int,
    run: str = "",
    *,
    create: bool = True,
    durable: bool = True,
    _clean: bool = True,
    _readonly: bool = False,
  ):
    self.directory, self.num_clients, self.run = os.fspath(directory), int(num_clients), run
    self.durable = durable
    leaves, self.treedef = jax.tree.flatten(jax.tree.map(np.asarray, fresh))
    self.fresh = leaves
    self._disk = state_files.Disk(
      self.directory,
      leaves,
      self.num_clients,
      run,
      create=create,
      durable=durable,
      clean=_clean,
      readonly=_readonly,
    )
    self._pending = self._inflight = _no_rows(self.fresh)  # (sorted ids, [leaf rows])
    self._planned: Optional[state_files.Journal] = None
    self._temporary = False  # a run's temporary folder (of_run), removed by close
    self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fedco-state")
    self._writing: Optional[concurrent.futures.Future] = None

  @classmethod
  def of_run(cls, fresh, num_clients: int, folder: Optional[str], run: str, done: int):
    """A streamed run's client state: in ``folder`` (``<checkpoint_dir>/client_state``,
    durable, created when the run starts at round 0) or, with ``folder=None``, in a new
    temporary ``fedco-client-state-*`` folder that :meth:`close` removes; brought to round
    ``done`` (:meth:`recover`)."""
    temporary = folder is None
    directory = temporary_folder() if folder is None else folder  # folder is None: temporary
    try:
      store = cls(directory, fresh, num_clients, run=run, create=done == 0, durable=not temporary)
    except BaseException:
      if temporary:
        remove_temporary(directory)
      raise
    store._temporary = temporary
    try:
      store.recover(done)
    except BaseException:
      store.close()
      raise
    return store

  @classmethod
  def open(cls, directory, like) -> "StateStore":
    """The store a streamed run left in ``directory`` (read only: its files are opened for
    reading and nothing is removed or written, so a read-only folder works).

    Args:
      directory: the store's folder, ``<checkpoint_dir>/client_state``.
      like: a state of that run (e.g. its ``SimulationResult.state``): the structure of a
        client's state.

    Returns:
      The :class:`StateStore`, its files as the run left them.

    Raises:
      ValueError: ``directory`` holds no client state of that structure, or a damaged
        file (one line naming it), or a write a killed run left unfinished (resume it).
    """
    if not isinstance(like, tuple) or not hasattr(like, "clients") or not is_paged(like):
      raise ValueError(
        "like must be a state of a streamed run whose client state is on disk (its "
        f"SimulationResult.state, holding fedco.runtime.Pages), got {type(like).__name__}"
      )
    directory = os.fspath(directory)
    if not os.path.isfile(os.path.join(directory, state_files.META)):
      raise ValueError(f"directory {directory!r} holds no client state (no store.json)")
    meta = state_files.load_meta(os.path.join(directory, state_files.META))
    treedef = jax.tree.structure(fresh(like))
    # jaxlib's PyTreeDef (a C extension) has no stubs
    names = [f"arr_{i}" for i in range(treedef.num_leaves)]  # type: ignore[attr-defined]
    leaves = state_files.load_arrays(os.path.join(directory, state_files.FRESH), names)
    store = cls(
      directory,
      jax.tree.unflatten(treedef, [leaves[n] for n in names]),
      meta.get("clients", 0),
      meta.get("run", ""),
      create=False,
      _clean=False,
      _readonly=True,
    )
    if store._disk.applying:
      store.close()
      raise ValueError(
        f"client state in {directory} was left half-written by a killed run; resume that "
        "run (fedco.simulate with its checkpoint_dir) to complete it"
      )
    return store

  @property
  def round(self) -> int:
    """The round the files hold."""
    return self._disk.round

  @property
  def touched(self) -> np.ndarray:
    """bool ``[K]``: which clients have a row in the files."""
    return self._disk.slots >= 0

  def _ids(self, ids) -> np.ndarray:
    ids = np.asarray(ids)
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer) and ids.size:
      raise ValueError(f"ids must be a list of client ids (ints), got {ids!r}")
    ids = ids.astype(np.int64)
    if ids.size and (ids.min() < 0 or ids.max() > self.num_clients):
      raise ValueError(
        f"ids must be client ids in 0..{self.num_clients - 1} (or {self.num_clients}, "
        f"padding), got {ids.min()}..{ids.max()}"
      )
    return ids

  def read(self, ids) -> Any:
    """The states of clients ``ids`` (a pytree of ``[len(ids), ...]`` NumPy arrays); an id
    ``K`` (padding) reads the fresh state. A damaged row is a one-line ``ValueError``."""
    ids = self._ids(ids)
    out = [np.repeat(a[None], ids.size, axis=0) for a in self.fresh]
    newer = [rows for rows in (self._inflight, self._pending) if rows[0].size]
    slots = np.full(ids.size, -1, np.int64)
    real = ids < self.num_clients
    slots[real] = self._disk.slots[ids[real]]  # one snapshot: the writer replaces it whole
    for have, _ in newer:  # rows being written, or pending: not read from the files
      slots[np.isin(ids, have)] = -1
    stored = np.flatnonzero(slots >= 0)
    if stored.size:
      records = self._disk.read(ids[stored], slots[stored])
      for o, v in zip(out, self._disk.codec.decode(records)):
        o[stored] = v
    for rows in newer:  # newer than the files: rows being written, then written back since
      _overlay(rows, ids, out)
    return jax.tree.unflatten(self.treedef, out)

  def has_rows(self, ids) -> np.ndarray:
    """bool ``[len(ids)]``: which of clients ``ids`` have a row (in the files, pending or
    being written); the others (and padding) read the fresh state."""
    ids = self._ids(ids)
    out = np.zeros(ids.size, bool)
    out[ids < self.num_clients] = self._disk.slots[ids[ids < self.num_clients]] >= 0
    for have, _ in (self._inflight, self._pending):
      out |= np.isin(ids, have)
    return out

  def write(self, ids, values) -> None:
    """Keeps the rows ``values`` (a pytree of ``[len(ids), ...]``) of clients ``ids``
    (padding ids ``K`` are dropped) as pending, until :meth:`journal` / :meth:`apply`."""
    ids = self._ids(ids)
    real = ids < self.num_clients
    new = (ids[real], [np.asarray(v)[real] for v in jax.tree.leaves(values)])
    self._pending = _merge(self._pending, new)

  def journal(self, round_: int) -> None:
    """Write round ``round_``'s journal (before its checkpoint): the pending rows and the
    rows they replace, after the rows being written have reached the files. A round the
    files already hold with nothing pending (a checkpoint saved again) writes none."""
    self._wait()
    if int(round_) == self._disk.round and not self._pending[0].size:
      return
    self._planned = self._disk.plan(int(round_), *self._pending)
    self._disk.save_journal(self._planned)

  def apply(self, round_: int) -> None:
    """Write the pending rows into the files, on a host thread while the next chunk runs
    (the previous write is waited for first); the files then hold round ``round_``. Without
    a journal (a run without checkpoints) the rows are also encoded and checksummed there,
    so the device is not kept waiting."""
    self._wait()
    round_ = int(round_)
    planned, self._planned = self._planned, None
    if planned is not None and planned.round != round_:
      planned = None
    if planned is None and round_ == self._disk.round and not self._pending[0].size:
      return
    rows, disk = self._pending, self._disk
    self._inflight, self._pending = rows, _no_rows(self.fresh)
    if planned is None:  # one thread: plans and writes stay in order
      self._writing = self._writer.submit(lambda: disk.apply(disk.plan(round_, *rows)))
    else:
      self._writing = self._writer.submit(disk.apply, planned)

  def keep_journals(self, rounds) -> None:
    """Removes the journals of rounds not in ``rounds`` (the checkpoints still kept)."""
    keep = {int(r) for r in rounds}
    self._disk.prune(lambda r: r in keep)

  def _wait(self) -> None:
    if self._writing is not None:
      self._writing.result()  # a failed write raises here
      self._writing, self._inflight = None, _no_rows(self.fresh)

  def recover(self, round_: int) -> None:
    """Bring the files to round ``round_`` (a restored checkpoint's): a write a kill left
    half done is completed, then the journals are applied forward or undone back to it.

    Raises:
      ValueError: no retained journal leads from the files' round to ``round_``, or one
        of them is damaged (one line naming it).
    """
    self._wait()
    self._disk.recover(int(round_))

  def close(self, remove: bool = False) -> None:
    """Releases the files (``remove``: deletes the folder; a temporary folder of
    :meth:`of_run` is always removed)."""
    try:
      if getattr(self, "_writer", None) is not None:
        self._writer.shutdown(wait=True)
        self._wait()  # a failed write raises here
    finally:
      try:
        if getattr(self, "_disk", None) is not None:
          self._disk.close()
      finally:
        if getattr(self, "_temporary", False):
          remove_temporary(self.directory)
        elif remove:
          shutil.rmtree(self.directory, ignore_errors=True)
