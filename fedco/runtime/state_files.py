"""The files of a streamed run's client state: :class:`~fedco.runtime.StateStore`'s disk side.

A store's folder holds (decision 95):

* ``rows.bin``: dense records, one a slot; a client takes the next free slot the first time
  its row is written. A record is the crc32 of the rest (uint32), the client's id (int32)
  and the bytes of each leaf of its state: disk grows by one record per sampled client.
* ``index.npz``: ``owners`` (int32, one a used slot: the client whose row it holds).
* ``fresh.npz``: the state a client starts from.
* ``store.json``: the round the files hold, the run's fingerprint, ``K``, the slots in use,
  the checksums of ``index.npz`` and ``fresh.npz``, and the journal being applied, if any.
* ``journal-<round>.npz``: per retained checkpoint round, the records that round wrote
  (redo) and the records they replaced (undo), and the round before it (its ``base``): the
  files go forward or back along these to any retained checkpoint's round.

Every file carries a crc32 (the ``.npz`` files an array ``crc`` over their other arrays,
``store.json`` a field ``crc``, each record its own) that is verified whenever it is read:
damage is a one-line ``ValueError`` naming the file (and the client), never used.
"""

from __future__ import annotations

import json
import os
import re
import zlib
from typing import Dict, List, NamedTuple

import numpy as np

from fedco import io

ROWS, INDEX, FRESH, META = "rows.bin", "index.npz", "fresh.npz", "store.json"
_JOURNAL = re.compile(r"journal-(\d+)\.npz")
_OLD_FILES = re.compile(r"leaf-\d+\.bin|touched\.npy|journal\.npz")  # format 1's files
_HEADER = 8  # crc32, client id


def _crc(arrays: Dict[str, np.ndarray], crc: int = 0) -> int:
  for name in sorted(arrays):
    a = np.ascontiguousarray(arrays[name])
    crc = zlib.crc32(f"{name}{a.shape}{a.dtype.str}".encode(), crc)
    crc = zlib.crc32(a.reshape(-1).view(np.uint8), crc)
  return crc


def damaged(path, why: str) -> ValueError:
  """The one-line error of a damaged client-state file."""
  return ValueError(
    f"client state file {os.fspath(path)} is damaged ({why}); the run cannot use it: delete "
    "the checkpoint directory to start the run again"
  )


def save_arrays(path, arrays: Dict[str, np.ndarray]) -> None:
  """``arrays`` and their checksum ``crc`` into the ``.npz`` file ``path``, atomically."""
  sums = np.uint32(_crc(arrays))
  io.atomic_write(path, lambda f: np.savez(f, **arrays, crc=sums), mode="wb")


def load_arrays(path, names) -> Dict[str, np.ndarray]:
  """The arrays ``names`` of a :func:`save_arrays` file, checksum verified."""
  try:
    with np.load(path, allow_pickle=False) as f:
      arrays = {k: f[k] for k in f.files}
  except FileNotFoundError:
    raise damaged(path, "missing") from None
  except Exception as err:  # pylint: disable=broad-except  # zip, format and read errors
    raise damaged(path, f"unreadable: {type(err).__name__}") from None
  want = arrays.pop("crc", None)
  if want is None or set(arrays) != set(names) or int(want) != _crc(arrays):
    raise damaged(path, "checksum mismatch" if want is not None else "no checksum")
  return arrays


def save_meta(path, meta: dict) -> None:
  io.atomic_write_json(path, {**meta, "crc": zlib.crc32(json.dumps(meta, sort_keys=True).encode())})


def load_meta(path) -> dict:
  try:
    with open(path) as f:
      meta = json.load(f)
    if "crc" not in meta:
      raise damaged(path, "no checksum: written by an older fedco, or damaged")
    crc = meta.pop("crc")
  except ValueError as err:
    if str(err).startswith("client state file"):
      raise
    raise damaged(path, f"unreadable: {type(err).__name__}") from None
  except FileNotFoundError:
    raise damaged(path, "missing") from None
  except Exception as err:  # pylint: disable=broad-except  # JSON, encoding, not a dict
    raise damaged(path, f"unreadable: {type(err).__name__}") from None
  if crc != zlib.crc32(json.dumps(meta, sort_keys=True).encode()):
    raise damaged(path, "checksum mismatch")
  return meta


class Records:
  """Rows of client state <-> records: ``[n, nbytes]`` uint8, checksummed per row."""

  def __init__(self, fresh: List[np.ndarray]):
    self.layout = [(a.shape, a.dtype) for a in fresh]
    sizes = [a.nbytes for a in fresh]
    self.offsets = list(_HEADER + np.cumsum([0] + sizes[:-1]).astype(int))
    self.sizes = sizes
    self.nbytes = _HEADER + sum(sizes)

  def encode(self, ids: np.ndarray, leaves) -> np.ndarray:
    out = np.empty((ids.size, self.nbytes), np.uint8)
    if not ids.size:
      return out
    out[:, 4:8] = ids.astype("<i4").view(np.uint8).reshape(-1, 4)
    for leaf, off, size in zip(leaves, self.offsets, self.sizes):
      flat = np.ascontiguousarray(leaf).reshape(ids.size, -1)
      out[:, off : off + size] = flat.view(np.uint8).reshape(ids.size, size)
    out[:, :4] = self._crcs(out).view(np.uint8).reshape(-1, 4)
    return out

  @staticmethod
  def _crcs(records: np.ndarray) -> np.ndarray:
    return np.array([zlib.crc32(r[4:]) for r in records], "<u4")

  def check(self, path, ids: np.ndarray, records: np.ndarray) -> None:
    """Each record's checksum and client id; the first damaged one is a one-line error."""
    ok = records[:, :4].copy().view("<u4").ravel() == self._crcs(records)
    ok &= records[:, 4:8].copy().view("<i4").ravel() == ids
    if not ok.all():
      raise damaged(path, f"the row of client {int(ids[np.argmin(ok)])} fails its checksum")

  def decode(self, records: np.ndarray) -> List[np.ndarray]:
    n = records.shape[0]
    return [
      np.ascontiguousarray(records[:, off : off + size]).view(dtype).reshape((n,) + shape)
      for (shape, dtype), off, size in zip(self.layout, self.offsets, self.sizes)
    ]


class Journal(NamedTuple):
  """What round ``round`` wrote over round ``base``: clients ``ids`` (sorted) at ``slots``;
  ``had``: whether each had a slot before (its record ``old``); ``new``: its record after;
  ``used``: the slots in use at ``base``."""

  round: int
  base: int
  used: int
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

  def __init__(self, directory, fresh, num_clients, run, *, create, durable, clean):
    self.directory, self.num_clients, self.run = directory, num_clients, run
    self.durable, self.codec = durable, Records(fresh)
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
    arrays = {f"arr_{i}": a for i, a in enumerate(fresh)}
    save_arrays(self.path(FRESH), arrays)
    self.fresh_crc = _crc(arrays)
    save_arrays(self.path(INDEX), {"owners": self.owners})
    self.applying = None
    self._meta(0)

  def _meta(self, round_, applying=None, used=None):
    self.round = int(round_)
    used = self.owners.size if used is None else used
    save_meta(
      self.path(META),
      {
        "format": 2,
        "round": self.round,
        "run": self.run,
        "clients": self.num_clients,
        "record_bytes": self.codec.nbytes,
        "used": int(used),
        "owners_crc": _crc({"owners": self.owners[:used]}),
        "fresh_crc": self.fresh_crc,
        "applying": applying,
      },
    )

  def _open(self):
    meta = load_meta(self.path(META))
    fields = ("round", "run", "clients", "record_bytes", "used", "owners_crc", "fresh_crc")
    if meta.get("format") != 2 or any(f not in meta for f in fields):
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
    if _crc(fresh) != meta["fresh_crc"]:
      raise damaged(self.path(FRESH), "it does not match store.json")
    self.fresh_crc, used = meta["fresh_crc"], int(meta["used"])
    owners = load_arrays(self.path(INDEX), ["owners"])["owners"].astype(np.int32)
    if owners.size < used or _crc({"owners": owners[:used]}) != meta["owners_crc"]:
      raise damaged(self.path(INDEX), "it does not match store.json")
    owners = owners[:used]
    if owners.size and (owners.min() < 0 or owners.max() >= self.num_clients):
      raise damaged(self.path(INDEX), "client ids out of range")
    if np.unique(owners).size != owners.size:
      raise damaged(self.path(INDEX), "a client with two slots")
    try:
      self.fd = os.open(self.path(ROWS), os.O_RDWR)
    except OSError as err:
      raise damaged(self.path(ROWS), err.strerror or "unreadable") from None
    if os.fstat(self.fd).st_size < used * self.codec.nbytes:
      self.close()
      raise damaged(self.path(ROWS), f"shorter than its {used} rows")
    self._set_owners(owners)
    self.round, self.applying = int(meta["round"]), meta.get("applying")

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
      got = os.preadv(self.fd, [buf[i:j]], int(slots[order[i]]) * self.codec.nbytes)
      if got != (j - i) * self.codec.nbytes:
        raise damaged(self.path(ROWS), f"the row of client {int(ids[order[i]])} is missing")
    out[order] = buf
    self.codec.check(self.path(ROWS), ids, out)
    return out

  def _write(self, records: np.ndarray, slots: np.ndarray) -> None:
    order = np.argsort(slots, kind="stable")
    records, slots = records[order], slots[order]
    for i, j in _runs(slots):
      os.pwrite(self.fd, records[i:j], int(slots[i]) * self.codec.nbytes)
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
    return Journal(round_, self.round, self.owners.size, ids, slots, had, old, new)

  def save_journal(self, journal: Journal) -> None:
    save_arrays(self.path(f"journal-{journal.round}.npz"), journal._asdict())

  def load_journal(self, round_: int) -> Journal:
    arrays = load_arrays(self.path(f"journal-{round_}.npz"), Journal._fields)
    j = Journal(**arrays)
    return j._replace(round=int(j.round), base=int(j.base), used=int(j.used))

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
      self._meta(self.round, {"round": journal.round, "undo": undo}, used=journal.used)
    if undo:
      self._write(journal.old[journal.had], journal.slots[journal.had])
    else:
      self._write(journal.new, journal.slots)
    if self.durable:
      save_arrays(self.path(INDEX), {"owners": owners})
    self._set_owners(owners)
    if self.durable:
      self._meta(journal.base if undo else journal.round)
    else:
      self.round = journal.base if undo else journal.round
    self.applying = None

  def recover(self, target: int) -> None:
    """The files brought to round ``target`` along the journals; later journals removed."""
    if self.applying:  # killed while applying a journal: finish it (idempotent)
      self.apply(self.load_journal(int(self.applying["round"])), bool(self.applying["undo"]))
    have, at, path = self.journals(), self.round, []  # the way there first, then the writes
    while at != target:
      if at > target and at in have:
        journal, undo = self.load_journal(at), True
        ok = target <= journal.base < at
      else:
        later = [r for r in have if at < r <= target]
        journal, undo = (self.load_journal(later[0]) if later else None), False
        ok = journal is not None and journal.base == at
      if not ok:
        raise ValueError(
          f"client state in {self.directory} holds round {self.round}, the checkpoint "
          f"restored round {target}, and no journal leads there; delete the checkpoint "
          "directory to start the run again"
        )
      path.append((journal, undo))
      at = journal.base if undo else journal.round
    for journal, undo in path:
      self.apply(journal, undo)
    self.prune(lambda r: r <= target)

  def prune(self, keep) -> None:
    """Removes the journals of the rounds ``keep(round)`` is false for."""
    for r in self.journals():
      if not keep(r):
        os.remove(self.path(f"journal-{r}.npz"))

  def close(self) -> None:
    if self.fd >= 0:
      os.close(self.fd)
    self.fd = -1
