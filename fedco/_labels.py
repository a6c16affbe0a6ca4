"""Class labels against a model's classes, for ``fedco.models.cross_entropy`` and ``accuracy``.

A concrete label outside ``[0, C)`` (``C`` the logits' last axis) is a one-line
``ValueError``. A traced label has no value to check, with one exception: while fedco traces
a function over data it holds (:func:`from_data`: ``Simulator.init``'s check of the params,
``fedco.metrics.per_client_mean``), a label that *is* one of the traced example's fields is
checked against that field's concrete values, so labels past the model's classes are
refused before anything runs, naming the field, its range and the allowed range.
"""

from __future__ import annotations

import contextlib
import threading

import jax
import numpy as np

_ACTIVE = threading.local()  # a stack of {id(tracer): _Source}


class LabelError(ValueError):
  """Labels outside the logits' classes (a ``ValueError``)."""


class _Source:
  """A traced example field and the host values it stands for (range computed once)."""

  def __init__(self, tracer, name, values, rows, owners=None, path=()):
    self.tracer, self.name, self.values, self.rows = tracer, name, values, rows
    self.owners, self.path = owners, path
    self._range = None

  def _values(self):
    values = np.asarray(self.values)
    return values if self.rows is None else values[np.asarray(self.rows)]

  def range(self):
    if self._range is None:
      values = self._values()
      self._range = (int(values.min()), int(values.max())) if values.size else None
    return self._range

  def refuse(self, num_classes: int, what: str) -> "LabelError":
    """The error of labels past ``num_classes``: the first such row, with its client where
    the owners are known (the same words as :func:`out_of_range`), else the range."""
    values = self._values()
    bad = np.flatnonzero((values < 0) | (values >= num_classes))
    if self.owners is not None and bad.size:
      at = int(bad[0])
      row = at if self.rows is None else int(np.asarray(self.rows)[at])
      owner = int(np.asarray(self.owners)[at])
      return out_of_range(self.name, owner, row, int(values[at]), num_classes, what)
    found = self.range()
    return LabelError(
      f"the labels {self.name} lie in [{found[0]}, {found[1]}], but {what}'s "
      f"logits have {num_classes} classes: labels must be in [0, {num_classes}) "
      f"(num_classes={num_classes} when building the data checks them there)"
    )


def out_of_range(name: str, client: int, row: int, value: int, num_classes: int, what: str):
  """The :class:`LabelError` of a label past the logits: field ``name``, client ``client``,
  its row ``row`` of the data (a streamed run's store names the same row)."""
  return LabelError(
    f"the label {name} of client {client}, row {row}, is {value}, but {what}'s logits have "
    f"{num_classes} classes: labels must be in [0, {num_classes}) (num_classes="
    f"{num_classes} when building the data checks them there)"
  )


def _concrete_integers(leaf) -> bool:
  if isinstance(leaf, jax.core.Tracer) or not hasattr(leaf, "dtype"):
    return False
  if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
    return False
  return np.issubdtype(leaf.dtype, np.integer)


@contextlib.contextmanager
def from_data(example, source, rows=None, what: str = "data.examples", owners=None):
  """While active, check labels that are leaves of ``example`` (a traced example, as the
  traced function received it) against the matching leaves of ``source`` (the concrete
  examples it was drawn from, at ``rows``; ``None``: all; ``owners``: each of those rows'
  client, named by the error). Fields that are not concrete integer arrays, or whose
  structure differs, are skipped."""
  sources = {}
  traced = jax.tree_util.tree_flatten_with_path(example)[0]
  values = jax.tree.leaves(source)
  if len(traced) == len(values) and (rows is None or _concrete_integers(rows)):
    for (path, tracer), value in zip(traced, values):
      if isinstance(tracer, jax.core.Tracer) and _concrete_integers(value):
        name = what + jax.tree_util.keystr(path)
        sources[id(tracer)] = _Source(tracer, name, value, rows, owners, tuple(path))
  stack = getattr(_ACTIVE, "stack", None)
  if stack is None:
    stack = _ACTIVE.stack = []
  stack.append(sources)
  try:
    yield
  finally:
    stack.pop()


@contextlib.contextmanager
def recording():
  """While active, list every check of a traced example field as ``(path, num_classes,
  what)`` (``path`` the field's key path in the example): what a streamed run checks each
  chunk's labels against on the host (:mod:`fedco.runtime.streaming`)."""
  seen: list = []
  records = getattr(_ACTIVE, "records", None)
  if records is None:
    records = _ACTIVE.records = []
  records.append(seen)
  try:
    yield seen
  finally:
    records.pop()


def check(label, num_classes: int, what: str) -> None:
  """Refuse labels outside ``[0, num_classes)`` where their values are known (see above)."""
  if isinstance(label, jax.core.Tracer):
    for sources in reversed(getattr(_ACTIVE, "stack", None) or ()):
      source = sources.get(id(label))
      if source is not None and source.tracer is label:
        for seen in getattr(_ACTIVE, "records", None) or ():
          seen.append((source.path, int(num_classes), what))
        found = source.range()
        if found is not None and (found[0] < 0 or found[1] >= num_classes):
          raise source.refuse(num_classes, what)
        return
    return
  values = np.asarray(label)
  if not np.issubdtype(values.dtype, np.integer):
    raise LabelError(
      f"{what}: label must be an integer class index in [0, {num_classes}), got {label!r}"
    )
  if values.size and (values.min() < 0 or values.max() >= num_classes):
    shown = values.item() if values.ndim == 0 else f"values in [{values.min()}, {values.max()}]"
    raise LabelError(
      f"{what}: label must be a class index in [0, {num_classes}) (the logits' "
      f"last axis), got {shown}"
    )
