"""The host side of a run: metric writers that stream every chunk, a progress bar, Ctrl-C.

Between two compiled chunks of rounds the host writes the chunk's evaluated rows to every
:class:`RowWriter` (appended, flushed and fsynced, so a killed run keeps every row of the
chunks it finished), updates a ``tqdm`` bar whose rate and ETA leave out the first chunk
(compilation), and checks whether Ctrl-C was pressed: :func:`interrupt_guard` defers SIGINT
to the end of the running chunk, so the run stops cleanly with :class:`Interrupted` after
what it wrote is complete; a Ctrl-C is never dropped (a second one ends the process).
"""

from __future__ import annotations

import csv
import io
import json
import os
import sys
import time
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

import numpy as np

from fedco import _validate
from fedco import io as fedco_io
from fedco.runtime.interrupts import Interrupted, interrupt_guard  # noqa: F401 (re-exported)


def rows(
  metrics: Mapping[str, np.ndarray], first_round: int, labels: Optional[Mapping[str, Any]] = None
) -> List[Dict[str, Any]]:
  """One row per evaluated round of a chunk: ``{"round": r, **labels, metric: value}``.

  Scalars become floats; small vectors (``client_losses``) lists; ``clients`` and
  ``evaluated`` are left out.
  """
  labels = dict(labels or {})
  some = next(iter(metrics.values()), None)
  if some is None:
    return []
  count = np.shape(some)[0]
  evaluated = np.asarray(metrics.get("evaluated", np.ones(count, bool)), bool)
  out = []
  for i in np.flatnonzero(evaluated):
    row = {"round": int(first_round + i + 1), **labels}
    for name, values in metrics.items():
      if name in ("evaluated", "clients", "survivors", "local_steps"):
        continue
      value = np.asarray(values[i])
      row[name] = float(value) if value.ndim == 0 else value.tolist()
    out.append(row)
  return out


def finite_row(row: Mapping[str, Any]) -> bool:
  """Whether every number of a row is finite (a diverged round's row is not written)."""
  return all(
    np.all(np.isfinite(np.asarray(v, float)))
    for k, v in row.items()
    if isinstance(v, (float, list))
  )


class RowWriter:
  """Receives each chunk's rows as soon as the chunk is done; the base of metric writers.

  :func:`fedco.simulate` and :func:`fedco.sweep` (``metric_writers=``) call ``write`` after
  every compiled chunk of rounds with that chunk's evaluated rows, ``{"round": r,
  **metric_labels, metric: value}`` (scalars as floats, per-client vectors as lists; the
  rows of :class:`RoundAction` s too), ``rewind`` once before a run starts (a resumed run
  then writes its restored rows again), and ``close`` at the end. A subclass overrides
  ``write`` and, to support resuming, ``rewind``; ``can_rewind = False`` says ``rewind`` is a
  no-op, so a resumed run does not write its restored rows again (append-only sinks).
  Built-in: :class:`JsonlWriter`, :class:`CsvWriter`, :class:`TensorBoardWriter`.

  Examples:
    A writer that prints the objective of each row:

    >>> import fedco
    >>> class Printer(fedco.runtime.RowWriter):
    ...   def write(self, rows):
    ...     for row in rows:
    ...       print(row["round"], row["algorithm"], round(row["objective"], 3))
    >>> Printer().write([{"round": 1, "algorithm": "fedavg", "objective": 0.51234}])
    1 fedavg 0.512
  """

  def write(self, rows: List[Dict[str, Any]]) -> None:
    """Record ``rows`` (a list of dicts, in round order); subclasses must override it."""
    raise NotImplementedError

  can_rewind = True  # False: rewind is a no-op, so a resumed run does not rewrite rows

  def rewind(self, round_: int, labels: Mapping[str, Any]) -> None:
    """Forget this run's rows after ``round_`` (a resumed run writes them again)."""

  def close(self) -> None:
    """Release the writer's resources (called once, when the run ends)."""


def _append(path: str, text: str) -> None:
  with open(path, "a", encoding="utf-8") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())


def _is_later_row_of(row: Mapping[str, Any], round_: int, labels: Mapping[str, Any]) -> bool:
  return row.get("round", 0) > round_ and all(str(row.get(k)) == str(v) for k, v in labels.items())


class JsonlWriter(RowWriter):
  """Appends one JSON object per row to ``path`` (created with its folder if missing).

  Every ``write`` is appended, flushed and fsynced, so a killed run keeps every row of the
  chunks it finished. ``rewind`` (a resumed run) drops the rows of this run (same labels)
  after the resumed round by an atomic rewrite; other runs' rows in the same file are kept.
  Non-finite numbers are written as ``NaN`` / ``Infinity`` (Python's ``json`` reads them).

  Args:
    path: the ``.jsonl`` file, a string or path-like; appended to if it exists.

  Examples:
    >>> import json
    >>> import os
    >>> import tempfile
    >>> import fedco
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...   path = os.path.join(tmp, "runs", "metrics.jsonl")
    ...   writer = fedco.runtime.JsonlWriter(path)
    ...   writer.write([{"round": 1, "objective": 0.5}, {"round": 2, "objective": 0.25}])
    ...   writer.rewind(1, {})  # a run resumed from round 1 drops its later rows
    ...   writer.close()
    ...   with open(path) as f:
    ...     print([json.loads(line) for line in f])
    [{'round': 1, 'objective': 0.5}]
  """

  def __init__(self, path: str):
    self.path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)

  def write(self, rows):
    if rows:
      _append(self.path, "".join(json.dumps(r, allow_nan=True) + "\n" for r in rows))

  def rewind(self, round_, labels):
    if not os.path.exists(self.path):
      return
    with open(self.path, encoding="utf-8") as f:
      lines = [line for line in f if line.strip()]
    kept = [line for line in lines if not _is_later_row_of(json.loads(line), round_, labels)]
    if len(kept) != len(lines):
      fedco_io.atomic_write(self.path, "".join(kept))


class CsvWriter(RowWriter):
  """Appends scalar rows to a CSV file; the first rows written fix the columns.

  Vector values (``client_losses``) are left out, and so is a column the first rows did not
  have; an existing file's header is kept. Every ``write`` is appended, flushed and fsynced;
  ``rewind`` (a resumed run) drops this run's rows after the resumed round.

  Args:
    path: the ``.csv`` file, a string or path-like (created with its folder if missing,
      appended to if it exists).

  Examples:
    >>> import os
    >>> import tempfile
    >>> import fedco
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...   path = os.path.join(tmp, "metrics.csv")
    ...   writer = fedco.runtime.CsvWriter(path)
    ...   writer.write([
    ...     {"round": 1, "algorithm": "fedavg", "objective": 0.5, "client_losses": [0.4, 0.6]},
    ...     {"round": 2, "algorithm": "fedavg", "objective": 0.25, "client_losses": [0.2, 0.3]},
    ...   ])
    ...   writer.close()
    ...   with open(path) as f:
    ...     print(f.read().strip())
    round,algorithm,objective
    1,fedavg,0.5
    2,fedavg,0.25
  """

  def __init__(self, path: str):
    self.path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
    self.columns = None
    if os.path.exists(self.path):
      with open(self.path, encoding="utf-8", newline="") as f:
        self.columns = next(csv.reader(f), None)

  def write(self, rows):
    rows = [{k: v for k, v in r.items() if not isinstance(v, list)} for r in rows]
    if not rows:
      return
    buffer = io.StringIO()
    if self.columns is None:
      self.columns = list(dict.fromkeys(k for r in rows for k in r))
      csv.writer(buffer).writerow(self.columns)
    writer = csv.DictWriter(buffer, self.columns, extrasaction="ignore")
    writer.writerows(rows)
    _append(self.path, buffer.getvalue())

  def rewind(self, round_, labels):
    if not os.path.exists(self.path):
      return
    with open(self.path, encoding="utf-8", newline="") as f:
      table = list(csv.DictReader(f))
    kept = [
      r
      for r in table
      if not _is_later_row_of({**r, "round": int(r.get("round") or 0)}, round_, labels)
    ]
    if len(kept) != len(table):
      buffer = io.StringIO()
      writer = csv.DictWriter(buffer, self.columns)
      writer.writeheader()
      writer.writerows(kept)
      fedco_io.atomic_write(self.path, buffer.getvalue())


class TensorBoardWriter(RowWriter):
  """Writes each row's numbers as TensorBoard scalars at step ``round`` (needs tensorboardX).

  A row's float values become scalars named ``<label values>/<metric>`` (the row's string
  and int labels joined by ``/``, e.g. ``fedavg/objective``), flushed after every write.
  Event files are append-only: ``can_rewind`` is ``False``, so a resumed run keeps the
  scalars already written and does not write its restored rows again.

  Args:
    logdir: the TensorBoard log directory, a string or path-like (created if missing).

  Raises:
    ValueError: if ``tensorboardX`` is not installed.

  Examples:
    >>> import os
    >>> import tempfile
    >>> import fedco
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...   writer = fedco.runtime.TensorBoardWriter(tmp)
    ...   writer.write([{"round": 1, "algorithm": "fedavg", "objective": 0.5}])
    ...   writer.close()
    ...   [name.split(".")[0] for name in os.listdir(tmp)]
    ['events']
  """

  can_rewind = False  # event files are append-only: a resumed run does not replay its rows

  def __init__(self, logdir: str):
    try:
      from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
    except ImportError:
      raise ValueError("TensorBoardWriter needs tensorboardX: pip install tensorboardX") from None
    self._writer = SummaryWriter(os.fspath(logdir))

  def write(self, rows):
    for row in rows:
      prefix = "/".join(
        str(v)
        for k, v in row.items()
        if k != "round" and isinstance(v, (str, int)) and not isinstance(v, bool)
      )
      for name, value in row.items():
        if isinstance(value, float):
          self._writer.add_scalar(f"{prefix}/{name}" if prefix else name, value, row["round"])
    self._writer.flush()

  def close(self):
    self._writer.close()


AUTO_AFTER_S = 5.0  # progress=None: a bar once a run on a terminal has taken this long


def on_terminal() -> bool:
  """Whether this process's stderr is a terminal (where an automatic bar is shown) and it is
  the first of a multi-process run (one bar, not one per process)."""
  try:
    terminal = sys.stderr is not None and sys.stderr.isatty()
  except (AttributeError, ValueError, OSError):  # replaced or closed
    return False
  if not terminal:
    return False
  import jax  # pylint: disable=import-outside-toplevel

  return jax.process_index() == 0


class ProgressBar:
  """A ``tqdm`` bar over rounds whose rate and ETA leave out the first chunk (compilation).

  ``enabled``: ``True`` a bar from the start, ``False`` none, ``None`` (automatic) a bar
  only where stderr is a terminal and once the run has taken :data:`AUTO_AFTER_S` seconds
  without finishing (a short run, a test, a notebook, a log file: no bar).
  """

  def __init__(
    self, total: int, *, label: str = "", enabled: Optional[bool] = True, initial: int = 0
  ):
    self.total, self.label = total, label
    self._auto = enabled is None and on_terminal()
    self.enabled = bool(enabled) or self._auto
    self._bar = None
    self._start = time.perf_counter()
    # (rounds done, time) when the first chunk ended
    self._steady: Optional[Tuple[int, float]] = None
    if enabled:
      self._open(initial)

  def _open(self, initial: int) -> None:
    try:
      from tqdm.auto import tqdm  # pylint: disable=import-outside-toplevel
    except ImportError:
      if not self._auto:
        raise
      self.enabled = self._auto = False  # automatic: no tqdm, no bar
      return
    self._bar = tqdm(
      total=self.total,
      initial=initial,
      desc=self.label,
      unit="round",
      leave=True,
      bar_format="{desc} {percentage:3.0f}%|{bar:20}| {n_fmt}/{total_fmt} rounds{postfix}",
    )

  def update(self, done: int, metric: Optional[float] = None, name: str = "objective"):
    if not self.enabled:
      return
    now = time.perf_counter()
    if self._bar is None:  # automatic: the bar appears once the run is long
      if self._steady is None:
        self._steady = (done, now)
      if done >= self.total or now - self._start < AUTO_AFTER_S:
        return
      self._open(done)
      if self._bar is None:
        return
    postfix = {}
    if self._steady is None:  # the first chunk included compilation: measure from here
      self._steady = (done, now)
    elif done > self._steady[0]:
      rate = (done - self._steady[0]) / max(now - self._steady[1], 1e-9)
      postfix["rounds/s"] = f"{rate:.1f}"
      postfix["eta"] = f"{(self.total - done) / rate:.0f}s"
    if metric is not None:
      postfix[name] = f"{metric:#.4g}"  # 4 digits, trailing zeros kept: 0.9000, 0.5582
    self._bar.set_postfix(postfix, refresh=False)
    self._bar.update(done - self._bar.n)

  def close(self):
    if self._bar is not None:
      self._bar.close()


class RoundAction:
  """Calls ``fn(state, round)`` on the host every ``every_rounds`` rounds of a simulation.

  Pass it in :func:`fedco.simulate`'s ``actions=``. It runs after every ``every_rounds``-th
  round and after the last round, with the whole :class:`~fedco.runtime.SimState`: personal
  models, trackers, the server's weights, not only the parameters that ``metrics_fn`` sees
  (in a streamed run with client state on disk, ``state.clients`` holds only the last
  chunk's clients, as :class:`~fedco.runtime.Pages`). A returned dict of numbers is a row
  of metrics at that round, ``{"round": r, **metric_labels, name: value}`` (streamed to the
  metric writers, checkpointed, kept in ``SimulationResult.host_metrics``; a non-finite
  number stops the run like a diverged metric); ``None`` records nothing. The run's chunks
  end at the action's rounds, so it sees exactly that round's state.

  Args:
    fn: a callable ``fn(state, round) -> dict of numbers (scalars or arrays) or None``;
      ``round`` is the number of completed rounds.
    every_rounds: an int ``>= 1``: call ``fn`` after rounds ``every_rounds``,
      ``2 every_rounds``, ..., and after the run's last round.
    at_start: ``True`` also calls ``fn`` on the initial state (round 0) of a run that starts
      fresh (not on a resume); default ``False``.

  Raises:
    ValueError: if ``fn`` is not callable, ``every_rounds`` is not an int ``>= 1`` or
      ``at_start`` is not a bool; when called, if ``fn`` returns neither a dict nor ``None``.

  Examples:
    The norm of the server model at the start and after every second round of FedAvg:

    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> import fedco
    >>> x = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 1.0]], np.float32)
    >>> data = fedco.FederatedData.from_clients([{"x": x + k} for k in range(4)])
    >>> problem = fedco.problems.plain(lambda w, e: jnp.sum((w - e["x"]) ** 2))
    >>> norm = lambda state, r: {"norm": jnp.linalg.norm(state.server["params"])}
    >>> result = fedco.simulate(
    ...   problem, fedco.fedavg(0.1, 1), data, jnp.zeros(2), rounds=4, batch_size=None,
    ...   actions=[fedco.runtime.RoundAction(norm, every_rounds=2, at_start=True)],
    ... )
    >>> [(row["round"], row["algorithm"], round(row["norm"], 2)) for row in result.host_metrics]
    [(0, 'fedavg', 0.0), (2, 'fedavg', 1.21), (4, 'fedavg', 1.99)]
  """

  def __init__(self, fn, every_rounds: int, *, at_start: bool = False):
    if not callable(fn):
      raise ValueError(f"RoundAction needs a callable fn(state, round), got {fn!r}")
    if not isinstance(at_start, bool):
      raise ValueError(f"at_start must be a bool, got {at_start!r}")
    self.fn, self.at_start = fn, at_start
    self.every_rounds = _validate.positive_int("every_rounds", every_rounds)

  def rounds_to_next(self, done: int) -> int:
    """Rounds until the action is next due after round ``done``."""
    return self.every_rounds - done % self.every_rounds

  def due(self, done: int, total: int) -> bool:
    return done % self.every_rounds == 0 or done == total

  def __call__(self, state, round_: int) -> Optional[Dict[str, Any]]:
    out = self.fn(state, round_)
    if out is None:
      return None
    if not isinstance(out, Mapping):
      raise ValueError(
        f"a RoundAction's fn must return a dict of numbers or None, got {type(out).__name__}"
      )
    return {k: (float(v) if np.ndim(v) == 0 else np.asarray(v).tolist()) for k, v in out.items()}


def close_all(writers: Iterable[RowWriter]) -> None:
  for writer in writers:
    writer.close()
