"""Clients on disk: a folder of arrays read a few clients at a time (for streamed runs).

A :class:`ClientStore` is a folder written by :func:`write_store`: one ``.npy`` file per
example field, rows stored client by client, plus each client's row count, each client's
field's CRC-32 (``checksums.npy``) and a ``store.json`` naming the fields with a digest of
the counts and checksums; opening a store verifies its metadata, every read the clients it
read (decision 94). :func:`fedco.simulate` takes one in place of a
:class:`~fedco.FederatedData` and reads, for every chunk of rounds, only the clients that
chunk samples (with the next chunk read on the host while the current one runs), so the
examples in memory are a chunk's, not the data set's.

Why ``.npy`` files: NumPy reads them with no extra dependency, any array dtype and shape
fits, the layout is a plain offset computation (a client's rows are one contiguous byte
range, read with one ``pread``; no memory map, so the process's resident memory holds what
it read and no more), and they are written in one pass from a generator of clients, so a
million clients never need to be in memory at once. (array_record through Grain reads one
record per example, which is the wrong unit here; FedJAX's SQLite files decode a blob per
client, which :func:`fedco.data.read_clients` does for its own files.)
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
import zlib
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Union

import numpy as np

from fedco import io

__all__ = ["ClientStore", "write_store"]

_META = "store.json"
_COUNTS = "counts.npy"
_CHECKSUMS = "checksums.npy"
_FORMAT = 2  # 2: checksums.npy and a digest of the metadata; a store without "format" is 1
_KINDS = "biufc"  # the dtypes a store holds: bool, integers, floats, complex
_DAMAGED = "damaged store: write it again with fedco.data.write_store"
_LEGACY_BLOCK = 4096  # clients a block of an old store's verifying pass reads


def _checksum(raw, value: int = 0) -> int:
  """A client's field's checksum: CRC-32 of its bytes (decision 94)."""
  return zlib.crc32(raw, value)


def _content_digest(fields: Mapping[str, Any], counts, checksums) -> str:
  """store.json's digest (format 2): the fields, the counts and every client's checksums."""
  digest = hashlib.blake2b(digest_size=16)
  digest.update(json.dumps(fields, sort_keys=True).encode())
  digest.update(np.ascontiguousarray(counts, "<i8").tobytes())
  digest.update(np.ascontiguousarray(checksums, "<u4").tobytes())
  return digest.hexdigest()


def _client_arrays(k: int, client) -> Dict[str, np.ndarray]:
  """Client ``k``'s fields as contiguous arrays, refused (one line) where a store cannot
  hold them."""
  if not isinstance(client, Mapping):
    raise ValueError(
      f"clients[{k}] must be a dict {{field: array [n_k, ...]}}, got {type(client).__name__}"
    )
  for f in client:
    if not isinstance(f, str) or not f or f.startswith(".") or os.path.basename(f) != f:
      raise ValueError(
        f"clients[{k}] has the field name {f!r}; a store's field names are non-empty strings "
        "usable as file names (no '/', not starting with '.')"
      )
  arrays = {}
  for f in sorted(client):
    a = np.asarray(client[f])
    if a.ndim == 0:
      raise ValueError(
        f"clients[{k}]['{f}'] must be an array with a leading example axis, got a 0-d "
        f"{type(client[f]).__name__}"
      )
    if a.dtype.kind not in _KINDS:
      raise ValueError(
        f"clients[{k}]['{f}'] has dtype {a.dtype}; a store holds numeric or bool arrays only "
        "(bool, integer, float or complex)"
      )
    arrays[f] = np.ascontiguousarray(a)
  n = {len(a) for a in arrays.values()}
  if len(n) != 1 or not n.pop():
    raise ValueError(f"clients[{k}] must have >= 1 rows, the same in every field")
  return arrays


def _bytes(a: np.ndarray) -> np.ndarray:
  """A contiguous array's bytes, without a copy (zero-size rows included)."""
  return a.reshape(-1).view(np.uint8)


def _make_folders(path: str, made: List[str]) -> None:
  """Creates the folder ``path`` one level at a time, appending to ``made`` each folder this
  call created: a level that exists, or that another process creates meanwhile
  (``FileExistsError``), is not this call's. The levels are the path as given, ``..``
  included, as the system resolves it."""
  levels, head = [path], path
  while True:
    parent = os.path.dirname(head.rstrip(os.sep) or head)
    if not parent or parent == head:  # a relative path's first level, or the root
      break
    levels.append(parent)
    head = parent
  for level in reversed(levels):
    if os.path.basename(level.rstrip(os.sep)) in (os.curdir, os.pardir, ""):
      continue  # a folder named before, or the root: never this call's
    try:
      os.mkdir(level)
    except FileExistsError:
      continue
    made.append(level)


def write_store(path, clients: Iterable[Mapping[str, Any]]) -> "ClientStore":
  """Write clients' examples into a folder, one client at a time.

  Each client's field gets a CRC-32 checksum (``checksums.npy``), and ``store.json`` a digest
  of the fields, counts and checksums: every :meth:`ClientStore.read` verifies the clients it
  reads, and opening a store verifies its metadata (decision 94).

  Args:
    path: the folder to create (it must not exist, or be empty).
    clients: an iterable of ``{field: array [n_k, ...]}``, one per client, each with
      ``n_k >= 1`` rows and the same fields, dtypes and row shapes (a generator is read
      once, lazily); or a :class:`~fedco.FederatedData`, whose clients are written in order;
      or a :class:`ClientStore` (to rewrite one, e.g. a store of an older fedco).

  Returns:
    The :class:`ClientStore` of the folder.

  Raises:
    ValueError: ``clients`` is not such an iterable (a ``FederatedDataset``: pass its
      ``.train``; a dict of users: pass its values), holds no client, a client is empty,
      has a 0-d field, a field that is not numeric or bool (strings, objects) or fields
      that differ from the first client's; ``path`` is a file or a non-empty folder. On
      any failure (a full disk and Ctrl-C included) what this call wrote goes, the folders
      it created too: the store is whole or absent.

  Examples:
    >>> import os, tempfile
    >>> import numpy as np
    >>> import fedco
    >>> path = os.path.join(tempfile.mkdtemp(), "clients")
    >>> store = fedco.data.write_store(path, [
    ...   {"x": np.ones((3, 2), np.float32), "y": np.array([0, 1, 1], np.int32)},
    ...   {"x": np.zeros((1, 2), np.float32), "y": np.array([2], np.int32)},
    ... ])
    >>> store.num_clients, store.counts.tolist(), store.max_count
    (2, [3, 1], 3)
    >>> store.read([1])["y"].tolist()
    [2]
    >>> sorted(os.listdir(path))
    ['checksums.npy', 'counts.npy', 'store.json', 'x.rows', 'y.rows']
  """
  clients = _each_client(clients)
  path = os.fspath(path)
  _check_new_folder(path)
  made: List[str] = []  # the folders this call created, in order
  files: Dict[str, Any] = {}
  written: List[str] = []  # what this call created, removed again on any failure
  try:
    _make_folders(path, made)
    spec, counts, sums = _write_rows(path, clients, files, written)
    counts = np.asarray(counts, np.int64)
    checksums = np.asarray(sums, np.uint32).reshape(counts.size, len(spec))
    for name, array in ((_COUNTS, counts), (_CHECKSUMS, checksums)):
      written.append(os.path.join(path, name))
      io.atomic_write(written[-1], lambda f, a=array: np.save(f, a), mode="wb")
    fields = {f: {"dtype": d, "shape": list(s)} for f, (d, s) in spec.items()}
    meta = {
      "format": _FORMAT,
      "fields": fields,
      "num_clients": int(counts.size),
      "digest": _content_digest(fields, counts, checksums),
    }
    io.atomic_write_json(os.path.join(path, _META), meta)  # last: a store is whole or absent
  except BaseException:
    _remove_partial(files, written, made)
    raise
  return ClientStore(path)


def _each_client(clients):
  """The clients to write, one dict at a time (from an iterable of dicts, a
  ``FederatedData`` or a :class:`ClientStore`); a dataset or a mapping is refused."""
  from fedco.data.datasets import FederatedDataset  # pylint: disable=g-import-not-at-top
  from fedco.data.federated import FederatedData  # pylint: disable=g-import-not-at-top

  if isinstance(clients, FederatedDataset):
    raise ValueError(
      "clients is a FederatedDataset: write its clients' training data (clients.train; "
      "its held-out .val stays in memory as metrics_data)"
    )
  if isinstance(clients, Mapping):
    raise ValueError(
      "clients must be an iterable of per-client dicts {field: array [n_k, ...]} or a "
      "FederatedData, got a mapping (a dict of users: pass its .values())"
    )
  if isinstance(clients, FederatedData):
    data = clients
    return ({k: np.asarray(v) for k, v in data.client(k).items()} for k in range(data.num_clients))
  if isinstance(clients, ClientStore):
    source = clients
    return (source.read([k]) for k in range(source.num_clients))
  return clients


def _check_new_folder(path: str) -> None:
  """A one-line refusal where ``path`` is a file or a folder that is not empty."""
  if os.path.exists(path) and not os.path.isdir(path):
    raise ValueError(f"path {path!r} is a file; write_store makes a new folder")
  if os.path.isdir(path) and os.listdir(path):
    partial = not os.path.exists(os.path.join(path, _META))
    why = " (no store.json: a killed write_store's files; delete it to write again)"
    raise ValueError(
      f"path {path!r} is a folder that is not empty{why if partial else ''}; write_store "
      "makes a new one"
    )


def _write_rows(path, clients, files, written):
  """Writes every client's rows into one ``<field>.rows`` file per field (opened into
  ``files``, their names appended to ``written``), flushed to the disk; returns the fields'
  ``{field: (dtype, row shape)}``, each client's row count and per-field checksums."""
  spec, counts, sums = None, [], []
  for k, client in enumerate(clients):
    arrays = _client_arrays(k, client)
    shapes = {f: (str(a.dtype), a.shape[1:]) for f, a in arrays.items()}
    if spec is None:
      spec = shapes
      for f in spec:
        name = os.path.join(path, f"{f}.rows")
        files[f] = open(name, "xb")  # noqa: SIM115 (closed by the caller on every path)
        written.append(name)
    elif shapes != spec:
      raise ValueError(f"clients[{k}] has fields {shapes}, the first client has {spec}")
    for f, a in arrays.items():
      files[f].write(_bytes(a))
    sums.append([_checksum(_bytes(a)) for a in arrays.values()])
    counts.append(len(next(iter(arrays.values()))))
  if spec is None:
    raise ValueError("clients must hold at least one client, got none")
  for f in files.values():  # a full disk may show only now: still inside the cleanup
    f.flush()
    os.fsync(f.fileno())
    f.close()
  return spec, counts, sums


def _remove_partial(files, written, made) -> None:
  """Closes ``files`` and removes what a failed write created (``written`` files, then the
  ``made`` folders, deepest first, only while empty: nothing another writer put there)."""
  for f in files.values():
    try:
      f.close()
    except OSError:  # never hide the error that stopped the write
      pass
  for name in written:
    if os.path.exists(name):
      os.remove(name)
  for folder in reversed(made):
    try:
      os.rmdir(folder)
    except OSError:
      pass


def _damaged(file: str, what: str) -> ValueError:
  return ValueError(f"{file}: {what} ({_DAMAGED})")


def _read_meta(file: str):
  """store.json's fields, count of clients, digest and format, or a one-line refusal."""
  try:
    with open(file, "rb") as f:
      meta = json.loads(f.read().decode())
    fields = {
      str(f): (np.dtype(v["dtype"]), tuple(int(n) for n in v["shape"]))
      for f, v in sorted(meta["fields"].items())
    }
    num_clients, digest = meta["num_clients"], meta["digest"]
    version = meta.get("format", 1)
  except (OSError, ValueError, TypeError, KeyError, AttributeError) as err:
    raise _damaged(file, f"not a readable store.json ({type(err).__name__}: {err})") from None
  bad = [f for f, (d, s) in fields.items() if d.kind not in _KINDS or min(s, default=0) < 0]
  if (
    bad
    or not fields
    or not isinstance(num_clients, int)
    or num_clients < 1
    or not isinstance(digest, str)
    or version not in (1, _FORMAT)
  ):
    raise _damaged(file, "its fields, num_clients, digest or format are not a store's")
  return fields, num_clients, digest, version


def _load(file: str, shape, dtype) -> np.ndarray:
  """An ``.npy`` file of the store, checked for ``shape`` and ``dtype``."""
  try:
    array = np.load(file, allow_pickle=False)
  except (OSError, ValueError, EOFError) as err:
    raise _damaged(file, f"missing or unreadable ({type(err).__name__}: {err})") from None
  if array.shape != shape or array.dtype != dtype:
    raise _damaged(
      file,
      f"holds {array.dtype} {list(array.shape)}, store.json says {np.dtype(dtype)} {list(shape)}",
    )
  return array


class ClientStore:
  """A folder of clients written by :func:`write_store`, read a few clients at a time.

  Opening one checks its metadata (``store.json``, ``counts.npy`` and ``checksums.npy``
  against ``store.json``'s digest, each file's size); :meth:`read` checks every client it
  reads against its checksums. Damage is a one-line ``ValueError`` naming the file, and the
  client where a read found it (decision 94). A store written by an older fedco (no
  ``checksums.npy``) is verified against its digest in one pass over its rows when opened.

  Attributes:
    path: the folder.
    counts: ``int64 [K]`` rows per client.
    offsets: ``int64 [K]`` each client's first row.
    max_count: the largest client's size.
    fields: ``{field: (dtype, row shape)}``.
    digest: a digest of the content, for run fingerprints.

  Examples:
    >>> import os, tempfile
    >>> import numpy as np
    >>> import fedco
    >>> path = os.path.join(tempfile.mkdtemp(), "clients")
    >>> _ = fedco.data.write_store(path, [{"x": np.arange(4.0).reshape(2, 2)}] * 3)
    >>> store = fedco.data.ClientStore(path)
    >>> store.num_clients, store.num_examples, store.read([2, 0])["x"].shape
    (3, 6, (4, 2))
  """

  def __init__(self, path):
    self.path = os.fspath(path)
    meta_path = os.path.join(self.path, _META)
    if not os.path.isfile(meta_path):
      raise FileNotFoundError(
        f"path {self.path!r} is not a client store (no {_META}; write one with "
        "fedco.data.write_store)"
      )
    self.fields, num_clients, self.digest, version = _read_meta(meta_path)
    self.counts = _load(os.path.join(self.path, _COUNTS), (num_clients,), np.int64)
    if self.counts.min() < 1:
      raise _damaged(os.path.join(self.path, _COUNTS), "a client has fewer than 1 row")
    self.offsets = np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.int64)
    self.max_count = int(self.counts.max())
    self._row_bytes = {
      f: d.itemsize * int(np.prod(s, dtype=np.int64)) for f, (d, s) in self.fields.items()
    }
    self._checksums: Optional[np.ndarray] = None
    if version >= 2:
      self._checksums = _load(
        os.path.join(self.path, _CHECKSUMS), (num_clients, len(self.fields)), np.uint32
      )
      fields = {f: {"dtype": str(d), "shape": list(s)} for f, (d, s) in self.fields.items()}
      if _content_digest(fields, self.counts, self._checksums) != self.digest:
        raise _damaged(meta_path, f"its digest does not match {_COUNTS} and {_CHECKSUMS}")
    for f, size in self._row_bytes.items():
      file = os.path.join(self.path, f"{f}.rows")
      if not os.path.isfile(file) or os.path.getsize(file) != size * self.num_examples:
        raise ValueError(f"{file}: missing or of the wrong size for {self.num_examples} rows")
    if version < 2:
      self._checksums = self._verify_legacy(meta_path)

  def _verify_legacy(self, meta_path: str) -> np.ndarray:
    """An older fedco's store (no checksums): its rows and counts verified against
    store.json's digest in one pass, and every client's checksums computed on the way, so
    that later reads are verified as a new store's are (decision 94)."""
    digest = hashlib.blake2b(digest_size=16)
    sums = np.zeros((self.num_clients, len(self.fields)), np.uint32)
    for start in range(0, self.num_clients, _LEGACY_BLOCK):
      ids = np.arange(start, min(start + _LEGACY_BLOCK, self.num_clients))
      rows = self.read(ids)
      ends = np.cumsum(self.counts[ids]).tolist()
      for i, (k, end) in enumerate(zip(ids.tolist(), ends)):
        begin = ends[i - 1] if i else 0
        for j, f in enumerate(self.fields):
          raw = _bytes(rows[f][begin:end])
          digest.update(raw)  # type: ignore[arg-type]  # numpy stubs: ndarray.__buffer__ is 3.12+
          sums[k, j] = _checksum(raw)
    digest.update(self.counts.tobytes())
    if digest.hexdigest() != self.digest:
      raise _damaged(meta_path, "its digest does not match the rows and counts.npy")
    warnings.warn(
      f"{self.path} was written by an older fedco (no {_CHECKSUMS}), so opening it read "
      "every row to verify it; rewrite it once, fedco.data.write_store(new_path, "
      "fedco.data.ClientStore(path)), to verify only what a run reads",
      stacklevel=3,
    )
    return sums

  @property
  def num_clients(self) -> int:
    """The number of clients ``K``."""
    return int(self.counts.size)

  @property
  def num_examples(self) -> int:
    """All clients' rows."""
    return int(self.counts.sum())

  def _ids(self, ids) -> np.ndarray:
    """``ids`` as ``int64 [n]`` client ids, refused (one line) unless integers in ``[0, K)``."""
    values = np.asarray(ids)
    if values.ndim != 1:
      raise ValueError(f"ids must be a 1-D sequence of client ids, got shape {values.shape}")
    if values.size and values.dtype.kind not in "iu":
      raise ValueError(
        f"ids must be integer client ids in [0, {self.num_clients}), got {values.dtype} "
        f"values such as {values[0]!r}"
      )
    values = values.astype(np.int64)
    if values.size and (values.min() < 0 or values.max() >= self.num_clients):
      raise ValueError(
        f"ids must lie in [0, {self.num_clients}), got {values.min()}..{values.max()}"
      )
    return values

  def read(
    self, ids: Union[Sequence[int], np.ndarray], out: Optional[Dict[str, np.ndarray]] = None
  ):
    """The rows of clients ``ids``, concatenated in that order (one ``pread`` per client and
    field), each client's verified against its checksums.

    Args:
      ids: integer client ids in ``[0, K)``.
      out: arrays to fill (from row 0; each at least as long as the rows read), or ``None``
        for new ones.

    Returns:
      ``{field: array [sum of the clients' counts, ...]}`` (``out`` itself when given).

    Raises:
      ValueError: ``ids`` are not integers in ``[0, K)``; a client's rows end early or do
        not match their checksum (naming the file and the client: a damaged store).
    """
    ids = self._ids(ids)
    total = int(self.counts[ids].sum())
    if out is None:
      out = {f: np.empty((total,) + s, d) for f, (d, s) in self.fields.items()}
    counts, offsets, clients = self.counts[ids], self.offsets[ids], ids.tolist()
    for j, f in enumerate(self.fields):
      size = self._row_bytes[f]
      view = out[f].reshape(-1).view(np.uint8)
      sums = []
      with open(os.path.join(self.path, f"{f}.rows"), "rb", buffering=0) as handle:
        fd, pos = handle.fileno(), 0
        for k, n, at in zip(clients, (counts * size).tolist(), (offsets * size).tolist()):
          if io.pread_all(fd, view[pos : pos + n], at) != n:
            raise ValueError(f"{handle.name}: client {k}'s rows end early ({_DAMAGED})")
          if self._checksums is not None:
            sums.append(_checksum(view[pos : pos + n]))
          pos += n
      if self._checksums is not None and clients:
        bad = np.flatnonzero(np.asarray(sums, np.uint32) != self._checksums[ids, j])
        if bad.size:
          raise ValueError(
            f"{os.path.join(self.path, f + '.rows')}: client {clients[bad[0]]}'s rows do not "
            f"match their checksum ({_DAMAGED})"
          )
    return out
