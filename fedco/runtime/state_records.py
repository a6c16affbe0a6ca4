"""Checksummed files and records of a streamed run's client state (decision 95).

The pieces :mod:`fedco.runtime.state_files` builds a store from: ``.npz`` files with an
array ``crc`` over their other arrays (:func:`save_arrays`, :func:`load_arrays`), a JSON
file with a field ``crc`` (:func:`save_meta`, :func:`load_meta`), the records of client
rows (:class:`Records`: a crc32, the client id and the state's bytes) and whole-buffer
positional reads and writes (:func:`fedco.io.pwrite_all`, :func:`fedco.io.pread_all`). A damaged file is a one-line ``ValueError`` (:func:`damaged`);
one that cannot be read for another reason an ``OSError`` of the same kind
(:func:`cannot_read`); one of an earlier fedco says so (:func:`earlier_version`).
"""

from __future__ import annotations

import json
import os
import zipfile
import zlib
from typing import Dict, List

import numpy as np

from fedco import io

META = "store.json"
_HEADER = 8  # crc32, client id
FORMAT = 3  # 1: per-leaf files (fedco before issue 44); 2: no journal tokens
# What a damaged file raises while read (zip, npy and JSON format errors); anything else,
# OSError above all, is not damage. MemoryError and KeyboardInterrupt are never caught.
DAMAGE = (zipfile.BadZipFile, ValueError, KeyError, EOFError, zlib.error, TypeError)


def new_token() -> int:
  """A random 63-bit token (a journal's, or the files' at creation)."""
  return int.from_bytes(os.urandom(8), "little") >> 1


def arrays_crc(arrays: Dict[str, np.ndarray], crc: int = 0) -> int:
  for name in sorted(arrays):
    a = np.ascontiguousarray(arrays[name])
    crc = zlib.crc32(f"{name}{a.shape}{a.dtype.str}".encode(), crc)
    # numpy's stubs declare ndarray.__buffer__ only for Python >= 3.12
    crc = zlib.crc32(a.reshape(-1).view(np.uint8), crc)  # type: ignore[arg-type]
  return crc


def damaged(path, why: str) -> ValueError:
  """The one-line error of a damaged client-state file."""
  return ValueError(
    f"client state file {os.fspath(path)} is damaged ({why}); the run cannot use it: delete "
    "the checkpoint directory to start the run again"
  )


def cannot_read(path, err: OSError) -> OSError:
  """The one-line error of a client-state file that cannot be read (not damage): the same
  kind of ``OSError`` (e.g. ``PermissionError``), naming the file and the reason."""
  return type(err)(f"cannot read client state file {os.fspath(path)} ({err.strerror or err})")


def earlier_version(directory) -> ValueError:
  """The one-line error of a store an earlier fedco wrote in a format this one does not read."""
  return ValueError(
    f"client state in {os.fspath(directory)} was written by an earlier fedco version whose "
    "client-state format this one does not read; start the run afresh with a new "
    "checkpoint_dir, or finish it with the earlier fedco"
  )


def save_arrays(path, arrays: Dict[str, np.ndarray]) -> None:
  """``arrays`` and their checksum ``crc`` into the ``.npz`` file ``path``, atomically."""
  sums = np.uint32(arrays_crc(arrays))
  # mypy matches **arrays against savez's allow_pickle: bool keyword too
  io.atomic_write(
    path,
    lambda f: np.savez(f, **arrays, crc=sums),  # type: ignore[arg-type]
    mode="wb",
  )


def load_arrays(path, names) -> Dict[str, np.ndarray]:
  """The arrays ``names`` of a :func:`save_arrays` file, checksum verified."""
  try:
    with np.load(path, allow_pickle=False) as f:
      arrays = {k: f[k] for k in f.files}
  except FileNotFoundError:
    raise damaged(path, "missing") from None
  except OSError as err:
    raise cannot_read(path, err) from None
  except DAMAGE as err:  # zip and npy format errors
    raise damaged(path, f"unreadable: {type(err).__name__}") from None
  want = arrays.pop("crc", None)
  if want is None or set(arrays) != set(names) or int(want) != arrays_crc(arrays):
    raise damaged(path, "checksum mismatch" if want is not None else "no checksum")
  return arrays


def save_meta(path, meta: dict) -> None:
  io.atomic_write_json(path, {**meta, "crc": zlib.crc32(json.dumps(meta, sort_keys=True).encode())})


def load_meta(path) -> dict:
  """``store.json``'s fields, checksum verified; one written by an earlier fedco is refused
  saying so (:func:`earlier_version`)."""
  try:
    with open(path, "rb") as f:
      meta = json.loads(f.read().decode())
  except FileNotFoundError:
    raise damaged(path, "missing") from None
  except OSError as err:
    raise cannot_read(path, err) from None
  except DAMAGE as err:  # JSON and encoding errors
    raise damaged(path, f"unreadable: {type(err).__name__}") from None
  if not isinstance(meta, dict):
    raise damaged(path, "unreadable: not a JSON object")
  directory = os.path.dirname(os.fspath(path))
  version = meta.get("format")
  if version is None and "crc" not in meta and {"round", "run", "clients"} <= set(meta):
    raise earlier_version(directory)  # format 1's store.json: no format, no checksum
  if isinstance(version, int) and version < FORMAT:
    raise earlier_version(directory)
  if "crc" not in meta:
    raise damaged(path, "no checksum")
  crc = meta.pop("crc")
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
