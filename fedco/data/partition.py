r"""Partitioners: split a labelled data set over clients (pure NumPy, explicitly seeded).

Every partitioner returns a list with one sorted ``int64`` index array per client (indices
into the split it was given), every client non-empty, and draws all randomness from
``np.random.default_rng(seed)``: one seed gives one partition. Feed the lists to
:func:`fedco.data.make_federated` (or ``FederatedData.from_index_lists``).

* :func:`iid`: a uniform random split into near-equal parts.
* :func:`quantity_skew`: one client holds ``big`` examples, every other ``small`` (SPEC E1:
  5000 and 20 MNIST images over 10 clients).
* :func:`dirichlet_label_skew`: per-class client shares drawn from
  :math:`\mathrm{Dirichlet}(\alpha 1_K)`.
* :func:`dominant_class`: client ``i`` draws a fraction ``rho`` of its images from class
  ``i mod C`` and ``(1 - rho)/(C - 1)`` from each other class (SPEC E2);
  :func:`dominant_class_counts` gives one client's per-class counts.
* :func:`matched_validation`: per-client validation sets from the *test* split with the
  size ratio and class mix of each client's training set (SPEC E1 Choice).

Bad arguments raise ``ValueError`` naming the argument, its value and what is allowed.
"""

from __future__ import annotations

import numbers
import warnings
from typing import List, Optional, Sequence, cast

import numpy as np

from fedco import _validate

Parts = List[np.ndarray]


# ----------------------------------------------------------------------------- checks


def _check_seed(seed) -> np.random.Generator:
  if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
    raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
  return np.random.default_rng(int(seed))


def _check_labels(name: str, labels) -> np.ndarray:
  labels = np.asarray(labels)
  if labels.ndim != 1 or labels.size == 0:
    raise ValueError(f"{name} must be a non-empty 1-D array of class ids, got shape {labels.shape}")
  if not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(f"{name} must hold integer class ids, got dtype {labels.dtype}")
  if labels.min() < 0:
    raise ValueError(f"{name} must hold class ids >= 0, got min {labels.min()}")
  return labels.astype(np.int64)


def _check_clients(num_clients, num_examples: int) -> int:
  num_clients = _validate.positive_int("num_clients", num_clients)
  if num_clients > num_examples:
    raise ValueError(
      f"num_clients must be <= the number of examples ({num_examples}) so "
      f"every client gets one, got {num_clients}"
    )
  return num_clients


def _apportion(weights: np.ndarray, total: int) -> np.ndarray:
  """Integer counts summing to ``total``, proportional to ``weights`` (largest remainder).

  Ties in the remainders go to the earlier entry.
  """
  raw = weights / weights.sum() * total
  counts = np.floor(raw + 1e-9).astype(np.int64)
  counts = np.minimum(counts, total)
  short = total - int(counts.sum())
  if short > 0:
    order = np.argsort(-(raw - counts), kind="stable")
    counts[order[:short]] += 1
  return counts


# ------------------------------------------------------------------------- partitioners


def iid(num_examples: int, num_clients: int, seed: int) -> Parts:
  """A uniform random split of ``range(num_examples)`` into ``num_clients`` parts.

  A random permutation cut into ``K`` near-equal consecutive pieces (``np.array_split``):
  the first ``num_examples mod K`` clients get one example more. SPEC E5 (CIFAR-ST, 8
  clients) and the Adult experiments use it.

  Args:
    num_examples: size of the split, ``>= num_clients``.
    num_clients: number of clients ``K >= 1``.
    seed: integer seed ``>= 0``.

  Returns:
    ``K`` disjoint sorted ``int64`` index arrays covering every example; sizes differ by at
    most one.

  Raises:
    ValueError: a count that is not a positive integer, ``num_clients > num_examples``, or
      a bad ``seed``.

  Examples:
    >>> import numpy as np
    >>> import fedco
    >>> parts = fedco.data.iid(10, 3, seed=0)
    >>> [p.size for p in parts]
    [4, 3, 3]
    >>> np.array_equal(np.sort(np.concatenate(parts)), np.arange(10))
    True
  """
  num_examples = _validate.positive_int("num_examples", num_examples)
  num_clients = _check_clients(num_clients, num_examples)
  rng = _check_seed(seed)
  return [np.sort(p) for p in np.array_split(rng.permutation(num_examples), num_clients)]


def quantity_skew(
  labels, num_clients: int, big: int, small: int, seed: int, big_client: Optional[int] = None
) -> Parts:
  """One client holds ``big`` examples, each other client ``small`` (SPEC E1).

  Examples are drawn uniformly without replacement, so the clients are disjoint and each
  client's class mix follows the split's.

  Args:
    labels: ``[N]`` class ids of the split (only its length is used).
    num_clients: number of clients ``K >= 1``.
    big: size of the big client, ``>= 1``.
    small: size of every other client, ``>= 1``; ``big + (K - 1) * small <= N``.
    seed: integer seed ``>= 0``.
    big_client: which client is big, in ``[0, K)``; ``None`` draws it uniformly (from the
      same seeded stream).

  Returns:
    ``K`` disjoint sorted index arrays; client ``big_client`` has ``big`` entries, the
    others ``small``.

  Raises:
    ValueError: a count that is not a positive integer, labels that are not a non-empty
      1-D array of class ids ``>= 0``, ``big + (K - 1) * small > N``, ``big_client``
      outside ``[0, K)``, or a bad ``seed``.

  Examples:
    SPEC E1 in miniature: 3 clients out of 20 examples, client 0 big.

    >>> import numpy as np
    >>> import fedco
    >>> labels = np.arange(20) % 2
    >>> parts = fedco.data.quantity_skew(labels, 3, big=6, small=2, seed=0, big_client=0)
    >>> [p.size for p in parts]
    [6, 2, 2]
  """
  labels = _check_labels("labels", labels)
  num_clients = _validate.positive_int("num_clients", num_clients)
  big = _validate.positive_int("big", big)
  small = _validate.positive_int("small", small)
  n = labels.size
  if big + (num_clients - 1) * small > n:
    raise ValueError(
      f"big + (num_clients - 1) * small must be <= the number of examples ({n}), got "
      f"big={big}, small={small}, num_clients={num_clients} "
      f"({big + (num_clients - 1) * small})"
    )
  rng = _check_seed(seed)
  if big_client is None:
    big_client = int(rng.integers(num_clients))
  elif (
    isinstance(big_client, bool)
    or not isinstance(big_client, numbers.Integral)
    or not 0 <= big_client < num_clients
  ):
    raise ValueError(
      f"big_client must be an integer in [0, {num_clients}) or None, got {big_client!r}"
    )
  sizes = np.full(num_clients, small)
  sizes[big_client] = big
  perm = rng.permutation(n)
  starts = np.concatenate([[0], np.cumsum(sizes)])
  return [np.sort(perm[starts[k] : starts[k + 1]]) for k in range(num_clients)]


def dirichlet_label_skew(
  labels, num_clients: int, alpha: float, seed: int, min_size: int = 1, max_tries: int = 1000
) -> Parts:
  r"""Label skew: each class is split over clients by shares ``p ~ Dirichlet(alpha 1_K)``.

  The classic non-IID split (Hsu et al. 2019; Wang et al. 2020): for each class :math:`c`
  independently, :math:`p^{(c)} \sim \mathrm{Dirichlet}(\alpha 1_K)` and client :math:`k`
  gets the share :math:`p^{(c)}_k` of the class's examples (shuffled, then cut), so every
  example goes to exactly one client. The whole draw is repeated until every client has
  ``min_size`` examples. Small ``alpha`` gives few classes per client; large ``alpha``
  approaches IID.

  Args:
    labels: ``[N]`` class ids.
    num_clients: number of clients ``K >= 1``.
    alpha: Dirichlet concentration, ``> 0``.
    seed: integer seed ``>= 0``.
    min_size: least examples per client, ``>= 1``, with ``K * min_size <= N``.
    max_tries: draws before giving up, ``>= 1``.

  Returns:
    ``K`` disjoint sorted index arrays covering every example.

  Raises:
    ValueError: bad arguments, or no draw in ``max_tries`` met ``min_size``.

  Examples:
    >>> import numpy as np
    >>> import fedco
    >>> labels = np.repeat(np.arange(3), 20)
    >>> parts = fedco.data.dirichlet_label_skew(labels, 3, alpha=0.5, seed=0, min_size=5)
    >>> len(parts), min(p.size for p in parts) >= 5, sum(p.size for p in parts)
    (3, True, 60)
  """
  labels = _check_labels("labels", labels)
  num_clients = _check_clients(num_clients, labels.size)
  _validate.positive("alpha", alpha)
  if not np.isfinite(alpha):
    raise ValueError(f"alpha must be finite and > 0, got {alpha!r}")
  min_size = _validate.positive_int("min_size", min_size)
  max_tries = _validate.positive_int("max_tries", max_tries)
  if num_clients * min_size > labels.size:
    raise ValueError(
      f"min_size must be <= N / num_clients = {labels.size // num_clients}, got {min_size}"
    )
  rng = _check_seed(seed)
  by_class = [np.flatnonzero(labels == c) for c in np.unique(labels)]
  for _ in range(max_tries):
    pieces: List[List[np.ndarray]] = [[] for _ in range(num_clients)]
    for rows in by_class:
      rows = rng.permutation(rows)
      shares = rng.dirichlet(np.full(num_clients, float(alpha)))
      cuts = (np.cumsum(shares)[:-1] * rows.size).astype(np.int64)
      for k, piece in enumerate(np.split(rows, cuts)):
        pieces[k].append(piece)
    parts = [np.sort(np.concatenate(p)) for p in pieces]
    if min(p.size for p in parts) >= min_size:
      return parts
  raise ValueError(
    f"no Dirichlet(alpha={alpha}) draw in max_tries={max_tries} gave every "
    f"client min_size={min_size} examples; raise alpha or lower min_size"
  )


def dominant_class_counts(
  rho: float, per_client: int, num_classes: int, dominant: int
) -> np.ndarray:
  """Per-class counts of one :func:`dominant_class` client (sums to ``per_client``).

  ``rho * per_client`` from ``dominant`` and ``(1 - rho) / (C - 1) * per_client`` from each
  other class, rounded by largest remainder; ties go to the classes after ``dominant``
  (cyclically), so rounding does not favour low class ids across clients.

  Args:
    rho: share of the dominant class, in ``[0, 1]``.
    per_client: the client's number of examples, ``>= 1``.
    num_classes: ``C >= 2``.
    dominant: the dominant class, in ``[0, C)``.

  Returns:
    ``int64 [C]`` counts summing to ``per_client``.

  Raises:
    ValueError: an argument outside the ranges above.

  Examples:
    SPEC E2 (CIFAR-10, ``rho = 0.28``, 5000 images per client), then a rounding tie:

    >>> import fedco
    >>> fedco.data.dominant_class_counts(0.28, 5000, 10, dominant=0).tolist()
    [1400, 400, 400, 400, 400, 400, 400, 400, 400, 400]
    >>> fedco.data.dominant_class_counts(0.5, 10, 4, dominant=1).tolist()
    [1, 5, 2, 2]
  """
  rho = _validate.interval("rho", rho, 0.0, 1.0, closed_low=True, closed_high=True)
  per_client = _validate.positive_int("per_client", per_client)
  num_classes = _validate.positive_int("num_classes", num_classes, minimum=2)
  dominant = _validate.positive_int("dominant", dominant, minimum=0, maximum=num_classes - 1)
  weights = np.full(num_classes, (1.0 - rho) / (num_classes - 1))
  weights[dominant] = rho
  rolled = _apportion(np.roll(weights, -dominant), per_client)
  return np.roll(rolled, dominant)


def dominant_class(
  labels,
  num_clients: int,
  rho: float,
  per_client: int,
  seed: int,
  num_classes: Optional[int] = None,
) -> Parts:
  """Client ``i`` holds a fraction ``rho`` of class ``i mod C``, the rest spread evenly.

  SPEC E2: client ``i`` draws ``rho * per_client`` images from class ``i mod C`` and
  ``(1 - rho) / (C - 1) * per_client`` from each other class (counts rounded by largest
  remainder, see :func:`dominant_class_counts`), without replacement across clients. With
  CIFAR-10, 10 clients, ``rho = 0.28`` and ``per_client = 5000`` every class gives
  ``1400 + 9 * 400 = 5000`` images: the whole training split. ``rho = 1/C`` is a balanced
  split, ``rho = 1`` one class per client.

  Args:
    labels: ``[N]`` class ids in ``[0, C)``.
    num_clients: number of clients ``K >= 1``.
    rho: share of the dominant class, in ``[0, 1]``.
    per_client: examples per client, ``>= 1``.
    seed: integer seed ``>= 0``.
    num_classes: ``C >= 2``; ``None`` uses ``max(labels) + 1``.

  Returns:
    ``K`` disjoint sorted index arrays of ``per_client`` entries each.

  Raises:
    ValueError: bad arguments, or some class has fewer examples than the clients need
      (the message gives the largest feasible ``per_client``).

  Examples:
    Three classes of 10 examples, 3 clients of 5 with ``rho = 0.6``: each client's class
    counts.

    >>> import numpy as np
    >>> import fedco
    >>> labels = np.repeat(np.arange(3), 10)
    >>> parts = fedco.data.dominant_class(labels, 3, rho=0.6, per_client=5, seed=0)
    >>> [np.bincount(labels[p], minlength=3).tolist() for p in parts]
    [[3, 1, 1], [1, 3, 1], [1, 1, 3]]
  """
  labels = _check_labels("labels", labels)
  num_clients = _validate.positive_int("num_clients", num_clients)
  if isinstance(rho, bool) or not isinstance(rho, numbers.Real) or not 0 <= rho <= 1:
    raise ValueError(f"rho must be a number in [0, 1], got {rho!r}")
  per_client = _validate.positive_int("per_client", per_client)
  if num_classes is None:
    num_classes = int(labels.max()) + 1
  num_classes = _validate.positive_int("num_classes", num_classes, minimum=2)
  if labels.max() >= num_classes:
    raise ValueError(f"labels must lie in [0, num_classes={num_classes}), got max {labels.max()}")
  rng = _check_seed(seed)
  counts = np.stack(
    [
      dominant_class_counts(float(rho), per_client, num_classes, k % num_classes)
      for k in range(num_clients)
    ]
  )
  need = counts.sum(0)
  have = np.bincount(labels, minlength=num_classes)
  if np.any(need > have):
    c = int(np.argmax(need - have))
    ratio = min(have[j] / need[j] for j in range(num_classes) if need[j] > 0)
    raise ValueError(
      f"per_client={per_client} needs {need[c]} examples of class {c} over "
      f"{num_clients} clients (rho={rho}), but the split has {have[c]}; per_client must "
      f"be at most about {int(per_client * ratio)}"
    )
  pools = [rng.permutation(np.flatnonzero(labels == c)) for c in range(num_classes)]
  used = np.zeros(num_classes, np.int64)
  parts = []
  for k in range(num_clients):
    rows = []
    for c in range(num_classes):
      rows.append(pools[c][used[c] : used[c] + counts[k, c]])
      used[c] += counts[k, c]
    parts.append(np.sort(np.concatenate(rows)))
  return parts


def matched_validation(
  train_parts: Sequence[np.ndarray],
  train_labels,
  test_labels,
  seed: int,
  ratio: Optional[float] = None,
  min_size: int = 10,
  disjoint: bool = True,
) -> Parts:
  """Per-client validation sets from the test split, matched to each training set.

  **Choice** (SPEC E1): client ``k`` with ``n_k`` training examples gets
  ``m_k = max(min_size, round(ratio * n_k))`` test examples, with ``ratio`` the test/train
  size ratio of the whole splits (``len(test_labels) / len(train_labels)``, i.e. the
  client's share of the training split times the test size) unless given, and the same
  class mix as its training set (per-class counts ``m_k * n_kc / n_k`` rounded by largest
  remainder). On SPEC E1 (MNIST, 5000 + 9 * 20) that is 833 images for the big client and
  10 (the floor) for each small one.

  With ``disjoint=True``, examples are drawn without replacement from per-class pools shared
  by all clients, so validation sets are disjoint while the test split lasts. Clients are
  served from the smallest training set up, so if a class runs out it is the larger clients
  that are short: their missing examples of that class are then drawn from the whole class
  (without replacement within the client where the class is large enough, with replacement
  otherwise), overlapping other clients' sets, and a ``RuntimeWarning`` says so.

  With ``disjoint=False``, each client draws its set on its own from the whole test split
  (without replacement within the client; with replacement, and a ``RuntimeWarning``, only
  where it wants more of a class than the split holds). Sets then overlap between clients,
  which lets a ``min_size`` larger than the split's share per client measure each client's
  accuracy on its own class mix finely (E1 on digits: 10-image sets move in steps of 0.1).

  Args:
    train_parts: ``K`` index arrays into the training split (e.g. from a partitioner).
    train_labels: ``[N_train]`` class ids of the training split.
    test_labels: ``[N_test]`` class ids of the test split.
    seed: integer seed ``>= 0``.
    ratio: validation/training size ratio per client, ``> 0``; ``None`` uses
      ``N_test / N_train``.
    min_size: least validation examples per client, ``>= 1``.
    disjoint: ``True`` (default) draws from pools shared by the clients (sets disjoint
      while the split lasts); ``False`` lets each client draw on its own (sets may overlap).

  Returns:
    ``K`` sorted index arrays into the **test** split, client ``k``'s set for
    ``train_parts[k]``.

  Raises:
    ValueError: bad arguments, or a client's training classes missing from the test split.

  Examples:
    Client 0 trains on 50 examples of class 0 and 10 of class 1, client 1 on 20 of class 1;
    the test split is half the size, so (``ratio = 0.5``) client 0 gets 30 validation
    examples in the same 5:1 mix and client 1 the floor ``min_size = 10``.

    >>> import numpy as np
    >>> import fedco
    >>> train_labels = np.repeat([0, 1], [50, 30])
    >>> test_labels = np.repeat([0, 1], [25, 15])
    >>> train_parts = [np.arange(60), np.arange(60, 80)]
    >>> val = fedco.data.matched_validation(train_parts, train_labels, test_labels, seed=0)
    >>> [np.bincount(test_labels[v], minlength=2).tolist() for v in val]
    [[25, 5], [0, 10]]
  """
  train_labels = _check_labels("train_labels", train_labels)
  test_labels = _check_labels("test_labels", test_labels)
  if len(train_parts) == 0:
    raise ValueError("train_parts must hold at least one client, got none")
  parts = []
  for k, p in enumerate(train_parts):
    p = np.asarray(p).reshape(-1)
    if p.size == 0:
      raise ValueError(f"train_parts[{k}] is empty; every client needs training examples")
    if not np.issubdtype(p.dtype, np.integer) or p.min() < 0 or p.max() >= train_labels.size:
      raise ValueError(
        f"train_parts[{k}] must hold integer indices in "
        f"[0, {train_labels.size}), got min {p.min()}, max {p.max()}"
      )
    parts.append(p)
  if ratio is None:
    ratio = test_labels.size / train_labels.size
  _validate.positive("ratio", ratio)
  min_size = _validate.positive_int("min_size", min_size)
  if not isinstance(disjoint, bool):
    raise ValueError(f"disjoint must be a bool, got {disjoint!r}")
  rng = _check_seed(seed)
  num_classes = int(max(train_labels.max(), test_labels.max())) + 1
  by_class = [np.flatnonzero(test_labels == c) for c in range(num_classes)]
  pools = [rng.permutation(rows) for rows in by_class]
  used = np.zeros(num_classes, np.int64)
  out: List[Optional[np.ndarray]] = [None] * len(parts)
  for k in np.argsort([p.size for p in parts], kind="stable"):
    hist = np.bincount(train_labels[parts[k]], minlength=num_classes)
    size = max(min_size, int(round(ratio * parts[k].size)))
    want = _apportion(hist.astype(np.float64), size)
    rows = []
    for c in np.flatnonzero(want):
      if by_class[c].size == 0:
        raise ValueError(
          f"client {k}'s training set has class {c}, which the test split (test_labels) lacks"
        )
      if not disjoint:  # a fresh pool per client
        pools[c], used[c] = rng.permutation(by_class[c]), 0
      fresh = pools[c][used[c] : used[c] + want[c]]
      used[c] += fresh.size
      rows.append(fresh)
      short = int(want[c] - fresh.size)
      if short:
        rest = np.setdiff1d(by_class[c], fresh)
        replace = rest.size < short
        rows.append(rng.choice(by_class[c] if replace else rest, size=short, replace=replace))
        if disjoint:
          what = (
            f"test class {c} ran out; client {k} reuses {short} examples of it "
            f"{'with' if replace else 'without'} replacement (its validation set "
            f"overlaps other clients')"
          )
        else:
          what = (
            f"client {k} wants {want[c]} examples of test class {c}, which holds "
            f"{by_class[c].size}; {short} are drawn again with replacement"
          )
        warnings.warn(f"matched_validation: {what}", RuntimeWarning, stacklevel=2)
    out[k] = np.sort(np.concatenate(rows))
  return cast(List[np.ndarray], out)  # every client's slot is filled above
