"""The files of a streamed run's client state: :class:`~fedco.runtime.StateStore`'s disk side.

A store's folder holds (decision 95):

* ``rows.bin``: dense records, one a slot; a client takes the next free slot the first time
  its row is written. A record is the crc32 of the rest (uint32), the client's id (int32)
  and the bytes of each leaf of its state: disk grows by one record per sampled client.
* ``index.npz``: ``owners`` (int32, one a used slot: the client whose row it holds).
* ``fresh.npz``: the state a client starts from.
* ``store.json``: the round the files hold and ``head``, the token of the journal that
  brought them there, the run's fingerprint, ``K``, the slots in use, the checksums of
  ``index.npz`` and ``fresh.npz``, and the journal being applied, if any.
* ``journal-<round>.npz``: per retained checkpoint round, the records that round wrote
  (redo) and the records they replaced (undo), the round before it (its ``base``), its own
  random ``token`` and its ``parent`` (the files' ``head`` it was planned on): the files go
  forward or back along these to any retained checkpoint's round, and a journal planned on
  other files than those (a stale one, from before a fallback) is never applied.

Every file carries a crc32 (the ``.npz`` files an array ``crc`` over their other arrays,
``store.json`` a field ``crc``, each record its own) that is verified whenever it is read:
damage is a one-line ``ValueError`` naming the file (and the client), never used. Any
other error reading a file (permissions, too many open files, an I/O error) is an
``OSError`` of the same kind saying the file cannot be read, not that it is damaged.
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, List, NamedTuple, Optional, Tuple, cast

import numpy as np

from fedco import io
from fedco.runtime.state_records import (  # noqa: F401  # what the store's users call
  DAMAGE,
  FORMAT,
  Records,
  arrays_crc,
  cannot_read,
  damaged,
  earlier_version,
  load_arrays,
  load_meta,
  new_token,
  save_arrays,
  save_meta,
)

ROWS, INDEX, FRESH, META = "rows.bin", "index.npz", "fresh.npz", "store.json"
_JOURNAL = re.compile(r"journal-(\d+)\.npz")
_OLD_FILES = re.compile(r"leaf-\d+\.bin|touched\.npy|journal\.npz")  # format 1's files


class Journal(NamedTuple):
  """What round ``round`` wrote over round ``base``: clients ``ids`` (sorted) at ``slots``;
  ``had``: whether each had a slot before (its record ``old``); ``new``: its record after;
  ``used``: the slots in use at ``base``; ``token``: its own; ``parent``: the files' head
  token it was planned on (the files it applies to)."""

  round: int
  base: int
  used: int
  token: int
  parent: int
  ids: np.ndarray
  slots: np.ndarray
  had: np.ndarray
  old: np.ndarray
  new: np.ndarray


def _runs(slots: np.ndarray):
  """``(i, j)``: the runs of consecutive slots in ``slots`` (ascending)."""
  cuts = np.flatnonzero(np.diff(slots) != 1) + 1
  return (
    zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [slots.size]])) if slots.size else ()
  )


class Disk:
  """The files of one store (see the module): records by slot, the index, journals.

  ``slots`` (int64 ``[K]``, ``-1``: no row) and ``owners`` mirror ``index.npz``; ``round`` is
  the round the files hold. Opening verifies ``store.json``, ``index.npz`` and
  ``fresh.npz``; records are verified as they are read.
  """

  def __init__(self, directory, fresh, num_clients, run, *, create, durable, clean, readonly=False):
    self.directory, self.num_clients, self.run = directory, num_clients, run
    self.durable, self.codec, self.readonly = durable, Records(fresh), readonly
    if clean and os.path.isdir(directory):  # temporaries a killed write left (caller: locked)
      names = {n[len(io.TMP_PREFIX) : -9] for n in os.listdir(directory)}
      io.remove_stale_temporaries(directory, [n for n in names if self._ours(n)])
    self.fd = -1
    if create:
      self._create(fresh)
    else:
      self._open()

  def path(self, name: str) -> str:
    return os.path.join(self.directory, name)

  @staticmethod
  def _ours(name: str) -> bool:
    return name in (ROWS, INDEX, FRESH, META) or bool(
      _JOURNAL.fullmatch(name) or _OLD_FILES.fullmatch(name)
    )

  def _create(self, fresh):
    os.makedirs(self.directory, exist_ok=True)
    for name in os.listdir(self.directory):  # only what a store writes
      if self._ours(name):
        os.remove(self.path(name))
    self.fd = os.open(self.path(ROWS), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o666)
    self.slots, self.owners = np.full(self.num_clients, -1, np.int64), np.zeros(0, np.int32)
    self.head = new_token()
    arrays = {f"arr_{i}": a for i, a in enumerate(fresh)}
    save_arrays(self.path(FRESH), arrays)
    self.fresh_crc = arrays_crc(arrays)
    save_arrays(self.path(INDEX), {"owners": self.owners})
    self.applying = None
    self._meta(0)

  def _meta(self, round_, applying=None, used=None):
    self.round = int(round_)
    used = self.owners.size if used is None else used
    save_meta(
      self.path(META),
      {
        "format": FORMAT,
        "round": self.round,
        "head": self.head,
        "run": self.run,
        "clients": self.num_clients,
        "record_bytes": self.codec.nbytes,
        "used": int(used),
        "owners_crc": arrays_crc({"owners": self.owners[:used]}),
        "fresh_crc": self.fresh_crc,
        "applying": applying,
      },
    )

  def _open(self):
    names = os.listdir(self.directory) if os.path.isdir(self.directory) else []
    if any(_OLD_FILES.fullmatch(n) for n in names) and META not in names:
      raise earlier_version(self.directory)  # format 1 without its store.json
    meta = load_meta(self.path(META))
    fields = ("round", "head", "run", "clients", "record_bytes", "used", "owners_crc")
    if meta.get("format") != FORMAT or any(f not in meta for f in fields + ("fresh_crc",)):
      raise damaged(self.path(META), "not a fedco client-state store of this version")
    if (meta["run"], meta["clients"], meta["record_bytes"]) != (
      self.run,
      self.num_clients,
      self.codec.nbytes,
    ):
      raise ValueError(
        f"client state in {self.directory} was written by another run (or another model "
        "or algorithm); use another checkpoint_dir"
      )
    fresh = load_arrays(self.path(FRESH), [f"arr_{i}" for i in range(len(self.codec.layout))])
    if arrays_crc(fresh) != meta["fresh_crc"]:
      raise damaged(self.path(FRESH), "it does not match store.json")
    self.fresh_crc, used = meta["fresh_crc"], int(meta["used"])
    owners = load_arrays(self.path(INDEX), ["owners"])["owners"].astype(np.int32)
    if owners.size < used or arrays_crc({"owners": owners[:used]}) != meta["owners_crc"]:
      raise damaged(self.path(INDEX), "it does not match store.json")
    owners = owners[:used]
    if owners.size and (owners.min() < 0 or owners.max() >= self.num_clients):
      raise damaged(self.path(INDEX), "client ids out of range")
    if np.unique(owners).size != owners.size:
      raise damaged(self.path(INDEX), "a client with two slots")
    try:  # a reader (StateStore.open) opens it read-only: it works in a read-only folder
      self.fd = os.open(self.path(ROWS), os.O_RDONLY if self.readonly else os.O_RDWR)
    except FileNotFoundError:
      raise damaged(self.path(ROWS), "missing") from None
    except OSError as err:
      raise cannot_read(self.path(ROWS), err) from None
    if os.fstat(self.fd).st_size < used * self.codec.nbytes:
      self.close()
      raise damaged(self.path(ROWS), f"shorter than its {used} rows")
    self._set_owners(owners)
    self.round, self.head, self.applying = int(meta["round"]), meta["head"], meta.get("applying")

  def _set_owners(self, owners):
    slots = np.full(self.num_clients, -1, np.int64)
    slots[owners] = np.arange(owners.size)
    self.slots, self.owners = slots, owners  # one assignment each: readers see either

  def read(self, ids: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """The verified records of clients ``ids`` at ``slots``."""
    out = np.empty((ids.size, self.codec.nbytes), np.uint8)
    order = np.argsort(slots, kind="stable")
    buf = np.empty_like(out)
    for i, j in _runs(slots[order]):
      got = io.pread_all(self.fd, buf[i:j], int(slots[order[i]]) * self.codec.nbytes)
      if got != (j - i) * self.codec.nbytes:
        raise damaged(self.path(ROWS), f"the row of client {int(ids[order[i]])} is missing")
    out[order] = buf
    self.codec.check(self.path(ROWS), ids, out)
    return out

  def _write(self, records: np.ndarray, slots: np.ndarray) -> None:
    order = np.argsort(slots, kind="stable")
    records, slots = records[order], slots[order]
    for i, j in _runs(slots):
      io.pwrite_all(self.fd, records[i:j], int(slots[i]) * self.codec.nbytes)
    if self.durable:
      os.fsync(self.fd)

  def plan(self, round_: int, ids: np.ndarray, leaves) -> Journal:
    """The journal of round ``round_`` writing rows ``leaves`` of clients ``ids`` (sorted)."""
    slots = self.slots[ids]
    had = slots >= 0
    slots[~had] = self.owners.size + np.arange(int((~had).sum()))
    old = np.zeros((ids.size, self.codec.nbytes), np.uint8)
    if self.durable and had.any():
      old[had] = self.read(ids[had], slots[had])
    new = self.codec.encode(ids, leaves)
    return Journal(
      round_, self.round, self.owners.size, new_token(), self.head, ids, slots, had, old, new
    )

  def save_journal(self, journal: Journal) -> None:
    save_arrays(self.path(f"journal-{journal.round}.npz"), journal._asdict())

  def load_journal(self, round_: int) -> Journal:
    arrays = load_arrays(self.path(f"journal-{round_}.npz"), Journal._fields)
    j = Journal(**cast(Dict[str, Any], arrays))  # 0-d arrays for the ints until _replace
    return j._replace(
      round=int(j.round),
      base=int(j.base),
      used=int(j.used),
      token=int(j.token),
      parent=int(j.parent),
    )

  def _headers(self) -> Dict[int, Optional[Tuple[int, int, int]]]:
    """Each journal's ``(base, token, parent)``, read without its records (not verified: a
    journal on the way is loaded whole, and verified, before anything is written); a
    journal whose header cannot be read maps to ``None``."""
    out: Dict[int, Optional[Tuple[int, int, int]]] = {}
    for r in self.journals():
      try:
        with np.load(self.path(f"journal-{r}.npz"), allow_pickle=False) as f:
          base, token, parent = (int(f[k]) for k in ("base", "token", "parent"))
          out[r] = (base, token, parent)
      except (OSError, *DAMAGE):
        out[r] = None
    return out

  def journals(self) -> List[int]:
    names = os.listdir(self.directory)
    return sorted(int(m.group(1)) for m in map(_JOURNAL.fullmatch, names) if m)

  def apply(self, journal: Journal, undo: bool = False) -> None:
    """Bring the files from ``journal.base`` to ``journal.round`` (or back, ``undo``): the
    intent first (a kill then completes it), then the records, the index, the round."""
    added = journal.ids[~journal.had][np.argsort(journal.slots[~journal.had])]
    owners = self.owners[: journal.used]
    if not undo:
      owners = np.concatenate([owners, added.astype(np.int32)])
    if self.durable:
      intent = {"round": journal.round, "undo": undo, "token": journal.token}
      self._meta(self.round, intent, used=journal.used)
    if undo:
      self._write(journal.old[journal.had], journal.slots[journal.had])
    else:
      self._write(journal.new, journal.slots)
    if self.durable:
      save_arrays(self.path(INDEX), {"owners": owners})
    self._set_owners(owners)
    self.head = journal.parent if undo else journal.token
    if self.durable:
      self._meta(journal.base if undo else journal.round)
    else:
      self.round = journal.base if undo else journal.round
    self.applying = None

  def recover(self, target: int) -> None:
    """The files brought to round ``target`` (to the state its journal, if any, leads to)
    along the journals: undoing the journal the files' head is, or redoing one planned on
    it. Every journal is kept (a later resume may restore a newer checkpoint that failed
    to read this time); :meth:`prune` drops those of checkpoints no longer kept."""
    if self.applying:  # killed while applying a journal: finish it (idempotent)
      journal = self.load_journal(int(self.applying["round"]))
      if journal.token != self.applying.get("token"):
        raise damaged(self.path(META), "the journal it was applying was replaced")
      self.apply(journal, bool(self.applying["undo"]))
    headers = self._headers()
    want = headers.get(target)
    way = self._way(headers, target, None if want is None else want[1])
    if way is None:
      for r, header in sorted(headers.items()):  # a damaged journal may be why: name it
        if header is None:
          self.load_journal(r)
      raise ValueError(
        f"client state in {self.directory} holds round {self.round}, the checkpoint "
        f"restored round {target}, and no journal leads there; delete the checkpoint "
        "directory to start the run again"
      )
    path = []  # every journal on the way loaded and verified before anything is written
    for r, undo in way:
      journal = self.load_journal(r)
      if (journal.base, journal.token, journal.parent) != headers[r]:
        raise damaged(self.path(f"journal-{r}.npz"), "checksum mismatch")
      path.append((journal, undo))
    for journal, undo in path:
      self.apply(journal, undo)

  def _way(self, headers, target: int, token):
    """The shortest list of ``(journal round, undo)`` from the files' ``(round, head)`` to
    round ``target`` (with head ``token`` when that round has a journal), or ``None``."""
    start = (self.round, self.head)
    ways: Dict[Tuple[int, int], List[Tuple[int, bool]]] = {start: []}
    frontier = [start]
    while frontier:
      nxt = []
      for at, head in frontier:
        if at == target and (token is None or head == token):
          return ways[(at, head)]
        moves = []
        back = headers.get(at)
        if back is not None and back[1] == head:  # the files' head is this journal: undo it
          moves.append(((back[0], back[2]), (at, True)))
        for r, h in headers.items():  # a journal planned on these files: redo it
          if h is not None and h[0] == at and h[2] == head and r > at:
            moves.append(((r, h[1]), (r, False)))
        for state, step in moves:
          if state not in ways:
            ways[state] = ways[(at, head)] + [step]
            nxt.append(state)
      frontier = nxt
    return None

  def prune(self, keep) -> None:
    """Removes the journals of the rounds ``keep(round)`` is false for."""
    for r in self.journals():
      if not keep(r):
        os.remove(self.path(f"journal-{r}.npz"))

  def close(self) -> None:
    if self.fd >= 0:
      os.close(self.fd)
    self.fd = -1
