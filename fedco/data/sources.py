"""Labelled data sets as host NumPy arrays: ``{"x": float32 [N, ...], "y": int32 [N]}``.

Two sources:

* **TFDS through** ``tfds.data_source`` (random access over ``array_record`` files). Reading
  needs no TensorFlow: records are parsed and images decoded in NumPy (PIL or OpenCV). The
  data must already be *prepared* on disk in the ``array_record`` format; nothing is
  downloaded here (``download=False``). Preparing does need TensorFlow (TFDS encodes images
  with it), so it is done once, on a machine with network::

    pip install tensorflow tensorflow-datasets
    tfds build mnist --file_format=array_record          # or, in Python:
    python -c "import tensorflow_datasets as tfds; \\
      tfds.builder('mnist', file_format='array_record').download_and_prepare()"

  then copy ``~/tensorflow_datasets`` (or the folder given as ``--data_dir``) to the
  machine that runs fedco and pass it as ``data_dir`` (or set ``TFDS_DATA_DIR``). TFDS's
  default format is ``tfrecord``, which ``data_source`` cannot read; a data set prepared
  that way is reported as missing, with this advice and the ``tfds convert_format``
  command that converts it in place.
* **scikit-learn's digits** (1797 8x8 images, bundled with scikit-learn, no download), a
  small offline stand-in for MNIST in tests and examples.

Tests without the data: ``tfds.testing.mock_data(num_examples=n)`` patches
``DatasetBuilder.as_data_source``, so :func:`load_tfds` returns ``n`` random examples with
the real feature shapes (policy ``AUTO`` or ``USE_CODE``; ``USE_FILES`` needs
``mock_data(data_dir=...)`` pointing at real metadata, since the pip package ships none).
``mock_data`` ignores the ``data_dir`` passed to the loader. No TensorFlow is needed.

Reading decodes every PNG on the host: about 8 s for 60000 MNIST-sized images on one CPU
core with PIL (``pip install opencv-python`` makes TFDS decode faster). Load once per
process and reuse the arrays.

TFDS is imported lazily (inside the loaders), so ``import fedco`` stays fast.
"""

from __future__ import annotations

import os
import zipfile
import zlib
from typing import Any, Dict, NamedTuple, Optional, Union

import numpy as np

Arrays = Dict[str, np.ndarray]

# name -> (image feature key, label feature key, number of classes)
TFDS_DATASETS = {
  "mnist": ("image", "label", 10),
  "fashion_mnist": ("image", "label", 10),
  "cifar10": ("image", "label", 10),
  "cifar100": ("image", "label", 100),
}
#: The number of classes of each dataset ``load`` knows, by name.
#: Number of classes of each data set :func:`load` knows, by name.
NUM_CLASSES = {"digits": 10, **{name: spec[2] for name, spec in TFDS_DATASETS.items()}}
#: The names :func:`load` accepts: ``digits`` (offline) and the TFDS data sets.
DATASETS = tuple(NUM_CLASSES)

_CHUNK = 4096


class Splits(NamedTuple):
  """The train and test splits of one data set, each ``{"x": float32, "y": int32}``.

  A ``NamedTuple``: unpack it as ``train, test = fedco.data.load(...)``. The loaders
  (:func:`load`, :func:`load_digits`, :func:`load_npz`, :func:`fedco.data.load_st`) return
  one; the partitioners and :func:`fedco.data.make_federated` take its splits.

  Attributes:
    train: the training split, ``{"x": float32 [N, ...], "y": int32 [N]}`` (host NumPy).
    test: the test split, same layout with its own size ``M``.

  Examples:
    >>> import numpy as np
    >>> import fedco
    >>> splits = fedco.data.Splits(
    ...   train={"x": np.zeros((5, 3), np.float32), "y": np.zeros(5, np.int32)},
    ...   test={"x": np.zeros((2, 3), np.float32), "y": np.zeros(2, np.int32)},
    ... )
    >>> train, test = splits
    >>> train["x"].shape, test["y"].shape
    ((5, 3), (2,))
  """

  train: Arrays
  test: Arrays


def num_classes(name: str) -> int:
  """Number of classes of a data set that :func:`load` knows.

  Args:
    name: one of :data:`DATASETS`: ``digits``, ``mnist``, ``fashion_mnist``, ``cifar10``,
      ``cifar100``.

  Returns:
    The number of classes (labels lie in ``[0, num_classes)``), from :data:`NUM_CLASSES`.

  Raises:
    ValueError: ``name`` is not one of :data:`DATASETS`.

  Examples:
    >>> import fedco
    >>> fedco.data.num_classes("digits"), fedco.data.num_classes("cifar100")
    (10, 100)
  """
  _check_name("name", name, DATASETS)
  return NUM_CLASSES[name]


def describe(name: str, data_dir: Union[str, os.PathLike, None] = None) -> str:
  """The name a figure or summary gives the data :func:`load` reads (where it came from).

  Args:
    name: the data set's name, as for :func:`load`.
    data_dir: :func:`load`'s ``data_dir``.

  Returns:
    ``name``, or ``"<name> from <file>"`` when ``data_dir`` is an image folder: a copy in
    another format (``cifar10 from cifar10_jpeg.tar.gz``: lossy JPEG) is not the TFDS
    data, and its numbers must say so.

  Examples:
    >>> import fedco
    >>> fedco.data.sources.describe("cifar10"), fedco.data.sources.describe("digits", "x")
    ('cifar10', 'digits')
  """
  from fedco.data import image_folder  # pylint: disable=g-import-not-at-top

  if name != "digits" and image_folder.is_image_folder(data_dir):
    assert data_dir is not None  # is_image_folder(None) is False
    return f"{name} from {os.path.basename(os.path.normpath(os.fspath(data_dir)))}"
  return name


def _check_name(arg: str, name: Any, allowed) -> None:
  if name not in allowed:
    raise ValueError(f"{arg} must be one of {tuple(allowed)}, got {name!r}")


def _prepare_hint(name: str, data_dir: Optional[str]) -> str:
  target = f" --data_dir={data_dir}" if data_dir else ""
  return (
    f"To prepare it (once, on a machine with network access; preparing needs "
    f"TensorFlow):\n"
    f"  pip install tensorflow tensorflow-datasets\n"
    f"  tfds build {name} --file_format=array_record{target}\n"
    f"or in Python: tfds.builder('{name}', file_format='array_record'"
    f"{f', data_dir={data_dir!r}' if data_dir else ''}).download_and_prepare()\n"
    f"then copy the data directory (default ~/tensorflow_datasets) here and pass it as "
    f"data_dir (or set TFDS_DATA_DIR). fedco reads it with tfds.data_source, without "
    f"TensorFlow, and never downloads."
  )


def open_source(tfds, name: str, split: str, data_dir: Optional[str]):
  """``tfds.data_source(..., download=False)``, with a missing data set as FileNotFoundError.

  ``tfds.data_source`` does not say "not found" itself (tfds 4.9.10). With
  ``download=False`` an unprepared data set fails with ``KeyError("Trying to access
  `splits['train']` but `splits` is empty ...")``; one prepared only as ``tfrecord`` (TFDS's
  default format) fails with ``NotImplementedError("Random access data source for file format
  ... is not supported")`` when ``data_dir`` is given, and with ``ValueError("File format is
  already set to FileFormat.TFRECORD ...")`` when it is not (``data_source`` then asks for
  ``array_record``). With ``download=True``, the default, it would try to download and build
  the data set instead. After a failure we ask the builder what is on disk, to tell these
  apart from other errors (a bad split name, say), which propagate unchanged.
  """
  try:
    return tfds.data_source(name, split=split, data_dir=data_dir, download=False)
  except (KeyError, ValueError, FileNotFoundError, NotImplementedError, AssertionError) as err:
    builder = tfds.builder(name, data_dir=data_dir)
    where = builder.data_dir
    if not builder.is_prepared():
      raise FileNotFoundError(
        f"TFDS data set {name!r} is not prepared under data_dir={data_dir!r} "
        f"(looked in {where}). " + _prepare_hint(name, data_dir)
      ) from err
    formats = builder.info.available_file_formats()
    if tfds.core.FileFormat.ARRAY_RECORD not in formats:
      raise FileNotFoundError(
        f"TFDS data set {name!r} under data_dir={data_dir!r} ({where}) has no "
        f"array_record files (formats on disk: {sorted(f.value for f in formats)}); "
        f"tfds.data_source needs array_record. Convert it where TensorFlow is installed "
        f"(tfds convert_format --dataset_version_dir={where} "
        f"--out_file_format=array_record). " + _prepare_hint(name, data_dir)
      ) from err
    raise


def iter_records(source):
  """``(position, record)`` for every record of a data source, read in chunks.

  Reads with ``source.__getitems__`` (array_record reads a chunk in parallel, about 3x
  faster than one record at a time). If the batched read raises ``TypeError`` on the first
  chunk, falls back to ``source[i]``: the mocked source that ``tfds.testing.mock_data``
  installs in tfds 4.9.10 has a ``__getitems__`` that fails so.
  """
  n = len(source)
  if n == 0:
    raise ValueError(f"data source {source!r} is empty")
  batched = callable(getattr(source, "__getitems__", None))
  for start in range(0, n, _CHUNK):
    keys = list(range(start, min(n, start + _CHUNK)))
    records = None
    if batched:
      try:
        records = source.__getitems__(keys)
      except TypeError:
        if start:
          raise
        batched = False
    if records is None:
      records = [source[i] for i in keys]
    yield from enumerate(records, start)


def _read_records(source, image_key: str, label_key: str):
  """All records of a data source as ``(images uint8 [N, ...], labels int64 [N])``."""
  n = len(source)
  images: Optional[np.ndarray] = None
  labels: Optional[np.ndarray] = None
  for i, record in iter_records(source):
    image = np.asarray(record[image_key])
    if images is None:
      images = np.empty((n,) + image.shape, image.dtype)
      labels = np.empty((n,), np.int64)
    assert labels is not None  # made with images
    images[i] = image
    labels[i] = record[label_key]
  return images, labels


def to_float01(images: np.ndarray) -> np.ndarray:
  if np.issubdtype(images.dtype, np.integer):
    scale = float(np.iinfo(images.dtype).max)
    return np.multiply(images, 1.0 / scale, dtype=np.float32)
  return images.astype(np.float32)


def load_tfds(name: str, split: str, data_dir: Union[str, os.PathLike, None] = None) -> Arrays:
  """One split of a TFDS image-classification data set, read whole into NumPy.

  Reads with ``tfds.data_source(..., download=False)``: it never downloads, and needs no
  TensorFlow, but the data set must already be prepared on disk in the ``array_record``
  format (see :mod:`fedco.data.sources` for the one-time ``tfds build`` command). Images
  are decoded on the host (about 8 s for 60000 MNIST images); load once and reuse the
  arrays.

  Args:
    name: one of ``mnist``, ``fashion_mnist``, ``cifar10``, ``cifar100`` (fine labels).
    split: a TFDS split, e.g. ``"train"``, ``"test"`` or ``"train[:10%]"``.
    data_dir: the TFDS data directory; ``None`` uses ``TFDS_DATA_DIR`` or
      ``~/tensorflow_datasets``.

  Returns:
    ``{"x": float32 [N, H, W, C] in [0, 1], "y": int32 [N]}`` in record order.

  Raises:
    ValueError: ``name`` is not a supported data set.
    FileNotFoundError: the data set is not prepared in ``array_record`` format under
      ``data_dir``; the message says how to prepare it.

  Examples:
    Offline, under ``tfds.testing.mock_data`` (random records with MNIST's shapes; with
    real data, pass ``data_dir`` instead):

    >>> import tensorflow_datasets as tfds
    >>> import fedco
    >>> with tfds.testing.mock_data(num_examples=4):
    ...   train = fedco.data.load_tfds("mnist", "train")
    >>> train["x"].shape, train["x"].dtype, train["y"].dtype
    ((4, 28, 28, 1), dtype('float32'), dtype('int32'))
  """
  _check_name("name", name, TFDS_DATASETS)
  if not isinstance(split, str) or not split:
    raise ValueError(f"split must be a non-empty TFDS split string, got {split!r}")
  data_dir = None if data_dir is None else os.fspath(data_dir)
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  image_key, label_key, _ = TFDS_DATASETS[name]
  source = open_source(tfds, name, split, data_dir)
  images, labels = _read_records(source, image_key, label_key)
  return {"x": to_float01(images), "y": labels.astype(np.int32)}


def load_digits(test_fraction: float = 0.25, seed: int = 0) -> Splits:
  """scikit-learn's 8x8 digits with a deterministic stratified train/test split.

  The 1797 images ship inside scikit-learn (``sklearn.datasets.load_digits`` reads a file
  bundled with the package): nothing is downloaded, so this is the offline stand-in for
  MNIST in tests, examples and the default E1 configuration. The test split takes
  ``round(test_fraction * n_c)`` images of each class ``c``, drawn by
  ``np.random.default_rng(seed)``.

  Args:
    test_fraction: share of each class put in the test split, in (0, 1); default 0.25.
    seed: seed of the split (``np.random.default_rng``); default 0.

  Returns:
    :class:`Splits`; ``x`` is ``float32 [n, 64]`` in [0, 1] (pixel values / 16), ``y`` is
    ``int32 [n]`` in 0..9. With the defaults: 1347 train and 450 test images.

  Raises:
    ImportError: scikit-learn is missing (it is a dependency of fedco, but may have been
      left out of a hand-made environment).
    ValueError: ``test_fraction`` outside (0, 1).

  Examples:
    >>> import fedco
    >>> train, test = fedco.data.load_digits()
    >>> train["x"].shape, test["x"].shape, train["x"].dtype, train["y"].dtype
    ((1347, 64), (450, 64), dtype('float32'), dtype('int32'))
    >>> float(train["x"].max()), sorted(set(test["y"].tolist())) == list(range(10))
    (1.0, True)
  """
  if isinstance(test_fraction, bool) or not 0 < test_fraction < 1:
    raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
  try:
    from sklearn import datasets as sk_datasets  # pylint: disable=g-import-not-at-top
  except ImportError as err:
    raise ImportError(
      "load_digits needs scikit-learn, a dependency of fedco: pip install scikit-learn"
    ) from err
  digits = sk_datasets.load_digits()
  x = (np.asarray(digits.data, np.float32) / 16.0).reshape(-1, 64)
  y = np.asarray(digits.target, np.int32)
  is_test = stratified_test_mask(y, test_fraction, seed)
  return Splits({"x": x[~is_test], "y": y[~is_test]}, {"x": x[is_test], "y": y[is_test]})


def stratified_test_mask(labels: np.ndarray, test_fraction: float, seed: int) -> np.ndarray:
  """``bool [N]``, True on the test rows: ``round(test_fraction * n_c)`` of each class
  ``c``, drawn by ``np.random.default_rng(seed)`` (classes in sorted order).

  Raises:
    ValueError: ``test_fraction`` outside (0, 1).
  """
  if isinstance(test_fraction, bool) or not 0 < test_fraction < 1:
    raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
  rng = np.random.default_rng(seed)
  is_test = np.zeros(labels.size, bool)
  for c in np.unique(labels):
    rows = rng.permutation(np.flatnonzero(labels == c))
    is_test[rows[: int(round(test_fraction * rows.size))]] = True
  return is_test


NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")


def load_npz(path: Union[str, os.PathLike]) -> Splits:
  """Train and test splits from a NumPy archive: your own data, offline.

  The archive is what ``np.savez(path, x_train=..., y_train=..., x_test=..., y_test=...)``
  writes; it is read with ``allow_pickle=False``.

  Args:
    path: an ``.npz`` file (``np.savez``) holding ``x_train`` ``[N, ...]``, ``y_train``
      ``[N]``, ``x_test`` ``[M, ...]`` and ``y_test`` ``[M]``; features with the same shape
      after the first axis, labels whole numbers ``>= 0``. Nothing in it is executed (no
      pickled objects are read).

  Returns:
    :class:`Splits` with ``x`` as ``float32`` (values as stored: scale them beforehand) and
    ``y`` as ``int32``.

  Raises:
    FileNotFoundError: ``path`` does not exist.
    ValueError: not a NumPy archive, a key missing, or arrays of the wrong shape or labels.

  Examples:
    >>> import os, tempfile
    >>> import numpy as np
    >>> import fedco
    >>> with tempfile.TemporaryDirectory() as folder:
    ...   path = os.path.join(folder, "mine.npz")
    ...   np.savez(path, x_train=np.ones((6, 4)), y_train=np.arange(6) % 3,
    ...            x_test=np.ones((3, 4)), y_test=np.arange(3))
    ...   train, test = fedco.data.load_npz(path)
    >>> train["x"].shape, train["x"].dtype, test["y"].tolist()
    ((6, 4), dtype('float32'), [0, 1, 2])
  """
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"path: no such .npz file: {os.path.abspath(path)}")
  unreadable = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error)
  try:
    archive = np.load(path, allow_pickle=False)
  except unreadable:
    raise ValueError(f"path must be a NumPy .npz archive (np.savez), {path} is not") from None
  if not isinstance(archive, np.lib.npyio.NpzFile):
    raise ValueError(f"path must be a NumPy .npz archive (np.savez), {path} is a single array")
  with archive:
    missing = [k for k in NPZ_KEYS if k not in archive.files]
    if missing:
      raise ValueError(
        f"path: {path} must hold the arrays {NPZ_KEYS}, missing {missing} "
        f"(it has {sorted(archive.files)})"
      )
    arrays = {}
    for key in NPZ_KEYS:
      try:
        arrays[key] = archive[key]
      except unreadable as err:  # object arrays (pickles), damaged members
        raise ValueError(
          f"path: {key} in {path} cannot be read as a numeric array ({type(err).__name__})"
        ) from None
      if not isinstance(arrays[key], np.ndarray):  # a member not stored as {key}.npy: bytes
        raise ValueError(
          f"path: {key} in {path} is not a NumPy array (the archive's member "
          f"{key!r} is raw bytes, not {key}.npy); save the arrays with np.savez"
        )
  splits = []
  for split in ("train", "test"):
    x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
    if y.ndim != 1 or x.ndim < 1 or x.shape[0] != y.shape[0] or not y.size:
      raise ValueError(
        f"path: x_{split} must be [N, ...] and y_{split} [N] with the same "
        f"N >= 1, got shapes {x.shape} and {y.shape} in {path}"
      )
    if x.dtype.kind not in "biuf":
      raise ValueError(f"path: x_{split} must hold real numbers, got dtype {x.dtype} in {path}")
    if (
      y.dtype.kind not in "biuf"
      or not np.all(np.isfinite(y))
      or np.any(y != np.round(y))
      or y.min() < 0
      or y.max() >= 2**31
    ):
      raise ValueError(
        f"path: y_{split} must hold class labels, whole numbers in "
        f"[0, 2**31), got dtype {y.dtype} in {path}"
      )
    splits.append({"x": x.astype(np.float32), "y": y.astype(np.int32)})
  if splits[0]["x"].shape[1:] != splits[1]["x"].shape[1:]:
    raise ValueError(
      f"path: x_train and x_test must have the same example shape, got "
      f"{splits[0]['x'].shape[1:]} and {splits[1]['x'].shape[1:]} in {path}"
    )
  return Splits(*splits)


def load(name: str, data_dir: Union[str, os.PathLike, None] = None) -> Splits:
  """The train and test splits of a named data set.

  ``digits`` is :func:`load_digits` with its defaults (offline); a TFDS name reads the
  ``train`` and ``test`` splits with :func:`load_tfds`, which needs the data set prepared
  beforehand (never downloaded here).

  Args:
    name: ``digits`` (scikit-learn, offline) or one of the TFDS names ``mnist``,
      ``fashion_mnist``, ``cifar10``, ``cifar100`` (see :data:`DATASETS`).
    data_dir: TFDS data directory (ignored for ``digits``); ``None`` uses
      ``TFDS_DATA_DIR`` or ``~/tensorflow_datasets``. An image folder instead (a
      ``.tar(.gz)`` archive, or a folder holding ``train/``, of ``split/<class>/<file>``
      images, such as ``../shared/data/cifar10_jpeg/cifar10_jpeg.tar.gz``): its ``train``
      and ``test`` splits by :func:`fedco.data.image_folder.load_image_folders`, labels
      numbering the class folders of both splits sorted.

  Returns:
    :class:`Splits` ``(train, test)``, each ``{"x": float32, "y": int32}``; images in
    ``[0, 1]``.

  Raises:
    ValueError: unknown ``name``.
    FileNotFoundError: a TFDS data set is not prepared under ``data_dir``.

  Examples:
    >>> import fedco
    >>> train, test = fedco.data.load("digits")
    >>> train["x"].shape, test["y"].shape, fedco.data.num_classes("digits")
    ((1347, 64), (450,), 10)
  """
  _check_name("name", name, DATASETS)
  if name == "digits":
    return load_digits()
  from fedco.data import image_folder  # pylint: disable=g-import-not-at-top

  if image_folder.is_image_folder(data_dir):
    assert data_dir is not None  # is_image_folder(None) is False
    classes, arrays = image_folder.load_image_folders(data_dir, ("train", "test"))
    if len(classes) > NUM_CLASSES[name]:
      raise ValueError(
        f"data_dir={os.fspath(data_dir)!r} holds {len(classes)} class folders; {name} has "
        f"{NUM_CLASSES[name]}"
      )
    return Splits(arrays["train"], arrays["test"])
  return Splits(load_tfds(name, "train", data_dir), load_tfds(name, "test", data_dir))
