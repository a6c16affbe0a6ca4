"""FedJAX's SQLite client files: one row per client, its examples a compressed blob.

FedJAX (``fedjax.core.sqlite_federated_data``) ships EMNIST-62, Shakespeare, StackOverflow
and CIFAR-100 as SQLite files with one table::

  CREATE TABLE federated_data (client_id BLOB NOT NULL PRIMARY KEY,
                               data BLOB NOT NULL, num_examples INTEGER NOT NULL);

``data`` is ``zlib``-compressed msgpack of ``{feature: array}``; an array is a msgpack
extension (code 1: ``(shape, dtype name, C-order bytes)``; code 4: an array of byte
strings as ``(shape, flat list)``). fedco decodes the format itself (with ``msgpack``, which
flax already needs), with no FedJAX or TensorFlow. Reading a client reads its row only, so
:func:`read_clients` can also stream a few clients of a large file.

Preparing the files needs network, once (they are what ``fedjax.datasets.<name>.load_data``
downloads into ``~/.cache/fedjax``)::

  base=https://storage.googleapis.com/gresearch/fedjax
  wget $base/emnist/federated_emnist_train.sqlite $base/emnist/federated_emnist_test.sqlite
  wget $base/shakespeare/shakespeare_train.sqlite $base/shakespeare/shakespeare_test.sqlite
  # StackOverflow: $base/stackoverflow/stackoverflow_{train,held_out,test}.sqlite;
  # CIFAR-100: python -c "import fedjax; fedjax.datasets.cifar100.load_data()"

:func:`load_sqlite` turns a train and a test file into clients: ``emnist`` (``pixels``
28x28 with 1.0 the background, returned as ``1 - pixels`` ``[n, 28, 28, 1]``; 62 classes),
``cifar100`` (``image`` uint8 to ``float32`` in [0, 1]; ``label``, 100 classes, or
``coarse_label`` with ``label_key``), ``shakespeare`` (each snippet cut into LEAF's
next-character windows: 80 letters of :data:`fedco.data.LETTERS`, the next one the label;
with ``preprocess="tff"``, TFF's sequences that keep every client,
:mod:`fedco.data.tff`).
Other files (StackOverflow's token strings) are read with :func:`read_clients` and
converted by your own code.
"""

from __future__ import annotations

import os
import sqlite3
import zlib
from typing import Any, Dict, Iterator, Optional, Sequence, Tuple

import msgpack
import numpy as np

from fedco import _validate, io
from fedco.data.datasets import FederatedDataset
from fedco.data.leaf import LETTERS, class_ids, grey_images, letter_ids
from fedco.data.natural import from_users
from fedco.data.tff import NUM_CLASSES as TFF_CLASSES
from fedco.data.tff import shakespeare_sequences

#: The FedJAX files :func:`load_sqlite` converts, with their classes.
SQLITE_DATASETS = {"emnist": 62, "cifar100": 100, "shakespeare": len(LETTERS) + 1}
_COLUMNS = ("client_id", "data", "num_examples")

__all__ = ["SQLITE_DATASETS", "read_clients", "write_clients", "load_sqlite"]


def _array(code: int, payload: bytes):
  if code == 1:
    shape, dtype, buffer = msgpack.unpackb(payload, raw=True)
    return np.frombuffer(buffer, dtype=np.dtype(dtype.decode())).reshape(shape)
  if code == 4:
    shape, flat = msgpack.unpackb(payload, raw=True)
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out.reshape(shape)
  if code == 3:
    return _array(1, payload)[()]
  raise ValueError(f"msgpack extension code {code} is not a FedJAX array")


def _encode(value):
  value = np.asarray(value)
  if value.dtype == object:
    flat = [bytes(v) for v in value.reshape(-1)]
    return msgpack.ExtType(4, msgpack.packb((value.shape, flat), use_bin_type=True))
  payload = (value.shape, value.dtype.name, value.tobytes("C"))
  return msgpack.ExtType(1, msgpack.packb(payload, use_bin_type=True))


def _database_error(path: str, e: sqlite3.DatabaseError) -> ValueError:
  """One line for what SQLite said: a lock held by another program, or not a database."""
  if "locked" in str(e) or "busy" in str(e):
    return ValueError(
      f"{path}: the database is locked by another program writing it ({e}); close that "
      "program, or copy the file, and read it again"
    )
  if isinstance(e, sqlite3.OperationalError) and "unable to open" in str(e):
    return ValueError(f"{path}: SQLite cannot open the file ({e}): check its permissions")
  return ValueError(f"{path}: not a SQLite file, or a damaged one ({e})")


def _open(path: str) -> sqlite3.Connection:
  if os.path.isdir(path):
    raise ValueError(f"path {path!r} is a folder, not a FedJAX .sqlite client file")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"path {path!r} does not exist (a FedJAX .sqlite client file)")
  try:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1.0)
    columns = [row[1] for row in db.execute("PRAGMA table_info(federated_data)")]
  except sqlite3.DatabaseError as e:
    raise _database_error(path, e) from None
  if tuple(columns) != _COLUMNS:
    db.close()
    raise ValueError(
      f"{path}: a FedJAX client file has a table federated_data{_COLUMNS}, this one has "
      f"{tuple(columns) or 'no such table'}"
    )
  return db


def _decode(path: str, client, blob, count) -> Dict[str, np.ndarray]:
  if client is None or blob is None or count is None:  # NULLs in a table built by hand
    column = "client_id" if client is None else "data" if blob is None else "num_examples"
    raise ValueError(f"{path}: client {client!r}: its {column} is NULL")
  if not isinstance(blob, bytes) or not isinstance(count, int):
    raise ValueError(
      f"{path}: client {client!r}: data must be a BLOB and num_examples an INTEGER, got "
      f"{type(blob).__name__} and {type(count).__name__}"
    )
  try:
    examples = msgpack.unpackb(zlib.decompress(blob), ext_hook=_array, raw=False)
  except (zlib.error, ValueError, TypeError, msgpack.UnpackException) as e:
    raise ValueError(f"{path}: client {client!r}: its data blob does not decode ({e})") from None
  if not isinstance(examples, dict) or not examples:
    raise ValueError(f"{path}: client {client!r}: its data is not a dict of arrays")
  sizes = {k: len(v) if np.ndim(v) else 0 for k, v in examples.items()}
  if set(sizes.values()) != {count}:
    raise ValueError(
      f"{path}: client {client!r}: num_examples is {count}, its features have {sizes} rows"
    )
  return examples


def read_clients(
  path, client_ids: Optional[Sequence[bytes]] = None
) -> Iterator[Tuple[bytes, Dict[str, np.ndarray]]]:
  """Each client's examples from a FedJAX SQLite file, one row at a time, in file order.

  Args:
    path: a FedJAX ``.sqlite`` client file.
    client_ids: read only these clients (``bytes`` ids, in this order); ``None``: all.

  Returns:
    An iterator of ``(client_id, {feature: array})``, all arrays of ``num_examples`` rows.

  Raises:
    FileNotFoundError: ``path`` does not exist.
    ValueError: ``path`` is a folder, not a SQLite file (or a damaged or locked one), no
      ``federated_data`` table of FedJAX's columns, a NULL cell, a blob that does not
      decode, a client whose arrays disagree with ``num_examples``, or an id of
      ``client_ids`` not in the file; the message names the file and client.

  Examples:
    >>> import os, tempfile
    >>> import numpy as np
    >>> import fedco
    >>> path = os.path.join(tempfile.mkdtemp(), "train.sqlite")
    >>> fedco.data.write_clients(path, {b"w1": {"label": np.array([3, 4], np.int32)}})
    >>> [(cid, x["label"].tolist()) for cid, x in fedco.data.read_clients(path)]
    [(b'w1', [3, 4])]
  """
  path = os.fspath(path)
  db = _open(path)
  try:
    rows: Iterator[Any]
    if client_ids is None:
      rows = db.execute(f"SELECT {', '.join(_COLUMNS)} FROM federated_data ORDER BY rowid")
    else:
      rows = (_row(db, path, bytes(c)) for c in client_ids)
    while True:
      try:
        row = next(rows, None)
      except sqlite3.DatabaseError as e:
        raise _database_error(path, e) from None
      if row is None:
        return
      client, blob, count = row
      if isinstance(client, str):  # a TEXT column in a table built by hand
        client = client.encode()
      elif isinstance(client, (bytes, memoryview)):
        client = bytes(client)
      yield client, _decode(path, client, blob, count)
  finally:
    db.close()


def _row(db, path, client: bytes):
  query = f"SELECT {', '.join(_COLUMNS)} FROM federated_data WHERE client_id = ?"
  row = db.execute(query, (client,)).fetchone()
  if row is None:
    raise ValueError(f"{path}: client_ids names {client!r}, which the file does not hold")
  return row


def write_clients(path, clients) -> None:
  """Write clients' examples as a FedJAX SQLite file (atomically: built in memory first).

  Args:
    path: the ``.sqlite`` file to write (replaced if it exists); its folder must exist.
    clients: ``{client_id (bytes or str): {feature: array [n, ...]}}``; arrays of byte
      strings are stored as FedJAX stores them (extension code 4).

  Returns:
    ``None``; :func:`read_clients` reads the file back.

  Examples:
    >>> import os, tempfile
    >>> import numpy as np
    >>> import fedco
    >>> path = os.path.join(tempfile.mkdtemp(), "test.sqlite")
    >>> fedco.data.write_clients(path, {"a": {"x": np.zeros((2, 3), np.float32)}})
    >>> next(fedco.data.read_clients(path))[1]["x"].shape
    (2, 3)
  """
  db = sqlite3.connect(":memory:")
  try:
    db.execute(
      "CREATE TABLE federated_data (client_id BLOB NOT NULL PRIMARY KEY, "
      "data BLOB NOT NULL, num_examples INTEGER NOT NULL)"
    )
    for client, examples in clients.items():
      cid = client.encode() if isinstance(client, str) else bytes(client)
      sizes = {len(v) for v in examples.values()}
      if len(sizes) != 1:
        raise ValueError(f"clients[{client!r}] has features of different lengths")
      blob = zlib.compress(msgpack.packb(dict(examples), default=_encode, strict_types=True))
      db.execute("INSERT INTO federated_data VALUES (?, ?, ?)", (cid, blob, sizes.pop()))
    db.commit()
    content = db.serialize()
  finally:
    db.close()
  io.atomic_write(os.fspath(path), content, mode="wb")


def _windows(snippets, stride: int) -> Dict[str, np.ndarray]:
  xs, ys = [], []
  for snippet in snippets:
    text = snippet.decode("utf-8", "replace") if isinstance(snippet, bytes) else str(snippet)
    ids = letter_ids(text)
    for start in range(0, len(ids) - 80, stride):
      xs.append(ids[start : start + 80])
      ys.append(ids[start + 80])
  return {"x": np.asarray(xs, np.int32).reshape(-1, 80), "y": np.asarray(ys, np.int32)}


_NEEDS = {"shakespeare": ("snippets",), "emnist": ("pixels", "label"), "cifar100": ("image",)}


def _convert(dataset: str, examples, label_key: str, stride: Optional[int], who: str):
  needs = _NEEDS[dataset] + ((label_key,) if dataset == "cifar100" else ())
  missing = [k for k in needs if k not in examples]
  if missing:
    raise ValueError(
      f"{who}: a {dataset} client file holds the features {sorted(examples)}, not {missing[0]!r}: "
      f"is it FedJAX's {dataset}? (your own data: read_clients, then fedco.data.from_users)"
    )
  if dataset == "shakespeare" and stride is None:  # preprocess="tff"
    snippets = np.asarray(examples["snippets"])
    if snippets.ndim != 1 or snippets.dtype.kind not in "SO":
      raise ValueError(
        f"{who}: snippets must be a 1-D array of byte strings, got {snippets.dtype} of shape "
        f"{snippets.shape}"
      )
    return shakespeare_sequences(snippets)
  if dataset == "shakespeare" and stride is not None:
    return _windows(examples["snippets"], stride)
  if dataset == "emnist":
    return {"x": 1.0 - grey_images(examples["pixels"], who), "y": class_ids(examples["label"], who)}
  image = np.asarray(examples["image"])
  if image.dtype.kind not in "biuf" or image.ndim != 4 or image.shape[1:] != (32, 32, 3):
    raise ValueError(
      f"{who}: cifar100 images must be numbers of shape [n, 32, 32, 3], got {image.dtype} "
      f"{image.shape}"
    )
  return {"x": image.astype(np.float32) / 255.0, "y": class_ids(examples[label_key], who)}


def load_sqlite(
  train_path,
  test_path,
  dataset: str,
  *,
  label_key: str = "label",
  stride: int = 1,
  max_clients: Optional[int] = None,
  preprocess: str = "windows",
) -> FederatedDataset:
  """A FedJAX benchmark with one client per client of its files.

  Args:
    train_path: the training ``.sqlite`` file (e.g. ``federated_emnist_train.sqlite``).
    test_path: the held-out file with the same client ids (``..._test.sqlite``).
    dataset: ``emnist``, ``cifar100`` or ``shakespeare`` (:data:`SQLITE_DATASETS`).
    label_key: ``cifar100`` only: ``label`` (100 classes) or ``coarse_label`` (20).
    stride: ``shakespeare`` only: characters between windows (1, LEAF's; 80 makes
      windows that do not overlap).
    max_clients: read only the first this many training clients (``None``: all).
    preprocess: ``shakespeare`` only: ``"windows"`` (default) cuts LEAF's 80-letter
      windows inside each snippet (a client whose snippets are all shorter than 81 letters
      has no examples and is dropped); ``"tff"`` makes TFF's and FedJAX's sequences of
      :func:`fedco.data.tff.shakespeare_sequences` (``y`` ``int32 [n, 80]``,
      :data:`fedco.data.tff.NUM_CLASSES` classes), which keep every client.

  Returns:
    A :class:`~fedco.data.FederatedDataset`; ``info["users"]`` holds the client ids.

  Raises:
    FileNotFoundError: a file does not exist.
    ValueError: a bad argument or a damaged file (see :func:`read_clients`).

  Examples:
    Two EMNIST-format clients written in FedJAX's format, then loaded:

    >>> import os, tempfile
    >>> import numpy as np
    >>> import fedco
    >>> root = tempfile.mkdtemp()
    >>> def client(n):
    ...   return {"pixels": np.ones((n, 28, 28), np.float32), "label": np.arange(n, dtype=np.int32)}
    >>> for split in ("train", "test"):
    ...   fedco.data.write_clients(os.path.join(root, split), {b"a": client(3), b"b": client(2)})
    >>> fed = fedco.data.load_sqlite(os.path.join(root, "train"), os.path.join(root, "test"),
    ...                              "emnist")
    >>> fed.num_clients, fed.num_classes, fed.train.examples["x"].shape
    (2, 62, (5, 28, 28, 1))
  """
  dataset = _validate.one_of("dataset", dataset, tuple(SQLITE_DATASETS))
  label_key = _validate.one_of("label_key", label_key, ("label", "coarse_label"))
  stride = _validate.positive_int("stride", stride)
  preprocess = _validate.one_of("preprocess", preprocess, ("windows", "tff"))
  if preprocess == "tff" and dataset != "shakespeare":
    raise ValueError(f"preprocess='tff' is for dataset='shakespeare' only, got {dataset!r}")
  tff = preprocess == "tff"
  if max_clients is not None:
    max_clients = _validate.positive_int("max_clients", max_clients)
  train: Dict[bytes, Any] = {}
  for cid, examples in read_clients(train_path):
    if max_clients is not None and len(train) == max_clients:
      break
    who = f"{train_path}: client {cid!r}"
    train[cid] = _convert(dataset, examples, label_key, None if tff else stride, who)
  test = {
    cid: _convert(dataset, x, label_key, None if tff else stride, f"{test_path}: client {cid!r}")
    for cid, x in read_clients(test_path)
    if cid in train
  }
  classes = (
    20 if label_key == "coarse_label" and dataset == "cifar100" else SQLITE_DATASETS[dataset]
  )
  info = {"source": "fedjax_sqlite", "train_path": os.fspath(train_path), "stride": stride}
  if tff:
    info.update(preprocess="tff", stride=None)
    classes = TFF_CLASSES
  return from_users(train, test, name=dataset, num_classes=classes, info=info, sequence_labels=tff)
