r"""LEAF's federated benchmarks (JSON files) and the Synthetic(alpha, beta) generator.

`LEAF <https://leaf.cmu.edu>`_ stores each benchmark as JSON files with three keys:
``users`` (the user ids), ``num_samples`` (examples per user) and ``user_data``
(``{user: {"x": [...], "y": [...]}}``), split into ``train/`` and ``test/`` folders. fedco
reads them into one client per user (:func:`fedco.data.from_users`):

* ``femnist``: 62 classes (digits, upper, lower case) by writer; LEAF's ``x`` is 784 floats
  with 1.0 the white background; fedco returns ``float32 [n, 28, 28, 1]`` as ``1 - x``, ink
  1.0 like its MNIST (and FedJAX's EMNIST).
* ``shakespeare``: next character after 80, by speaking role; ``x`` ``int32 [n, 80]``
  indices into LEAF's 80-letter alphabet (:data:`LETTERS`), any other character
  ``80``; 81 classes.
* ``sent140``: tweet sentiment by user; ``x`` ``int32 [n, max_len]`` word ids of the
  tweet's text (0 padding, 1 a word outside the ``vocab_size`` most frequent training
  words); 2 classes.
* ``synthetic``: ``x`` ``float32 [n, d]``, ``y`` ``int32``; the class count is read off the
  labels (at least ``num_classes``).

Preparing the files needs network, once (LEAF's scripts, in ``leaf/data/<name>/``)::

  git clone https://github.com/TalwalkarLab/leaf && cd leaf/data/femnist
  ./preprocess.sh -s niid --sf 0.05 -k 0 -t sample   # 5% of the writers; --sf 1.0: all
  # shakespeare: ./preprocess.sh -s niid --sf 0.2 -k 0 -t sample --tf 0.8
  # sent140:     ./preprocess.sh -s niid --sf 0.05 -k 3 -t sample

then pass ``leaf/data/femnist/data`` (holding ``train/`` and ``test/``) to :func:`load_leaf`.
``-t sample`` splits each user's examples into training and held-out; ``-t user`` gives
disjoint users, which fedco refuses (its metrics are each client's held-out accuracy).

:func:`synthetic_users` is FedProx's Synthetic(alpha, beta) (Li et al., 2020): user ``k``'s
model and inputs are drawn around ``u_k ~ N(0, alpha^2)`` and ``B_k ~ N(0, beta^2)``, so
``alpha`` sets how much the users' labelling functions differ and ``beta`` how much their
inputs do. It needs no download, and :func:`write_leaf` stores it in LEAF's format.
"""

from __future__ import annotations

import collections
import json
import os
import re
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from fedco import _validate, io
from fedco.data.datasets import FederatedDataset
from fedco.data.natural import from_users

#: LEAF's Shakespeare alphabet (``models/utils/language_utils.py``); index 80 is "other".
LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
#: The LEAF data sets :func:`load_leaf` converts.
LEAF_DATASETS = ("femnist", "shakespeare", "sent140", "synthetic")
_KEYS = ("users", "num_samples", "user_data")

__all__ = [
  "LETTERS",
  "LEAF_DATASETS",
  "read_leaf",
  "write_leaf",
  "load_leaf",
  "synthetic_users",
  "synthetic",
]


def _files(path: str) -> List[str]:
  if os.path.isfile(path):
    return [path]
  if not os.path.isdir(path):
    raise FileNotFoundError(f"path {path!r} does not exist (a LEAF .json file or a folder of them)")
  files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".json"))
  if not files:
    raise FileNotFoundError(f"path {path!r} holds no .json files (LEAF's train/ or test/ folder)")
  return files


def _read_file(path: str) -> Dict[str, Dict[str, list]]:
  try:
    with open(path, encoding="utf-8") as f:
      content = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"{path}: not a JSON file ({e})") from None
  if not isinstance(content, dict) or any(k not in content for k in _KEYS):
    found = sorted(content) if isinstance(content, dict) else type(content).__name__
    raise ValueError(f"{path}: a LEAF file has keys {list(_KEYS)}, this one has {found}")
  users, counts, data = (content[k] for k in _KEYS)
  if not isinstance(users, list) or not isinstance(counts, list) or len(users) != len(counts):
    raise ValueError(f"{path}: 'users' and 'num_samples' must be lists of the same length")
  out = {}
  for user in users:
    if user in out:
      raise ValueError(f"{path}: user {user!r} is listed twice in 'users'")
    arrays = data.get(user) if isinstance(data, dict) else None
    if not isinstance(arrays, dict) or "x" not in arrays or "y" not in arrays:
      raise ValueError(f"{path}: user {user!r} has no 'x' and 'y' in 'user_data'")
    if len(arrays["x"]) != len(arrays["y"]):
      raise ValueError(
        f"{path}: user {user!r} has {len(arrays['x'])} inputs 'x' but {len(arrays['y'])} labels 'y'"
      )
    out[user] = {"x": arrays["x"], "y": arrays["y"]}
  return out


def read_leaf(path) -> Dict[str, Dict[str, list]]:
  """Every user's raw examples from LEAF JSON files, in file and user order.

  ``num_samples`` is not checked against the examples: LEAF's own Shakespeare test files
  count the 79 windows its split skips. Lengths of ``x`` and ``y`` must agree.

  Args:
    path: a LEAF ``.json`` file, or a folder whose ``.json`` files are read in name order
      (e.g. ``leaf/data/femnist/data/train``).

  Returns:
    ``{user: {"x": list, "y": list}}`` as stored (lists of JSON values).

  Raises:
    FileNotFoundError: ``path`` does not exist or holds no ``.json`` file.
    ValueError: a file is not JSON, lacks ``users`` / ``num_samples`` / ``user_data``, a
      user has no or mismatched ``x`` and ``y``, or two files hold the same user; the
      message names the file.

  Examples:
    >>> import json, os, tempfile
    >>> import fedco
    >>> path = os.path.join(tempfile.mkdtemp(), "all_data_0.json")
    >>> with open(path, "w") as f:
    ...   json.dump({"users": ["u1"], "num_samples": [2],
    ...              "user_data": {"u1": {"x": [[0.5, 1.0], [0.0, 2.0]], "y": [1, 0]}}}, f)
    >>> fedco.data.read_leaf(path)
    {'u1': {'x': [[0.5, 1.0], [0.0, 2.0]], 'y': [1, 0]}}
  """
  return _read_leaf(os.fspath(path))[0]


def _read_leaf(path: str) -> Tuple[Dict[str, Dict[str, list]], Dict[str, str]]:
  """:func:`read_leaf` and the file each user came from."""
  users: Dict[str, Dict[str, list]] = {}
  where: Dict[str, str] = {}
  for file in _files(path):
    for user, arrays in _read_file(file).items():
      if user in users:
        raise ValueError(f"{file}: user {user!r} is also in {where[user]}")
      users[user], where[user] = arrays, file
  return users, where


def write_leaf(path, users: Mapping[str, Mapping[str, Any]]) -> None:
  """Write users' examples as one LEAF JSON file (atomically).

  Args:
    path: the ``.json`` file to write; its folder must exist.
    users: ``{user: {"x": [n, ...], "y": [n]}}`` (arrays or lists); ids are written as
      strings.

  Returns:
    ``None``; :func:`read_leaf` reads the file back.

  Raises:
    FileNotFoundError: the folder of ``path`` does not exist.
    ValueError: a user lacks ``x`` or ``y``, or has more inputs than labels or fewer.

  Examples:
    >>> import os, tempfile
    >>> import numpy as np
    >>> import fedco
    >>> path = os.path.join(tempfile.mkdtemp(), "train.json")
    >>> fedco.data.write_leaf(path, {"a": {"x": np.eye(2), "y": np.array([0, 1])}})
    >>> fedco.data.read_leaf(path)["a"]["y"]
    [0, 1]
  """
  folder = os.path.dirname(os.path.abspath(os.fspath(path)))
  if not os.path.isdir(folder):
    raise FileNotFoundError(f"write_leaf: the folder {folder!r} of path does not exist")
  for u, a in users.items():
    if not isinstance(a, Mapping) or "x" not in a or "y" not in a:
      raise ValueError(f"write_leaf: users[{u!r}] must hold 'x' and 'y'")
    if len(a["x"]) != len(a["y"]):
      raise ValueError(
        f"write_leaf: users[{u!r}] has {len(a['x'])} inputs 'x' but {len(a['y'])} labels 'y'"
      )
  data = {
    str(u): {"x": np.asarray(a["x"]).tolist(), "y": np.asarray(a["y"]).tolist()}
    for u, a in users.items()
  }
  content = {
    "users": list(data),
    "num_samples": [len(a["y"]) for a in data.values()],
    "user_data": data,
  }
  io.atomic_write(os.fspath(path), json.dumps(content))


def class_ids(y, who: str) -> np.ndarray:
  """Class ids from a list (LEAF) or an array (FedJAX) of labels; whole numbers >= 0 only."""
  bad = f"{who}: labels must be a list of integers >= 0 (class ids)"
  values = np.asarray(y) if isinstance(y, np.ndarray) else None
  if values is None:
    odd = [v for v in y if not isinstance(v, (int, float))]  # (a bool is an int: 0 or 1)
    if odd:  # class names, one-hot rows, numbers written as strings
      raise ValueError(f"{bad}, got {odd[0]!r}")
    values = np.asarray(y, dtype=np.float64)
  elif values.dtype.kind not in "biuf":
    raise ValueError(f"{bad}, got an array of {values.dtype}")
  labels = values.astype(np.float64).reshape(-1)
  if labels.size and not np.all(np.isfinite(labels)):
    raise ValueError(f"{bad}, got {labels[~np.isfinite(labels)][0]!r}")
  fractional = labels != np.round(labels)
  if np.any(fractional):
    raise ValueError(f"{bad}, got {labels[fractional][0]!r} (example {np.argmax(fractional)})")
  if labels.size and labels.min() < 0:
    raise ValueError(f"{bad}, got {labels.min():g} (example {np.argmin(labels)})")
  return labels.astype(np.int32)


def grey_images(x, who: str) -> np.ndarray:
  """EMNIST-style grey images ``[n, 28, 28, 1]`` from rows of 784 pixels (or 28x28, or
  28x28x1)."""
  try:
    pixels = np.asarray(x, np.float32)
  except (ValueError, TypeError):  # rows of different lengths, or not numbers
    raise ValueError(
      f"{who}: inputs must be 784 pixels (28x28) each, got rows of different lengths or not numbers"
    ) from None
  if pixels.ndim not in (2, 3, 4) or int(np.prod(pixels.shape[1:])) != 784:
    raise ValueError(f"{who}: inputs must be 784 pixels (28x28) each, got shape {pixels.shape}")
  return pixels.reshape(-1, 28, 28, 1)


def _femnist(x, y, who, _):
  return {"x": 1.0 - grey_images(x, who), "y": class_ids(y, who)}


def letter_ids(text: str) -> List[int]:
  """Each character's index in :data:`LETTERS` (``80`` for any other character)."""
  return [LETTERS.find(c) if c in LETTERS else len(LETTERS) for c in text]


def _shakespeare(x, y, who, _):
  if any(not isinstance(s, str) or len(s) != 80 for s in x):
    raise ValueError(f"{who}: shakespeare inputs must be 80-character strings")
  if any(not isinstance(c, str) or len(c) != 1 for c in y):
    raise ValueError(f"{who}: shakespeare labels must be single characters")
  xs = np.asarray([letter_ids(s) for s in x], np.int32).reshape(-1, 80)
  return {"x": xs, "y": np.asarray(letter_ids("".join(y)), np.int32)}


def _words(row, who: str) -> List[str]:
  if not isinstance(row, list) or len(row) < 5 or not isinstance(row[4], str):
    raise ValueError(f"{who}: sent140 inputs must be tweet rows, text 5th")
  return re.findall(r"[\w']+", row[4].lower())


def _sent140(x, y, who, vocab):
  ids = np.zeros((len(x), vocab["max_len"]), np.int32)
  for i, row in enumerate(x):
    tokens = [vocab["index"].get(w, 1) for w in _words(row, who)][: vocab["max_len"]]
    ids[i, : len(tokens)] = tokens
  return {"x": ids, "y": class_ids(y, who)}


def _synthetic(x, y, who, _):
  try:
    inputs = np.asarray(x)
  except ValueError:  # rows of different lengths
    inputs = np.asarray([], object)
  if inputs.ndim != 2 or inputs.dtype.kind not in "biuf":
    raise ValueError(f"{who}: synthetic inputs must be rows of numbers, all of one length")
  return {"x": inputs.astype(np.float32), "y": class_ids(y, who)}


_CONVERT = {"femnist": _femnist, "shakespeare": _shakespeare}
_CONVERT.update(sent140=_sent140, synthetic=_synthetic)
_CLASSES = {"femnist": 62, "shakespeare": len(LETTERS) + 1, "sent140": 2, "synthetic": 1}


def _vocabulary(users, where, vocab_size: int, max_len: int) -> Dict[str, Any]:
  counts: collections.Counter = collections.Counter()
  for user, arrays in users.items():
    for row in arrays["x"]:
      counts.update(_words(row, f"{where[user]}: train user {user!r}"))
  words = sorted(counts, key=lambda w: (-counts[w], w))[: vocab_size - 2]
  return {"index": {w: i + 2 for i, w in enumerate(words)}, "max_len": max_len}


def load_leaf(
  data_dir,
  dataset: str,
  *,
  num_classes: int = 10,
  vocab_size: int = 10_000,
  max_len: int = 25,
) -> FederatedDataset:
  """A LEAF benchmark with one client per user: its ``train/`` and ``test/`` JSON files.

  Args:
    data_dir: the folder holding LEAF's ``train/`` and ``test/`` (``leaf/data/<name>/data``
      after ``preprocess.sh ... -t sample``).
    dataset: one of :data:`LEAF_DATASETS`; it decides the conversion (module docstring).
    num_classes: ``synthetic`` only: the least number of classes (LEAF's generator makes 5
      by default, FedProx's 10); more are used when a label is larger.
    vocab_size: ``sent140`` only: word ids kept, padding and unknown included (``>= 3``).
    max_len: ``sent140`` only: words kept per tweet (``>= 1``).

  Returns:
    A :class:`~fedco.data.FederatedDataset`: client ``k`` is the ``k``-th user with training
    and held-out examples; ``info`` has ``users``, ``dropped_users`` and the arguments.

  Raises:
    FileNotFoundError: ``data_dir``, ``data_dir/train`` or ``data_dir/test`` is missing, or
      one holds no ``.json`` file.
    ValueError: a bad argument, or a damaged file (named in the message).

  Examples:
    A tiny Synthetic set written in LEAF's format, then read back:

    >>> import os, tempfile
    >>> import fedco
    >>> root = tempfile.mkdtemp()
    >>> train, test = fedco.data.synthetic_users(1.0, 1.0, num_users=3, seed=0)
    >>> for split, users in (("train", train), ("test", test)):
    ...   os.mkdir(os.path.join(root, split))
    ...   fedco.data.write_leaf(os.path.join(root, split, "data.json"), users)
    >>> fed = fedco.data.load_leaf(root, "synthetic")
    >>> fed.num_clients, fed.num_classes, fed.train.examples["x"].shape[1]
    (3, 10, 60)
  """
  dataset = _validate.one_of("dataset", dataset, LEAF_DATASETS)
  num_classes = _validate.positive_int("num_classes", num_classes)
  vocab_size = _validate.positive_int("vocab_size", vocab_size, minimum=3)
  max_len = _validate.positive_int("max_len", max_len)
  root = os.fspath(data_dir)
  if not os.path.isdir(root):
    raise FileNotFoundError(
      f"data_dir {root!r} is not a folder (LEAF's data/<name>/data, holding train/ and test/)"
    )
  raw, where = {}, {}
  for split in ("train", "test"):
    raw[split], where[split] = _read_leaf(os.path.join(root, split))
    if not raw[split]:
      raise ValueError(f"{os.path.join(root, split)}: its LEAF files list no users")
  vocab = None
  if dataset == "sent140":
    vocab = _vocabulary(raw["train"], where["train"], vocab_size, max_len)
  convert = _CONVERT[dataset]
  empty = {"x": np.zeros((0,), np.float32), "y": np.zeros((0,), np.int32)}  # from_users drops it
  users = {
    split: {
      u: convert(a["x"], a["y"], f"{where[split][u]}: {split} user {u!r}", vocab)
      if len(a["y"])
      else empty
      for u, a in raw[split].items()
    }
    for split in raw
  }
  classes = _CLASSES[dataset]
  if dataset == "synthetic":
    top = max(int(a["y"].max(initial=0)) for s in users.values() for a in s.values())
    classes = max(num_classes, top + 1)
  info = {"source": "leaf", "data_dir": root, "vocab_size": vocab_size, "max_len": max_len}
  return from_users(users["train"], users["test"], name=dataset, num_classes=classes, info=info)


def synthetic_users(
  alpha: float,
  beta: float,
  *,
  num_users: int = 30,
  dim: int = 60,
  num_classes: int = 10,
  train_fraction: float = 0.9,
  max_samples: Optional[int] = None,
  seed: int = 0,
) -> Tuple[Dict[str, Dict[str, np.ndarray]], Dict[str, Dict[str, np.ndarray]]]:
  r"""FedProx's Synthetic(alpha, beta) users (Li et al., 2020, ``data/synthetic_*``).

  For user :math:`k`: :math:`u_k \sim N(0, \alpha^2)`, :math:`B_k \sim N(0, \beta^2)`,
  :math:`v_k \sim N(B_k, I_d)`, :math:`W_k \sim N(u_k, 1)^{d \times C}`,
  :math:`b_k \sim N(u_k, 1)^C`; its :math:`n_k = \lfloor \mathrm{LogNormal}(4, 2) \rfloor +
  50` inputs are :math:`x \sim N(v_k, \Sigma)` with :math:`\Sigma = \mathrm{diag}(j^{-1.2})`
  and labels :math:`y = \arg\max_c (W_k^\top x + b_k)_c`. Each user's examples are shuffled
  and the first ``floor(train_fraction * n_k)`` are its training set. ``alpha = beta = 0``
  still differs across users (their own ``W_k``, ``v_k``); FedProx's IID variant is not
  this.

  Args:
    alpha: spread of the users' models, ``>= 0`` (a standard deviation, as in FedProx).
    beta: spread of the users' input means, ``>= 0``.
    num_users: number of users ``K >= 1`` (FedProx: 30).
    dim: input dimension ``d >= 1`` (60).
    num_classes: classes ``C >= 2`` (10).
    train_fraction: each user's training share, in (0, 1) (0.9).
    max_samples: cap on :math:`n_k` (``None``: FedProx's uncapped draw; users of tens of
      thousands of examples occur).
    seed: seed of ``np.random.default_rng``: one seed, one data set.

  Returns:
    ``(train_users, test_users)``, each ``{"f_00000": {"x": float32 [n, d], "y": int32
    [n]}, ...}``; :func:`fedco.data.from_users` makes the clients, :func:`write_leaf` the
    LEAF files.

  Examples:
    >>> import fedco
    >>> train, test = fedco.data.synthetic_users(1.0, 1.0, num_users=2, seed=0)
    >>> list(train), train["f_00000"]["x"].shape[1], train["f_00000"]["y"].dtype
    (['f_00000', 'f_00001'], 60, dtype('int32'))
  """
  alpha = _validate.positive("alpha", alpha, allow_zero=True)
  beta = _validate.positive("beta", beta, allow_zero=True)
  num_users = _validate.positive_int("num_users", num_users)
  dim = _validate.positive_int("dim", dim)
  num_classes = _validate.positive_int("num_classes", num_classes, minimum=2)
  train_fraction = _validate.open_unit("train_fraction", train_fraction)
  if max_samples is not None:
    max_samples = _validate.positive_int("max_samples", max_samples, minimum=2)
  seed = _validate.positive_int("seed", seed, minimum=0)
  rng = np.random.default_rng(seed)
  sizes = rng.lognormal(4, 2, num_users).astype(np.int64) + 50
  if max_samples is not None:
    sizes = np.minimum(sizes, max_samples)
  scale = np.arange(1, dim + 1, dtype=np.float64) ** -0.6  # sqrt of diag(j^-1.2)
  train, test = {}, {}
  for k, n in enumerate(sizes):
    u, b_mean = rng.normal(0.0, alpha), rng.normal(0.0, beta)
    v = rng.normal(b_mean, 1.0, dim)
    w = rng.normal(u, 1.0, (dim, num_classes))
    b = rng.normal(u, 1.0, num_classes)
    x = v + scale * rng.standard_normal((int(n), dim))
    y = np.argmax(x @ w + b, axis=1)
    order = rng.permutation(int(n))
    cut = int(train_fraction * n)
    name = f"f_{k:05d}"
    train[name] = {"x": x[order[:cut]].astype(np.float32), "y": y[order[:cut]].astype(np.int32)}
    test[name] = {"x": x[order[cut:]].astype(np.float32), "y": y[order[cut:]].astype(np.int32)}
  return train, test


def synthetic(alpha: float, beta: float, **kwargs) -> FederatedDataset:
  """Synthetic(alpha, beta) as a :class:`~fedco.data.FederatedDataset`, one client per user.

  Args:
    alpha: spread of the users' models (see :func:`synthetic_users`).
    beta: spread of the users' input means.
    **kwargs: :func:`synthetic_users`'s keyword arguments (``num_users``, ``dim``,
      ``num_classes``, ``train_fraction``, ``max_samples``, ``seed``).

  Returns:
    The clients' training and held-out sets; ``name`` is ``"synthetic_<alpha>_<beta>"`` and
    ``info`` records the arguments.

  Examples:
    >>> import fedco
    >>> fed = fedco.data.synthetic(1.0, 1.0, num_users=4, seed=0)
    >>> fed.name, fed.num_clients, fed.num_classes
    ('synthetic_1.0_1.0', 4, 10)
  """
  train, test = synthetic_users(alpha, beta, **kwargs)
  classes = kwargs.get("num_classes", 10)
  info = {"source": "synthetic", "alpha": alpha, "beta": beta, **kwargs}
  return from_users(train, test, name=f"synthetic_{alpha}_{beta}", num_classes=classes, info=info)
