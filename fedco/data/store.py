"""Clients on disk: a folder of arrays read a few clients at a time (for streamed runs).

A :class:`ClientStore` is a folder written by :func:`write_store`: one ``.npy`` file per
example field, rows stored client by client, plus each client's row count and a
``store.json`` naming the fields and a digest of the content. :func:`fedco.simulate` takes
one in place of a :class:`~fedco.FederatedData` and reads, for every chunk of rounds, only
the clients that chunk samples (with the next chunk read on the host while the current one
runs), so the examples in memory are a chunk's, not the data set's.

Why ``.npy`` files: NumPy reads them with no extra dependency, any array dtype and shape
fits, the layout is a plain offset computation (a client's rows are one contiguous byte
range, read with one ``pread``; no memory map, so the process's resident memory holds what
it read and no more), and they are written in one pass from a generator of clients, so a
million clients never need to be in memory at once. (array_record through Grain reads one
record per example, which is the wrong unit here; FedJAX's SQLite files decode a blob per
client, which :func:`fedco.data.read_clients` does for its own files.)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from typing import Any, Dict, Iterable, Mapping, Optional, Sequence

import numpy as np

from fedco import io

__all__ = ["ClientStore", "write_store"]

_META = "store.json"


def write_store(path, clients: Iterable[Mapping[str, Any]]) -> "ClientStore":
  """Write clients' examples into a folder, one client at a time.

  Args:
    path: the folder to create (it must not exist, or be empty).
    clients: an iterable of ``{field: array [n_k, ...]}``, one per client, each with
      ``n_k >= 1`` rows and the same fields, dtypes and row shapes (a generator is read
      once, lazily); or a :class:`~fedco.FederatedData`, whose clients are written in order.

  Returns:
    The :class:`ClientStore` of the folder.

  Raises:
    ValueError: ``clients`` is not such an iterable (a ``FederatedDataset``: pass its
      ``.train``; a dict of users: pass its values), a client is empty or its fields differ
      from the first client's; ``path`` is a non-empty folder. The files written before
      the failure are removed (the store is whole or absent).

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
  """
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
    clients = (
      {k: np.asarray(v) for k, v in data.client(k).items()} for k in range(data.num_clients)
    )
  path = os.fspath(path)
  if os.path.isdir(path) and os.listdir(path):
    partial = not os.path.exists(os.path.join(path, _META))
    why = " (no store.json: a killed write_store's files; delete it to write again)"
    raise ValueError(
      f"path {path!r} is a folder that is not empty{why if partial else ''}; write_store "
      "makes a new one"
    )
  created = not os.path.isdir(path)
  os.makedirs(path, exist_ok=True)
  spec, files, counts, digest = None, {}, [], hashlib.blake2b(digest_size=16)
  done = False
  try:
    for k, client in enumerate(clients):
      if not isinstance(client, Mapping):
        raise ValueError(
          f"clients[{k}] must be a dict {{field: array [n_k, ...]}}, got {type(client).__name__}"
        )
      arrays = {f: np.ascontiguousarray(client[f]) for f in sorted(client)}
      n = {len(a) for a in arrays.values()}
      if len(n) != 1 or not n.pop():
        raise ValueError(f"clients[{k}] must have >= 1 rows, the same in every field")
      shapes = {f: (str(a.dtype), a.shape[1:]) for f, a in arrays.items()}
      if spec is None:
        spec = shapes
        files = {f: open(os.path.join(path, f"{f}.rows"), "wb") for f in spec}
      elif shapes != spec:
        raise ValueError(f"clients[{k}] has fields {shapes}, the first client has {spec}")
      for f, a in arrays.items():
        files[f].write(a.tobytes())
        digest.update(a.tobytes())
      counts.append(len(next(iter(arrays.values()))))
    done = True
  finally:
    for f in files.values():
      f.close()
    if not done:  # what this call wrote goes: a store is whole or absent
      with contextlib.suppress(OSError):  # never hide the error that stopped the write
        for f in files.values():
          os.remove(f.name)
        if created:
          os.rmdir(path)  # only while empty: nothing another writer put there goes
  if spec is None:
    raise ValueError("clients must hold at least one client")
  counts = np.asarray(counts, np.int64)
  digest.update(counts.tobytes())
  np.save(os.path.join(path, "counts.npy"), counts)
  meta = {
    "fields": {f: {"dtype": d, "shape": list(s)} for f, (d, s) in spec.items()},
    "num_clients": int(counts.size),
    "digest": digest.hexdigest(),
  }
  io.atomic_write_json(os.path.join(path, _META), meta)  # last: a store is whole or absent
  return ClientStore(path)


class ClientStore:
  """A folder of clients written by :func:`write_store`, read a few clients at a time.

  Attributes:
    path: the folder.
    counts: ``int64 [K]`` rows per client.
    offsets: ``int64 [K]`` each client's first row.
    max_count: the largest client's size.
    fields: ``{field: (dtype, row shape)}``.
    digest: a digest of the content (rows and counts), for run fingerprints.

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
    with open(meta_path) as f:
      meta = json.load(f)
    self.fields = {
      f: (np.dtype(v["dtype"]), tuple(v["shape"])) for f, v in sorted(meta["fields"].items())
    }
    self.digest = meta["digest"]
    self.counts = np.load(os.path.join(self.path, "counts.npy"))
    self.offsets = np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.int64)
    self.max_count = int(self.counts.max())
    self._row_bytes = {
      f: d.itemsize * int(np.prod(s, dtype=np.int64)) for f, (d, s) in self.fields.items()
    }
    for f, size in self._row_bytes.items():
      file = os.path.join(self.path, f"{f}.rows")
      if not os.path.isfile(file) or os.path.getsize(file) != size * self.num_examples:
        raise ValueError(f"{file}: missing or of the wrong size for {self.num_examples} rows")

  @property
  def num_clients(self) -> int:
    """The number of clients ``K``."""
    return int(self.counts.size)

  @property
  def num_examples(self) -> int:
    """All clients' rows."""
    return int(self.counts.sum())

  def read(self, ids: Sequence[int], out: Optional[Dict[str, np.ndarray]] = None):
    """The rows of clients ``ids``, concatenated in that order (one ``pread`` per client and
    field).

    Args:
      ids: client ids in ``[0, K)``.
      out: arrays to fill (from row 0; each at least as long as the rows read), or ``None``
        for new ones.

    Returns:
      ``{field: array [sum of the clients' counts, ...]}`` (``out`` itself when given).
    """
    ids = np.asarray(ids, np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= self.num_clients):
      raise ValueError(f"ids must lie in [0, {self.num_clients}), got {ids.min()}..{ids.max()}")
    total = int(self.counts[ids].sum())
    if out is None:
      out = {f: np.empty((total,) + s, d) for f, (d, s) in self.fields.items()}
    for f in self.fields:
      size = self._row_bytes[f]
      view = out[f].reshape(-1).view(np.uint8)
      with open(os.path.join(self.path, f"{f}.rows"), "rb", buffering=0) as handle:
        fd, pos = handle.fileno(), 0
        for k in ids:
          n = int(self.counts[k]) * size
          got = os.preadv(fd, [memoryview(view[pos : pos + n])], int(self.offsets[k]) * size)
          if got != n:
            raise ValueError(f"{handle.name}: client {k}'s rows end early (damaged store)")
          pos += n
    return out
