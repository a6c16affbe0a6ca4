"""Step-imbalanced data sets: CIFAR10-ST and CIFAR100-ST (Qi et al. 2020; SPEC E5).

The ``-ST`` version of a data set keeps, for every class in the *first half* of the classes
(``c < C/2``), only the **last** ``keep_fraction`` (2%) of that class's training images in
record order: 100 of 5000 per class for CIFAR-10 and 10 of 500 for CIFAR-100. The other
classes and the test split are unchanged. ``digits-ST`` (scikit-learn's digits, bundled) is
the offline stand-in used in tests and examples; its first five classes keep 2% of about
135 training images, rounded, at least one (3 each). CIFAR needs the TFDS data prepared
beforehand (see :mod:`fedco.data.sources`); nothing is downloaded.

::

    train, test = fedco.data.load_st("cifar10", data_dir=...)
    parts = fedco.data.iid(len(train["y"]), 8, seed)         # SPEC E5: equal random split
    fed = fedco.FederatedData.from_index_lists(train, parts)
"""

from __future__ import annotations

import os
from typing import Union

import numpy as np

from fedco import _validate
from fedco.data import sources

ST_DATASETS = ("cifar10", "cifar100", "digits")


def step_imbalance(labels, num_classes: int, keep_fraction: float = 0.02) -> np.ndarray:
  """Indices (sorted) of the rows a step-imbalanced split keeps.

  Each minority class ``c < C // 2`` with ``n_c`` rows keeps its **last**
  ``max(1, round(keep_fraction * n_c))`` rows in the order of ``labels``; every row of the
  other classes is kept.

  Args:
    labels: ``int [N]`` class labels in ``[0, num_classes)``.
    num_classes: ``C >= 2``; classes ``0 .. C//2 - 1`` are the minority half.
    keep_fraction: fraction in ``(0, 1]`` of each minority class kept (its last rows);
      ``round(keep_fraction * n_c)``, at least 1. Default 0.02 (SPEC E5).

  Returns:
    ``int64`` sorted row indices into ``labels`` (index the training split with them).

  Raises:
    ValueError: labels out of range, ``num_classes < 2`` or ``keep_fraction`` outside
      ``(0, 1]``.

  Examples:
    Two classes of 5 rows: class 0 (the minority half) keeps its last 40%.

    >>> import numpy as np
    >>> import fedco
    >>> labels = np.array([0, 1, 0, 1, 0, 1, 0, 1, 0, 1])
    >>> fedco.data.step_imbalance(labels, 2, keep_fraction=0.4).tolist()
    [1, 3, 5, 6, 7, 8, 9]
  """
  labels = np.asarray(labels)
  num_classes = _validate.positive_int("num_classes", num_classes, minimum=2)
  if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(
      f"labels must be a 1-D integer array, got dtype {labels.dtype} and shape {labels.shape}"
    )
  if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
    raise ValueError(
      f"labels must lie in [0, num_classes={num_classes}), got min "
      f"{labels.min()}, max {labels.max()}"
    )
  keep_fraction = _validate.interval("keep_fraction", keep_fraction, 0, 1, closed_high=True)
  keep = np.ones(labels.shape, bool)
  for c in range(num_classes // 2):
    rows = np.flatnonzero(labels == c)
    if rows.size == 0:
      continue
    kept = max(1, int(round(keep_fraction * rows.size)))
    keep[rows[: rows.size - kept]] = False
  return np.flatnonzero(keep)


def load_st(
  name: str = "cifar10",
  data_dir: Union[str, os.PathLike, None] = None,
  *,
  keep_fraction: float = 0.02,
) -> sources.Splits:
  """The step-imbalanced training split and the unchanged test split of ``name``.

  :func:`fedco.data.load` followed by :func:`step_imbalance` on the training labels, with
  classes ``c < C // 2`` the minority half (SPEC E5: CIFAR10-ST and CIFAR100-ST).

  Args:
    name: ``cifar10`` (default), ``cifar100`` (TFDS, read with ``data_source``; see
      :mod:`fedco.data.sources` for preparing them) or ``digits`` (offline).
    data_dir: TFDS data directory (ignored for ``digits``); ``None`` uses
      ``TFDS_DATA_DIR`` or ``~/tensorflow_datasets``.
    keep_fraction: share of each minority class kept, in ``(0, 1]``; default 0.02 (see
      :func:`step_imbalance`).

  Returns:
    :class:`~fedco.data.Splits` ``(train, test)``, each ``{"x": float32, "y": int32}``:
    the kept training rows in their original order, and the whole test split.

  Raises:
    ValueError: an unknown ``name`` or a bad ``keep_fraction``.
    FileNotFoundError: the TFDS data set is not prepared under ``data_dir``.

  Examples:
    The offline ``digits-ST``: classes 0-4 keep 3 training images each.

    >>> import numpy as np
    >>> import fedco
    >>> train, test = fedco.data.load_st("digits")
    >>> np.bincount(train["y"]).tolist(), test["x"].shape
    ([3, 3, 3, 3, 3, 136, 136, 134, 130, 135], (450, 64))
  """
  if name not in ST_DATASETS:
    raise ValueError(f"name must be one of {ST_DATASETS}, got {name!r}")
  train, test = sources.load(name, data_dir)
  rows = step_imbalance(train["y"], sources.num_classes(name), keep_fraction)
  return sources.Splits({k: v[rows] for k, v in train.items()}, test)
