"""Naturally partitioned data: one client per user of the data set, not a partitioner's split.

The federated benchmarks come with their clients (FEMNIST's writers, Shakespeare's roles,
StackOverflow's users). Their loaders (:mod:`fedco.data.leaf`, :mod:`fedco.data.sqlite`,
:func:`fedco.data.load_tfds_clients`) read each user's training and held-out examples and
hand them to :func:`from_users`, which stores each split once and makes every user a
client: their training examples are the client's training set and their held-out
examples its validation set; all users' held-out examples together are the central test
split.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Dict, Mapping, Optional

import numpy as np

from fedco import _validate
from fedco.data import sources
from fedco.data.datasets import FederatedDataset, make_federated

Users = Mapping[Any, Mapping[str, np.ndarray]]

__all__ = ["from_users", "load_tfds_clients"]


def _user_arrays(arrays, where: str, sequence_labels: bool = False):
  """A user's ``x`` and ``y`` as arrays: numbers, integer labels of one per row (or a row of
  integer labels per row with ``sequence_labels``)."""
  if not isinstance(arrays, Mapping) or "x" not in arrays or "y" not in arrays:
    raise ValueError(f"{where} must be a mapping with arrays 'x' and 'y'")
  try:
    x, y = np.asarray(arrays["x"]), np.asarray(arrays["y"])
  except ValueError:  # NumPy: rows of different shapes
    raise ValueError(f"{where}: its rows of 'x' (or 'y') have different shapes") from None
  if x.dtype.kind not in "biuf" or x.ndim < 1:
    raise ValueError(f"{where}.x must be an array of numbers, one row per example; got {x.dtype}")
  if sequence_labels and (y.dtype.kind not in "iu" or y.ndim != 2):
    raise ValueError(
      f"{where}.y must be integer class ids, one row per example (sequence labels); got "
      f"{y.dtype} of shape {y.shape}"
    )
  whole = y.dtype.kind in "biu" or (y.dtype.kind == "f" and np.all(y == np.round(y)))
  if (y.ndim != 1 and not sequence_labels) or not whole:
    raise ValueError(
      f"{where}.y must be integer class ids, one per example (not one-hot rows, names or "
      f"fractions); got {y.dtype} of shape {y.shape}"
    )
  if y.dtype.kind in "bf":  # whole numbers written as floats, or bools: class ids
    y = y.astype(np.int32)
  if len(x) != len(y):
    raise ValueError(f"{where} has {len(x)} rows of 'x' but {len(y)} labels 'y'")
  return x, y


def _concat(users: Users, ids, split: str, row_shape=None, sequence_labels=False, label_shape=None):
  keys, xs, ys = None, [], []
  for user in ids:
    arrays, where = users[user], f"{split}_users[{user!r}]"
    x, y = _user_arrays(arrays, where, sequence_labels)
    label_shape = y.shape[1:] if label_shape is None else label_shape
    if y.shape[1:] != label_shape:
      raise ValueError(
        f"{where}.y has rows of shape {y.shape[1:]}, the first training user's have {label_shape}"
      )
    if keys is None:
      keys = sorted(arrays)
    elif sorted(arrays) != keys:
      raise ValueError(f"{where} has fields {sorted(arrays)}, the first user has {keys}")
    row_shape = x.shape[1:] if row_shape is None else row_shape
    if x.shape[1:] != row_shape:
      raise ValueError(
        f"{where}.x has rows of shape {x.shape[1:]}, the first training user's have {row_shape}"
      )
    xs.append(x)
    ys.append(y)
  sizes = np.cumsum([0] + [len(y) for y in ys])
  parts = [np.arange(a, b) for a, b in zip(sizes[:-1], sizes[1:])]
  return {"x": np.concatenate(xs), "y": np.concatenate(ys)}, parts


def from_users(
  train_users: Users,
  test_users: Users,
  *,
  name: str,
  num_classes: int,
  info: Optional[Mapping[str, Any]] = None,
  sequence_labels: bool = False,
) -> FederatedDataset:
  """A :class:`~fedco.data.FederatedDataset` with one client per user.

  Client ``k`` is the ``k``-th user of ``train_users`` (in its order) that also has
  held-out examples in ``test_users``: its training set is that user's training examples and
  its validation set that user's held-out examples. ``test`` is every client's held-out
  examples, concatenated. Users with no held-out examples (or none left for training) are
  dropped with a warning, and counted in ``info["dropped_users"]``: fedco's metrics are per
  client, on each client's own held-out data.

  Args:
    train_users: ``{user: {"x": [n, ...], "y": int [n]}}``, each with ``n >= 1``; every
      user has the same fields (only ``x`` and ``y`` are used).
    test_users: the same for held-out examples; users missing here are dropped.
    name: the data set's name, kept in the result.
    num_classes: number of classes; every label must lie in ``[0, num_classes)``.
    info: metadata kept (copied) in ``FederatedDataset.info``, with ``users`` (the client
      ids in order) and ``dropped_users`` added.
    sequence_labels: ``y`` is ``int [n, L]``, one label per position of a sequence (a
      language model's next-token targets, e.g. :func:`fedco.data.load_shakespeare_tff`),
      with the same ``L`` for every user; ``False`` (default): ``int [n]``.

  Returns:
    A :class:`~fedco.data.FederatedDataset` whose ``info["users"]`` lists each client's
    user id.

  Raises:
    ValueError: no user has both training and held-out examples, a user lacks ``x`` or
      ``y``, users have different fields, a user's inputs are not numbers or their rows
      have another shape than the first training user's (held-out users too), labels are
      not integers (one per example) or are out of range.

  Examples:
    Two users with their own training and held-out examples, and a third with no held-out
    examples (dropped, with a warning):

    >>> import warnings
    >>> import numpy as np
    >>> import fedco
    >>> def user(n, label):
    ...   return {"x": np.full((n, 2), label, np.float32), "y": np.full(n, label, np.int32)}
    >>> train = {"ann": user(3, 0), "bob": user(5, 1), "cy": user(2, 1)}
    >>> test = {"ann": user(1, 0), "bob": user(2, 1)}
    >>> with warnings.catch_warnings():
    ...   warnings.simplefilter("ignore")
    ...   fed = fedco.data.from_users(train, test, name="toy", num_classes=2)
    >>> fed.info["users"], fed.info["dropped_users"]
    (['ann', 'bob'], 1)
    >>> fed.train.counts.tolist(), fed.val.counts.tolist(), fed.test["y"].tolist()
    ([3, 5], [1, 2], [0, 1, 1])
  """
  for arg, users in (("train_users", train_users), ("test_users", test_users)):
    if not isinstance(users, Mapping):
      raise ValueError(f"{arg} must be a mapping of user id to arrays, got {type(users).__name__}")
  num_classes = _validate.positive_int("num_classes", num_classes)
  ids = [
    u
    for u in train_users
    if u in test_users and len(train_users[u].get("y", ())) and len(test_users[u].get("y", ()))
  ]
  dropped = len(train_users) - len(ids)
  if not ids:
    raise ValueError(
      f"no user of {name!r} has both training and held-out examples ({len(train_users)} "
      f"training users, {len(test_users)} held-out users); fedco needs each client's own "
      "held-out data (LEAF: prepare with -t sample, not -t user)"
    )
  if dropped:
    kept = set(ids)
    left = [u for u in train_users if u not in kept]
    warnings.warn(
      f"{dropped} of {len(train_users)} users of {name!r} have no held-out (or no training) "
      f"examples and are left out: {', '.join(map(repr, left[:5]))}"
      f"{' ...' if len(left) > 5 else ''}",
      stacklevel=2,
    )
  train, train_parts = _concat(train_users, ids, "train", sequence_labels=sequence_labels)
  test, val_parts = _concat(
    test_users,
    ids,
    "test",
    row_shape=train["x"].shape[1:],
    sequence_labels=sequence_labels,
    label_shape=train["y"].shape[1:],
  )
  meta = dict(info or {})
  meta.update(users=list(ids), dropped_users=dropped)
  return make_federated(
    train, test, train_parts, val_parts, name, num_classes, meta, sequence_labels=sequence_labels
  )


def _group_records(source, client_key: str, x_key: str, y_key: str) -> Dict[Any, Dict[str, Any]]:
  rows: Dict[Any, Dict[str, list]] = {}
  for _, record in sources.iter_records(source):
    missing = [k for k in (client_key, x_key, y_key) if k not in record]
    if missing:
      raise ValueError(f"the records have no feature {missing[0]!r}; they have {sorted(record)}")
    client = np.asarray(record[client_key])
    key = client.item() if client.ndim == 0 else client.tobytes()
    user = rows.setdefault(key, {"x": [], "y": []})
    user["x"].append(np.asarray(record[x_key]))
    user["y"].append(int(record[y_key]))
  return {
    u: {"x": sources.to_float01(np.stack(a["x"])), "y": np.asarray(a["y"], np.int32)}
    for u, a in rows.items()
  }


def load_tfds_clients(
  name: str,
  client_key: str,
  *,
  num_classes: int,
  x_key: str = "image",
  y_key: str = "label",
  train_split: str = "train",
  test_split: str = "test",
  data_dir=None,
) -> FederatedDataset:
  """A TFDS data set with one client per value of a feature (a user or writer id).

  Reads both splits with ``tfds.data_source(..., download=False)`` like
  :func:`fedco.data.load_tfds` (prepared ``array_record`` files, no TensorFlow), groups the
  records by ``client_key`` and makes each value a client (:func:`from_users`): its
  ``train_split`` records train it, its ``test_split`` records are its held-out set. Integer
  inputs become ``float32`` in [0, 1]. Clients are in order of first appearance.

  Args:
    name: a TFDS data set name (any builder; prepared under ``data_dir``).
    client_key: the feature that names each record's client (e.g. ``"user_id"``;
      ``cifar100``'s ``"coarse_label"`` groups by superclass).
    num_classes: number of classes of ``y_key``.
    x_key: the input feature (default ``"image"``).
    y_key: the integer label feature (default ``"label"``).
    train_split: the training split (default ``"train"``).
    test_split: the held-out split, with the same clients (default ``"test"``).
    data_dir: the TFDS data directory; ``None`` uses ``TFDS_DATA_DIR`` or
      ``~/tensorflow_datasets``.

  Returns:
    A :class:`~fedco.data.FederatedDataset`; ``info["users"]`` holds the feature's values.

  Raises:
    FileNotFoundError: the data set is not prepared as ``array_record`` (with advice).
    ValueError: a feature is missing, or no client has records in both splits.

  Examples:
    CIFAR-100's 20 superclasses as clients, under ``tfds.testing.mock_data`` (random
    records with the real features):

    >>> import tensorflow_datasets as tfds
    >>> import fedco
    >>> with tfds.testing.mock_data(num_examples=60):
    ...   fed = fedco.data.load_tfds_clients("cifar100", "coarse_label", num_classes=100)
    >>> fed.train.examples["x"].shape[1:], fed.num_clients <= 20
    ((32, 32, 3), True)
  """
  for arg, value in (("name", name), ("client_key", client_key), ("x_key", x_key)):
    if not isinstance(value, str) or not value:
      raise ValueError(f"{arg} must be a non-empty string, got {value!r}")
  data_dir = None if data_dir is None else os.fspath(data_dir)
  import tensorflow_datasets as tfds  # lazily: import fedco stays fast

  users = {}
  for split in (train_split, test_split):
    source = sources.open_source(tfds, name, split, data_dir)
    users[split] = _group_records(source, client_key, x_key, y_key)
  info = {"source": "tfds", "client_key": client_key, "data_dir": data_dir}
  return from_users(
    users[train_split], users[test_split], name=name, num_classes=num_classes, info=info
  )
