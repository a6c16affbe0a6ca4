r"""The federated dataset: examples stored once, each client a slice of one row list.

Clients of very different sizes (50,000 and 1 examples, say) are not padded copies of their
data, and no ``clients x largest client`` table exists. The clients' example rows are
concatenated, client by client, into one ``int32`` list ``flat_rows`` of length
:math:`M = \sum_k n_k`; client ``k`` is the slice ``flat_rows[offsets[k] : offsets[k] +
counts[k]]``. Batches are gathered by position inside the jitted program, and exact
evaluation reads the same list with each pair's owner (``flat_owner``), so memory and
evaluation cost are :math:`O(M)`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any


@functools.partial(
  jax.tree_util.register_dataclass,
  data_fields=["examples", "counts", "offsets", "flat_rows", "flat_owner"],
  meta_fields=["max_count"],
)
@dataclasses.dataclass(frozen=True)
class FederatedData:
  r"""Examples plus each client's slice of one row list (a pytree; pass it to jitted code).

  Client :math:`k`'s data set :math:`D_k` (SPEC notation: ``K`` clients, :math:`n_k` examples
  each) is the rows ``flat_rows[offsets[k] : offsets[k] + counts[k]]`` of ``examples``; rows
  may be shared by clients. Every field but ``max_count`` is an array leaf, so the whole
  object goes into ``jax.jit``, ``fedco.simulate`` and ``fedco.sweep`` as one argument;
  ``max_count`` is static (whole-data batches have this many rows).

  Build it with :meth:`from_clients` (one examples pytree per client),
  :meth:`from_index_lists` (index lists into one split, e.g. from a
  :mod:`fedco.data.partition` partitioner) or :func:`fedco.data.make_federated`, rather than
  from the fields. Host-side helpers: :attr:`num_clients`, :attr:`num_examples`,
  :meth:`client`, :attr:`index`, :meth:`with_owner`, :meth:`flat_weights`.

  Attributes:
    examples: pytree of arrays with a shared leading axis ``N`` (e.g. ``{"x", "y"}``).
    counts: ``int32 [K]``, examples per client :math:`n_k` (each ``>= 1``).
    offsets: ``int32 [K]``, where client ``k``'s slice of ``flat_rows`` starts
      (``sum(counts[:k])``).
    flat_rows: ``int32 [M]`` with :math:`M = \sum_k n_k`: the clients' example rows, client
      by client.
    flat_owner: ``int32 [M]``: the client of each entry.
    max_count: the largest client's size, :math:`\max_k n_k` (static: whole-data batches
      have this many rows).

  Examples:
    Two clients of 3 and 1 examples, concatenated once:

    >>> import numpy as np
    >>> import fedco
    >>> data = fedco.FederatedData.from_clients([
    ...   {"x": np.ones((3, 2), np.float32), "y": np.array([0, 1, 1])},
    ...   {"x": np.zeros((1, 2), np.float32), "y": np.array([2])},
    ... ])
    >>> data.num_clients, data.num_examples, data.max_count
    (2, 4, 3)
    >>> data.counts.tolist(), data.offsets.tolist()
    ([3, 1], [0, 3])
    >>> data.flat_rows.tolist(), data.flat_owner.tolist()
    ([0, 1, 2, 3], [0, 0, 0, 1])
  """

  examples: PyTree
  counts: jax.Array
  offsets: jax.Array
  flat_rows: jax.Array
  flat_owner: jax.Array
  max_count: int

  @property
  def num_clients(self) -> int:
    """The number of clients ``K`` (``len(counts)``)."""
    return int(self.counts.shape[0])

  @property
  def num_examples(self) -> int:
    """The number of stored example rows ``N`` (shared rows counted once)."""
    return int(jax.tree.leaves(self.examples)[0].shape[0])

  def replace(self, **changes) -> "FederatedData":
    """A copy with the given fields changed (``dataclasses.replace``).

    Args:
      **changes: new values of fields, by name (e.g. ``examples=...``).

    Returns:
      A new object of the same type; this one is unchanged (it is frozen).
    """
    return dataclasses.replace(self, **changes)

  @property
  def index(self) -> jax.Array:
    """The ``int32 [K, max_count]`` table of each client's rows, padded with its first row.

    Materialised on request (``K * max_count`` entries) for inspection and small data; the
    runtime never builds it. For the clients of the class example above it is
    ``[[0, 1, 2], [3, 3, 3]]``.
    """
    pos = jnp.arange(self.max_count)
    pos = jnp.where(pos[None, :] < self.counts[:, None], pos[None, :], 0)
    return self.flat_rows[self.offsets[:, None] + pos]

  @classmethod
  def from_index_lists(
    cls,
    examples: PyTree,
    client_indices: Sequence[Any],
    *,
    num_classes: Optional[int] = None,
    label_key: str = "y",
  ) -> "FederatedData":
    """Clients given as lists of row indices into ``examples`` (rows may be shared).

    ``examples`` is stored once, on device; each client keeps only its row indices, in the
    order given. Integer labels (the ``label_key`` field, when present) must lie in
    ``[0, num_classes)`` (``num_classes=None``: only ``>= 0`` is checked): a gather would
    silently wrap ``-1`` to the last class.

    Args:
      examples: pytree of arrays (host or device) with a shared leading example axis ``N``.
      client_indices: ``K >= 1`` non-empty sequences of integer rows in ``[0, N)``, one per
        client (e.g. a partitioner's output); a row may appear in several clients.
      num_classes: number of classes, to check the labels against; ``None`` checks only
        that they are ``>= 0``.
      label_key: the field of a dict ``examples`` that holds the labels (checked only when
        it is present and integer).

    Returns:
      A :class:`FederatedData` whose ``examples`` are ``examples`` as device arrays.

    Raises:
      ValueError: no clients, an empty client, an index out of range, example leaves with
        different leading sizes, or a label out of range (naming the client and row).

    Examples:
      >>> import numpy as np
      >>> import fedco
      >>> examples = {"x": np.arange(5.0)[:, None], "y": np.array([0, 1, 0, 1, 1])}
      >>> data = fedco.FederatedData.from_index_lists(examples, [[0, 1, 2], [2, 3, 4]])
      >>> data.counts.tolist(), data.flat_rows.tolist(), data.num_examples
      ([3, 3], [0, 1, 2, 2, 3, 4], 5)
    """
    leaves = jax.tree.leaves(examples)
    if not leaves:
      raise ValueError("examples must be a non-empty pytree of arrays")
    n = int(np.shape(leaves[0])[0])
    for leaf in leaves:
      if np.ndim(leaf) == 0 or np.shape(leaf)[0] != n:
        raise ValueError(
          "every examples leaf needs the same leading (example) axis; got shapes "
          f"{[np.shape(l) for l in leaves]}"
        )
    if len(client_indices) == 0:
      raise ValueError("client_indices must name at least one client, got none")
    rows = [np.asarray(ix, dtype=np.int64).reshape(-1) for ix in client_indices]
    for k, ix in enumerate(rows):
      if ix.size == 0:
        raise ValueError(f"client {k} has no examples; every client needs at least one")
      if ix.min() < 0 or ix.max() >= n:
        raise ValueError(f"client {k} has indices outside [0, {n}): min {ix.min()}, max {ix.max()}")
    if isinstance(examples, dict) and label_key in examples:
      _check_labels(np.asarray(examples[label_key]), rows, num_classes, label_key)
    counts = np.array([ix.size for ix in rows], np.int32)
    offsets = (np.cumsum(counts, dtype=np.int64) - counts).astype(np.int32)
    flat_rows = np.concatenate(rows).astype(np.int32)
    flat_owner = np.repeat(np.arange(len(rows), dtype=np.int32), counts)
    return cls(
      jax.tree.map(jnp.asarray, examples),
      jnp.asarray(counts),
      jnp.asarray(offsets),
      jnp.asarray(flat_rows),
      jnp.asarray(flat_owner),
      int(counts.max()),
    )

  @classmethod
  def from_clients(
    cls,
    client_examples: Sequence[PyTree],
    *,
    num_classes: Optional[int] = None,
    label_key: str = "y",
  ) -> "FederatedData":
    """Clients given as separate pytrees of arrays; they are concatenated once.

    Client ``k``'s rows follow client ``k - 1``'s, so ``flat_rows`` is ``arange(N)``. See
    the class example.

    Args:
      client_examples: ``K >= 1`` pytrees of arrays, one per client, all with the same
        structure and per-example (trailing) shapes; every leaf has a leading example axis
        of the client's size ``n_k >= 1``.
      num_classes: number of classes, to check integer labels against (see
        :meth:`from_index_lists`); ``None`` checks only that they are ``>= 0``.
      label_key: the field of dict examples that holds the labels.

    Returns:
      A :class:`FederatedData` with ``counts`` the clients' sizes.

    Raises:
      ValueError: no clients, a client whose structure, field types or trailing shapes
        differ from client 0's (naming the client and field), or a label out of range.
    """
    if len(client_examples) == 0:
      raise ValueError("client_examples must hold at least one client, got none")
    structure = jax.tree.structure(client_examples[0])
    first = None
    for k, ex in enumerate(client_examples):
      # jaxlib's PyTreeDef (a C extension) has no stubs
      if jax.tree.structure(ex) != structure:  # type: ignore[operator]
        raise ValueError(
          f"client {k}'s examples have structure {jax.tree.structure(ex)}, expected {structure}"
        )
      fields = jax.tree_util.tree_flatten_with_path(ex)[0]
      for path, leaf in fields:
        name = jax.tree_util.keystr(path) or "examples"
        if not hasattr(leaf, "shape") or np.ndim(leaf) == 0:
          raise ValueError(
            f"client {k}'s field {name} must be an array with a leading "
            f"example axis, got {type(leaf).__name__}"
          )
      shapes = [np.shape(leaf)[1:] for _, leaf in fields]
      first = shapes if first is None else first
      for (path, _), shape, want in zip(fields, shapes, first):
        if shape != want:
          raise ValueError(
            f"client {k}'s field {jax.tree_util.keystr(path)} has per-example "
            f"shape {shape}, client 0's has {want}"
          )
    sizes = [int(np.shape(jax.tree.leaves(ex)[0])[0]) for ex in client_examples]
    examples = jax.tree.map(
      lambda *xs: np.concatenate([np.asarray(x) for x in xs]), *client_examples
    )
    starts = np.cumsum([0] + sizes)
    return cls.from_index_lists(
      examples,
      [np.arange(starts[k], starts[k + 1]) for k in range(len(sizes))],
      num_classes=num_classes,
      label_key=label_key,
    )

  def with_owner(self, key: str = "client") -> "FederatedData":
    """A copy whose examples carry their client's index under ``key`` (``int32``).

    Client-level objectives whose inner map depends on the owner (the client-level KL-DRO log
    form, :mod:`fedco.problems.dro`) read it. Rows must belong to exactly one client.

    Args:
      key: the new example field, not already in ``examples``.

    Returns:
      A copy whose ``examples`` dict has the extra field ``key``: ``int32 [N]``, each row's
      client.

    Raises:
      ValueError: ``examples`` is not a dict, ``key`` already names an example field, or a
        row is shared by clients.

    Examples:
      >>> import numpy as np
      >>> import fedco
      >>> data = fedco.FederatedData.from_clients([{"x": np.ones((2, 1))}, {"x": np.ones((1, 1))}])
      >>> data.with_owner().examples["client"].tolist()
      [0, 0, 1]
    """
    if not isinstance(self.examples, dict):
      raise ValueError(
        f"with_owner needs examples to be a dict of arrays, got {type(self.examples).__name__}"
      )
    if key in self.examples:
      raise ValueError(f"key {key!r} already names an example field; pick another key")
    return self.replace(examples={**self.examples, key: self._owner_labels()})

  def _owner_labels(self) -> jax.Array:
    """Each example row's client index (``int32``, ``[num_examples]``), for ``with_owner``."""
    rows = np.asarray(self.flat_rows)
    if np.unique(rows).size != rows.size:
      raise ValueError(
        "with_owner needs every row to belong to exactly one client; some rows are shared"
      )
    owner = np.zeros((self.num_examples,), np.int32)
    owner[rows] = np.asarray(self.flat_owner)
    return jnp.asarray(owner)

  def client(self, k: int) -> PyTree:
    """Client ``k``'s examples (host-side convenience; not for the hot path).

    Args:
      k: a client index in ``[0, K)``.

    Returns:
      The pytree ``examples`` restricted to client ``k``'s rows, in its order: leaves with
      leading size ``counts[k]``.
    """
    start = int(self.offsets[k])
    rows = np.asarray(self.flat_rows[start : start + int(self.counts[k])])
    return jax.tree.map(lambda a: a[rows], self.examples)

  def flat_weights(self) -> jax.Array:
    r"""Weights of the flat pairs, ``1/n_owner``: summed per owner they give client means.

    For per-pair values :math:`l_j`, :math:`\sum_{j:\,\mathrm{owner}(j)=k} w_j l_j` is
    client :math:`k`'s mean over :math:`D_k`; exact evaluation uses this.

    Returns:
      ``float [M]`` (the default float dtype): ``1 / counts[flat_owner]``.
    """
    return 1.0 / self.counts[self.flat_owner].astype(jnp.result_type(float))


def _check_labels(labels: np.ndarray, rows, num_classes, key):
  """Integer labels in ``[0, num_classes)``; the error names the client and row."""
  if not np.issubdtype(labels.dtype, np.integer):
    return
  if num_classes is not None and (
    isinstance(num_classes, bool)
    or not isinstance(num_classes, (int, np.integer))
    or num_classes < 1
  ):
    raise ValueError(f"num_classes must be an integer >= 1, got {num_classes!r}")
  high = np.iinfo(labels.dtype).max if num_classes is None else int(num_classes) - 1
  for k, ix in enumerate(rows):
    values = labels[ix]
    bad = np.flatnonzero((values < 0) | (values > high))
    if bad.size:
      allowed = f"[0, {num_classes})" if num_classes is not None else ">= 0"
      raise ValueError(
        f"label {key!r} of client {k}, row {int(ix[bad[0]])}, is "
        f"{int(values[bad[0]])}; labels must be {allowed}"
      )
