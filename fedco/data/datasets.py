"""A federated data set: per-client training and validation data plus the central test split.

:func:`make_federated` turns host splits and partitions into a :class:`FederatedDataset`::

  train, test = fedco.data.load("mnist", data_dir=...)
  train_parts = fedco.data.quantity_skew(train["y"], 10, big=5000, small=20, seed=0)
  val_parts = fedco.data.matched_validation(train_parts, train["y"], test["y"], seed=0)
  fed = fedco.data.make_federated(train, test, train_parts, val_parts, name="mnist",
                                  num_classes=10)
  fedco.simulate(..., data=fed.train, ...)

The training clients index the training split and the validation clients index the test
split; each split is stored once on device (:class:`FederatedData`), never copied per client.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from fedco import _validate
from fedco.data.federated import FederatedData

Arrays = Mapping[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class FederatedDataset:
  """Clients' training and validation data and the centralized test split.

  Made by :func:`make_federated`. Not a pytree (it holds a name and metadata): pass
  ``train`` / ``val`` to jitted code (``fedco.simulate(..., data=fed.train, ...)``).

  Attributes:
    train: clients' training sets, rows of the training split ``{"x", "y"}``.
    val: clients' validation sets, rows of the test split (client ``k`` in ``train`` is
      client ``k`` here).
    test: the whole test split as host arrays ``{"x": float32, "y": int32}``.
    num_classes: number of classes.
    name: data set name (e.g. ``"mnist"``).
    info: how the clients were made (partitioner name, its arguments, seed, ...), e.g. for
      an experiment's ``config.json``; ``{}`` by default.

  Examples:
    >>> import numpy as np
    >>> import fedco
    >>> train = {"x": np.ones((6, 2), np.float32), "y": np.array([0, 1, 0, 1, 0, 1])}
    >>> test = {"x": np.ones((4, 2), np.float32), "y": np.array([0, 1, 0, 1])}
    >>> fed = fedco.data.make_federated(
    ...   train, test, [[0, 1, 2, 3], [4, 5]], [[0, 1], [2]], name="toy", num_classes=2
    ... )
    >>> fed.num_clients, fed.train_sizes().tolist(), fed.val_sizes().tolist()
    (2, [4, 2], [2, 1])
  """

  train: FederatedData
  val: FederatedData
  test: Mapping[str, np.ndarray]
  num_classes: int
  name: str
  info: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def num_clients(self) -> int:
    """The number of clients ``K``."""
    return self.train.num_clients

  def train_sizes(self) -> np.ndarray:
    """``int [K]``: training examples per client."""
    return np.asarray(self.train.counts)

  def val_sizes(self) -> np.ndarray:
    """``int [K]``: validation examples per client."""
    return np.asarray(self.val.counts)


def _check_split(name: str, split, sequence_labels: bool = False) -> dict:
  if not isinstance(split, Mapping) or "x" not in split or "y" not in split:
    raise ValueError(
      f"{name} must be a mapping with arrays 'x' and 'y', got "
      f"{type(split).__name__} with keys "
      f"{sorted(split) if isinstance(split, Mapping) else None}"
    )
  x, y = np.asarray(split["x"]), np.asarray(split["y"])
  if y.ndim != (2 if sequence_labels else 1) or x.ndim < 1 or x.shape[0] != y.shape[0]:
    labels = "[N, L]" if sequence_labels else "[N]"
    raise ValueError(
      f"{name}['x'] must be [N, ...] and {name}['y'] {labels} with the same N, "
      f"got shapes {x.shape} and {y.shape}"
    )
  return {"x": x, "y": y}


def make_federated(
  train: Arrays,
  test: Arrays,
  train_parts: Sequence[Any],
  val_parts: Sequence[Any],
  name: str,
  num_classes: int,
  info: Optional[Mapping[str, Any]] = None,
  *,
  sequence_labels: bool = False,
) -> FederatedDataset:
  """Build the clients' training and validation :class:`FederatedData` from index lists.

  Client ``k``'s training set is the rows ``train_parts[k]`` of ``train`` and its
  validation set the rows ``val_parts[k]`` of ``test``; each split is stored once on device,
  never copied per client. The usual pipeline::

    train, test = fedco.data.load("mnist", data_dir=...)
    train_parts = fedco.data.quantity_skew(train["y"], 10, big=5000, small=20, seed=0)
    val_parts = fedco.data.matched_validation(train_parts, train["y"], test["y"], seed=0)
    fed = fedco.data.make_federated(train, test, train_parts, val_parts, "mnist", 10)

  Args:
    train: training split ``{"x": [N, ...], "y": int [N]}`` (host or device arrays).
    test: test split, same layout; the validation clients index it.
    train_parts: ``K`` index arrays into ``train`` (from :mod:`fedco.data.partition`).
    val_parts: ``K`` index arrays into ``test`` (e.g. from ``matched_validation``).
    name: data set name (a string).
    num_classes: number of classes, ``>= 1``; labels must lie in ``[0, num_classes)``.
    info: optional partition metadata, kept (copied) in ``FederatedDataset.info``; ``None``
      keeps ``{}``.
    sequence_labels: ``y`` is ``int [N, L]``, a label per position of each example's
      sequence (``False``, the default: ``int [N]``).

  Returns:
    A :class:`FederatedDataset`; ``train.examples`` and ``val.examples`` are the splits as
    device arrays ``{"x", "y"}``.

  Raises:
    ValueError: malformed splits, ``train_parts`` and ``val_parts`` of different lengths,
      labels outside ``[0, num_classes)``, or bad index lists (see
      ``FederatedData.from_index_lists``).

  Examples:
    Ten offline digits-like examples: an IID split over 2 clients and validation sets drawn
    from the test split with each client's class mix.

    >>> import numpy as np
    >>> import fedco
    >>> y = np.array([0, 1] * 5)
    >>> train = {"x": np.ones((10, 3), np.float32), "y": y}
    >>> test = {"x": np.zeros((10, 3), np.float32), "y": y}
    >>> train_parts = fedco.data.iid(10, 2, seed=0)
    >>> val_parts = fedco.data.matched_validation(train_parts, y, y, seed=0, min_size=2)
    >>> fed = fedco.data.make_federated(
    ...   train, test, train_parts, val_parts, name="toy", num_classes=2, info={"seed": 0}
    ... )
    >>> fed.train.counts.tolist(), fed.val.counts.tolist(), fed.test["x"].shape, fed.info
    ([5, 5], [5, 5], (10, 3), {'seed': 0})
  """
  train = _check_split("train", train, sequence_labels)
  test = _check_split("test", test, sequence_labels)
  num_classes = _validate.positive_int("num_classes", num_classes)
  if not isinstance(name, str):
    raise ValueError(f"name must be a string, got {name!r}")
  if len(train_parts) != len(val_parts):
    raise ValueError(
      f"train_parts and val_parts must name the same clients, got "
      f"{len(train_parts)} and {len(val_parts)} clients"
    )
  for split_name, split in (("train", train), ("test", test)):
    y = split["y"]
    if y.size and (y.min() < 0 or y.max() >= num_classes):
      raise ValueError(
        f"{split_name}['y'] must lie in [0, num_classes={num_classes}), got "
        f"min {y.min()}, max {y.max()}"
      )
  return FederatedDataset(
    train=FederatedData.from_index_lists(train, train_parts),
    val=FederatedData.from_index_lists(test, val_parts),
    test=test,
    num_classes=num_classes,
    name=name,
    info=dict(info or {}),
  )
