"""UCI Adult (census income) for fair classification with noisy protected groups (SPEC 4.6).

Reads ``adult.data`` (train, 32561 rows) and ``adult.test`` (test, 16281 rows) from a folder.
Nothing is downloaded and no copy ships inside the package: ``data_dir=None`` means the
project's shared copy, ``<repository>/../shared/data/adult`` (found relative to a source
checkout); elsewhere, download the two files from the UCI repository and pass their folder.
Either of two layouts is accepted:

* the UCI original: no header, ``adult.test`` opens with the line ``|1x3 Cross validator``
  and its labels carry a trailing period (``>50K.``);
* the project's shared copy (``../shared/data/adult``): a header row naming the columns and
  no trailing periods.

Fields are separated by ``", "`` (surrounding blanks are stripped); ``?`` marks a missing
value; blank lines are skipped.

Preprocessing follows the GCIVR code for this experiment (Haddadpour et al. 2022, which
follows Wang et al. 2020, "Robust optimization for fairness with noisy protected groups"):

* ``fnlwgt`` is dropped;
* continuous columns are bucketised, then one-hot encoded: ``age`` into 4 training-set
  quantile buckets, and with fixed right-closed bins ``capital-gain`` (-1, 1, 4000, 10000,
  100000], ``capital-loss`` (-1, 1, 1800, 1950, 4500], ``hours-per-week`` (0, 39, 41, 50,
  100], ``education-num`` (0, 8, 9, 11, 16]; values beyond the outer edges fall into the
  first or last bucket;
* categorical columns (workclass, education, marital-status, occupation, relationship, sex,
  native-country) are one-hot encoded over the values seen in the *training* split, sorted;
  ``?`` is a value of its own (as ``pandas.get_dummies`` treats it there); a test value
  unseen in training encodes as all zeros;
* ``race`` is **removed from the features** and kept as the true protected group:
  0 = White, 1 = Black, 2 = Other (every other race);
* label ``>50K`` -> 1, ``<=50K`` -> 0.

Noisy proxy groups (SPEC 4.6): a fraction ``proxy_noise`` (default 0.3) of the rows, exactly
``round(proxy_noise * N)`` drawn without replacement, is moved to a *different* group chosen
uniformly among the other ``G - 1``; train and test draw from independent seeded streams.

Each split is a dict of host NumPy arrays ``{"x": float32 [N, d], "y": float32 [N] (0/1),
"group": int32 [N], "proxy": int32 [N]}``. :func:`federated_adult` splits the training rows
IID over ``K`` clients (``fedco.data.partition.iid``, seeded) into a
:class:`~fedco.data.FederatedData`; :func:`resample_proxies` redraws the proxies for another
seed without re-reading the files.
"""

from __future__ import annotations

import os
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple, cast

import numpy as np

from fedco import _validate
from fedco.data import partition
from fedco.data.federated import FederatedData

Arrays = Dict[str, np.ndarray]

COLUMNS = (
  "age",
  "workclass",
  "fnlwgt",
  "education",
  "education-num",
  "marital-status",
  "occupation",
  "relationship",
  "race",
  "sex",
  "capital-gain",
  "capital-loss",
  "hours-per-week",
  "native-country",
  "label",
)
CATEGORICAL = (
  "workclass",
  "education",
  "marital-status",
  "occupation",
  "relationship",
  "sex",
  "native-country",
)
# Right-closed bins (pandas.cut convention) of the GCIVR preprocessing; ``age`` uses
# training quantiles instead.
FIXED_BINS = {
  "capital-gain": (-1, 1, 4000, 10000, 100000),
  "capital-loss": (-1, 1, 1800, 1950, 4500),
  "hours-per-week": (0, 39, 41, 50, 100),
  "education-num": (0, 8, 9, 11, 16),
}
AGE_QUANTILES = 4
GROUPS = ("White", "Black", "Other")
NUM_GROUPS = len(GROUPS)
FILES = ("adult.data", "adult.test")
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_DATA_DIR = os.path.join(_REPO_ROOT, "..", "shared", "data", "adult")


class AdultData(NamedTuple):
  """Preprocessed Adult splits, as :func:`load_adult` returns them.

  Each split is a dict of host NumPy arrays: ``"x"`` ``float32 [N, d]`` (one-hot features,
  ``d = 117`` on the real data), ``"y"`` ``float32 [N]`` (1 for ``>50K``), ``"group"``
  ``int32 [N]`` (true race group: 0 White, 1 Black, 2 Other) and ``"proxy"`` ``int32 [N]``
  (the noisy group the fairness constraints use, SPEC 4.6).

  Attributes:
    train: the training split (``adult.data``, 32561 rows).
    test: the test split (``adult.test``, 16281 rows).
    feature_names: one name per column of ``x`` (``"column=value"`` or ``"column#bucket"``).

  Examples:
    Built by hand here (:func:`load_adult` reads it from the files):

    >>> import numpy as np
    >>> import fedco
    >>> def split(n):
    ...   group = np.arange(n, dtype=np.int32) % 3
    ...   return {"x": np.zeros((n, 3), np.float32), "y": np.zeros(n, np.float32),
    ...           "group": group, "proxy": group.copy()}
    >>> data = fedco.data.AdultData(split(6), split(2), ("sex=Female", "sex=Male", "age#0"))
    >>> data.num_features, sorted(data.train), data.test["x"].shape
    (3, ['group', 'proxy', 'x', 'y'], (2, 3))
  """

  train: Arrays
  test: Arrays
  feature_names: Tuple[str, ...]

  @property
  def num_features(self) -> int:
    """The number of feature columns ``d`` of ``x``."""
    return len(self.feature_names)


# ---------------------------------------------------------------------------- reading


def _read_rows(path: str) -> List[List[str]]:
  """The data rows of one file, each 15 stripped fields; header, ``|`` and blank lines
  skipped."""
  if not os.path.isfile(path):
    raise FileNotFoundError(
      f"Adult file not found: {path} (expected adult.data and adult.test from the UCI "
      "repository or the project's copy in ../shared/data/adult)"
    )
  rows = []
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      line = line.strip()
      if not line or line.startswith("|"):
        continue
      fields = [v.strip() for v in line.split(",")]
      if fields[0].lower() == "age":  # the shared copy's header row
        continue
      if len(fields) != len(COLUMNS):
        raise ValueError(
          f"{path}, line {number}: expected {len(COLUMNS)} comma-separated "
          f"fields, got {len(fields)}: {line[:80]!r}"
        )
      rows.append(fields)
  if not rows:
    raise ValueError(f"{path} holds no data rows")
  return rows


def _label(value: str, path: str) -> int:
  value = value.rstrip(".")
  if value == ">50K":
    return 1
  if value == "<=50K":
    return 0
  raise ValueError(
    f"{path}: unknown label {value!r}; expected '>50K' or '<=50K' (an optional "
    "trailing period is accepted)"
  )


def _numeric(rows, column: str, path: str) -> np.ndarray:
  j = COLUMNS.index(column)
  try:
    return np.array([float(r[j]) for r in rows], np.float64)
  except ValueError:
    bad = next(r[j] for r in rows if not _is_float(r[j]))
    raise ValueError(f"{path}: column {column!r} must be numeric, got {bad!r}") from None


def _is_float(s: str) -> bool:
  try:
    float(s)
    return True
  except ValueError:
    return False


def read_adult(data_dir: Optional[str] = None) -> Tuple[List[List[str]], List[List[str]]]:
  """The raw rows (lists of 15 strings) of ``adult.data`` and ``adult.test``.

  Raises:
    FileNotFoundError: a file is missing (the message names its path).
    ValueError: a malformed row (file and line named).
  """
  data_dir = _check_dir(data_dir)
  rows = tuple(_read_rows(os.path.join(data_dir, name)) for name in FILES)
  return cast(Tuple[List[List[str]], List[List[str]]], rows)  # FILES: (train, test)


def _check_dir(data_dir) -> str:
  if data_dir is None:
    data_dir = DEFAULT_DATA_DIR
  if isinstance(data_dir, os.PathLike):
    data_dir = os.fspath(data_dir)
  if not isinstance(data_dir, str) or not data_dir:
    raise ValueError(f"data_dir must be a folder path (str), got {data_dir!r}")
  if not os.path.isdir(data_dir):
    raise FileNotFoundError(f"Adult data folder not found: {os.path.abspath(data_dir)}")
  return data_dir


# ---------------------------------------------------------------------- preprocessing


def _bucket(values: np.ndarray, edges: Sequence[float]) -> np.ndarray:
  """Bucket index of right-closed bins ``(e0, e1], (e1, e2], ...``; out-of-range values go
  to the first or last bucket."""
  interior = np.asarray(edges[1:-1], np.float64)
  return np.searchsorted(interior, values, side="left")


def _age_edges(train_age: np.ndarray) -> Tuple[float, ...]:
  """``AGE_QUANTILES`` training quantile buckets (``pandas.qcut`` edges)."""
  return tuple(np.quantile(train_age, np.linspace(0.0, 1.0, AGE_QUANTILES + 1)))


def race_group(race: str) -> int:
  """0 = White, 1 = Black, 2 = Other (Asian-Pac-Islander, Amer-Indian-Eskimo, Other, ?)."""
  return 0 if race == "White" else 1 if race == "Black" else 2


def preprocess(train_rows, test_rows, paths=("adult.data", "adult.test")):
  """Features, labels and true groups of both splits: ``(train, test, feature_names)``
  (``proxy`` is added by :func:`proxy_groups`)."""
  age_edges = _age_edges(_numeric(train_rows, "age", paths[0]))
  bins = {"age": age_edges, **FIXED_BINS}
  vocab = {c: sorted({r[COLUMNS.index(c)] for r in train_rows}) for c in CATEGORICAL}
  names = []
  for c in CATEGORICAL:
    names += [f"{c}={v}" for v in vocab[c]]
  for c, edges in bins.items():
    names += [f"{c}#{b}" for b in range(len(edges) - 1)]
  out = []
  for rows, path in zip((train_rows, test_rows), paths):
    blocks = []
    for c in CATEGORICAL:
      index = {v: i for i, v in enumerate(vocab[c])}
      j = COLUMNS.index(c)
      block = np.zeros((len(rows), len(index)), np.float32)
      pos = np.array([index.get(r[j], -1) for r in rows])
      seen = pos >= 0
      block[np.flatnonzero(seen), pos[seen]] = 1.0
      blocks.append(block)
    for c, edges in bins.items():
      b = _bucket(_numeric(rows, c, path), edges)
      blocks.append(np.eye(len(edges) - 1, dtype=np.float32)[b])
    j_race, j_label = COLUMNS.index("race"), COLUMNS.index("label")
    out.append(
      {
        "x": np.concatenate(blocks, axis=1),
        "y": np.array([_label(r[j_label], path) for r in rows], np.float32),
        "group": np.array([race_group(r[j_race]) for r in rows], np.int32),
      }
    )
  return out[0], out[1], tuple(names)


def proxy_groups(groups, noise: float, seed: int, num_groups: int = NUM_GROUPS) -> np.ndarray:
  r"""Noisy proxy groups: a fraction ``noise`` of the rows moved to another group at random.

  SPEC 4.6: a set :math:`S` of exactly ``round(noise * N)`` rows is drawn uniformly without
  replacement, and each row :math:`i \in S` moves to a different group chosen uniformly
  among the other ``num_groups - 1``:
  :math:`\mathrm{proxy}_i = (\mathrm{group}_i + s_i) \bmod G` with
  :math:`s_i \sim U\{1, \dots, G - 1\}`; the other rows keep their group.

  Args:
    groups: ``int [N]`` true group ids in ``[0, num_groups)``.
    noise: the fraction of rows moved, in ``[0, 1]`` (SPEC 4.6: 0.3).
    seed: integer ``>= 0`` seeding ``np.random.default_rng``.
    num_groups: ``G >= 2``; default 3 (White, Black, Other).

  Returns:
    ``int32 [N]`` proxy groups, differing from ``groups`` on exactly ``round(noise * N)``
    rows.

  Raises:
    ValueError: ``noise`` outside [0, 1], ``seed`` not an integer >= 0, ``num_groups < 2``,
      or a group id outside ``[0, num_groups)``.

  Examples:
    >>> import numpy as np
    >>> import fedco
    >>> groups = np.repeat(np.arange(3), 10)
    >>> proxy = fedco.data.proxy_groups(groups, noise=0.3, seed=0)
    >>> int((proxy != groups).sum()), proxy.dtype
    (9, dtype('int32'))
  """
  groups = np.asarray(groups)
  noise = _check_noise(noise, "noise")
  num_groups = _validate.positive_int("num_groups", num_groups, minimum=2)
  if groups.ndim != 1 or (groups.size and (groups.min() < 0 or groups.max() >= num_groups)):
    raise ValueError(
      f"groups must be a 1-D array of ids in [0, {num_groups}), got shape {groups.shape}"
    )
  rng = np.random.default_rng(_check_seed(seed))
  proxy = groups.astype(np.int32).copy()
  rows = rng.choice(groups.size, size=int(round(noise * groups.size)), replace=False)
  shift = rng.integers(1, num_groups, size=rows.size)  # never 0: always a different group
  proxy[rows] = (proxy[rows] + shift) % num_groups
  return proxy


def _check_noise(noise, name: str = "proxy_noise") -> float:
  if (
    isinstance(noise, bool)
    or not isinstance(noise, (int, float, np.floating))
    or not (0.0 <= float(noise) <= 1.0)
  ):
    raise ValueError(f"{name} must be a number in [0, 1], got {noise!r}")
  return float(noise)


def _check_seed(seed) -> int:
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
    raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
  return int(seed)


def load_adult(
  data_dir: Optional[str] = None, *, proxy_noise: float = 0.3, seed: int = 0
) -> AdultData:
  r"""Adult, preprocessed, with noisy proxy groups.

  Reads the two files (UCI original or the project's copy with a header row; see
  :mod:`fedco.data.adult` for the format), one-hot encodes the features as the GCIVR code
  does (``fnlwgt`` dropped, continuous columns bucketised, categories from the training
  split), removes ``race`` from the features and keeps it as the true group (0 White,
  1 Black, 2 Other), and draws the proxy groups with :func:`resample_proxies`. Nothing is
  downloaded.

  Args:
    data_dir: folder holding ``adult.data`` and ``adult.test`` (rows of 15 comma-separated
      fields: age, workclass, fnlwgt, education, education-num, marital-status,
      occupation, relationship, race, sex, capital-gain, capital-loss, hours-per-week,
      native-country, label ``>50K`` or ``<=50K``); ``None`` is the project's shared copy,
      ``<repo>/../shared/data/adult``, which exists only next to a source checkout.
    proxy_noise: fraction of rows whose proxy group differs from the true one, in [0, 1];
      default 0.3 (SPEC 4.6).
    seed: integer >= 0 for the proxy noise (train and test use independent streams).

  Returns:
    :class:`AdultData`: ``train`` and ``test`` dicts ``{"x": float32 [N, d], "y": float32
    [N], "group": int32 [N], "proxy": int32 [N]}`` and the ``d`` feature names (32561 and
    16281 rows and ``d = 117`` on the real data).

  Raises:
    FileNotFoundError: the folder or a file is missing (the path is named).
    ValueError: a bad argument (named) or a malformed file.

  Examples:
    Three people per split, written in the UCI format to a temporary folder: 7 categorical
    columns with one value each plus 5 bucketised columns of 4 buckets give ``d = 27``.

    >>> import os, tempfile
    >>> import fedco
    >>> row = "{}, Private, 0, HS-grad, 9, Single, Sales, Husband, {}, Male, 0, 0, 40, US, {}\n"
    >>> people = [(25, "White", "<=50K"), (38, "Black", ">50K"), (50, "Eskimo", ">50K")]
    >>> with tempfile.TemporaryDirectory() as folder:
    ...   for name in ("adult.data", "adult.test"):
    ...     with open(os.path.join(folder, name), "w") as f:
    ...       f.writelines(row.format(*person) for person in people)
    ...   data = fedco.data.load_adult(folder, proxy_noise=0.3, seed=0)
    >>> data.train["x"].shape, data.train["y"].tolist(), data.train["group"].tolist()
    ((3, 27), [0.0, 1.0, 1.0], [0, 1, 2])
    >>> int((data.train["proxy"] != data.train["group"]).sum())  # round(0.3 * 3) rows
    1
  """
  proxy_noise = _check_noise(proxy_noise)
  seed = _check_seed(seed)
  data_dir = _check_dir(data_dir)
  paths = tuple(os.path.join(data_dir, name) for name in FILES)
  train_rows, test_rows = (_read_rows(p) for p in paths)
  train, test, names = preprocess(train_rows, test_rows, paths)
  return resample_proxies(AdultData(train, test, names), proxy_noise=proxy_noise, seed=seed)


def resample_proxies(data: AdultData, *, proxy_noise: float = 0.3, seed: int = 0) -> AdultData:
  """``data`` with new proxy groups drawn from its true groups (no re-reading of the files).

  Train and test use independent streams derived from ``seed``; each split's proxies are
  :func:`proxy_groups` of its ``"group"`` with ``noise=proxy_noise``. Use it to run several
  seeds from one :func:`load_adult`.

  Args:
    data: an :class:`AdultData` (its ``"proxy"`` arrays, if any, are replaced).
    proxy_noise: fraction of rows whose proxy group differs from the true one, in [0, 1];
      default 0.3 (SPEC 4.6).
    seed: integer >= 0.

  Returns:
    A new :class:`AdultData` with the same features, labels and groups and new ``"proxy"``
    arrays; ``data`` is unchanged.

  Raises:
    ValueError: ``proxy_noise`` outside [0, 1] or a bad ``seed``.

  Examples:
    >>> import numpy as np
    >>> import fedco
    >>> def split(n):
    ...   group = np.repeat(np.arange(3, dtype=np.int32), n // 3)
    ...   return {"x": np.zeros((n, 2), np.float32), "y": np.zeros(n, np.float32),
    ...           "group": group, "proxy": group.copy()}
    >>> data = fedco.data.AdultData(split(30), split(9), ("a", "b"))
    >>> noisy = fedco.data.resample_proxies(data, proxy_noise=0.3, seed=1)
    >>> [int((s["proxy"] != s["group"]).sum()) for s in (noisy.train, noisy.test)]
    [9, 3]
  """
  proxy_noise = _check_noise(proxy_noise)
  train_seed, test_seed = np.random.SeedSequence([_check_seed(seed), 6]).generate_state(2)
  train = {**data.train, "proxy": proxy_groups(data.train["group"], proxy_noise, int(train_seed))}
  test = {**data.test, "proxy": proxy_groups(data.test["group"], proxy_noise, int(test_seed))}
  return AdultData(train, test, data.feature_names)


def federated_adult(data: AdultData, num_clients: int, seed: int) -> FederatedData:
  """The training rows split IID over ``num_clients`` clients (near-equal sizes, seeded).

  The split is :func:`fedco.data.iid` (SPEC E6: 8 clients, also 32); every client's
  examples keep all four fields, so problems read the proxy groups per example.

  Args:
    data: an :class:`AdultData`, e.g. from :func:`load_adult`.
    num_clients: ``K``, an integer in ``[1, number of training rows]``.
    seed: integer >= 0 for the split.

  Returns:
    A :class:`~fedco.FederatedData` over ``data.train`` (examples ``{"x", "y", "group",
    "proxy"}``), client sizes differing by at most one.

  Raises:
    ValueError: ``num_clients`` not an integer in [1, number of training rows], or a bad
      ``seed``.

  Examples:
    >>> import numpy as np
    >>> import fedco
    >>> def split(n):
    ...   group = np.arange(n, dtype=np.int32) % 3
    ...   return {"x": np.zeros((n, 2), np.float32), "y": np.zeros(n, np.float32),
    ...           "group": group, "proxy": group.copy()}
    >>> data = fedco.data.AdultData(split(10), split(4), ("a", "b"))
    >>> fed = fedco.data.federated_adult(data, num_clients=3, seed=0)
    >>> fed.counts.tolist(), sorted(fed.examples)
    ([4, 3, 3], ['group', 'proxy', 'x', 'y'])
  """
  n = int(data.train["y"].shape[0])
  parts = partition.iid(n, num_clients, _check_seed(seed))
  return FederatedData.from_index_lists(dict(data.train), parts)
