"""The output contract of an experiment's workdir, and the tables and figures of its results.

A run writes into ``--workdir``: ``config.json`` (the config), ``metrics.jsonl`` and
``metrics.csv`` (streamed by ``fedco.simulate``'s writers, one row per evaluated round),
figures (PNG, rendered with Agg: no display, no pyplot state) and ``summary.json``, written
last (its presence marks a finished run). Files are written atomically (a hidden temporary
file in the same directory, ``os.replace``-d onto the name), so a killed process leaves the
previous complete file or the new one, never half of one. JSON is strict: numpy / JAX values
become plain numbers and lists, non-finite floats ``null``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import numbers
import os
import shutil
import weakref
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from fedco.io import DirectoryLock, atomic_write, remove_stale_temporaries

CONFIG, METRICS, SUMMARY = "config.json", "metrics.jsonl", "summary.json"
METRICS_CSV = "metrics.csv"
OUTPUT_FILES = (CONFIG, METRICS, METRICS_CSV, SUMMARY)  # the files every run writes
CHECKPOINTS = "checkpoints"
STAGING = "in_progress"  # a running run's outputs, moved into the workdir when complete


# ---- JSON conversion ---------------------------------------------------------------------


def to_jsonable(value: Any) -> Any:
  """``value`` as plain JSON types: numpy/JAX scalars and arrays, tuples, paths, dataclasses.

  Non-finite floats become ``None``. Raises ``TypeError`` naming the type of anything else.
  """
  if value is None or isinstance(value, (bool, str)):
    return value
  if isinstance(value, numbers.Integral):
    return int(value)
  if isinstance(value, numbers.Real):
    value = float(value)
    return value if math.isfinite(value) else None
  if isinstance(value, Mapping):
    return {str(k): to_jsonable(v) for k, v in value.items()}
  if isinstance(value, (list, tuple, set, frozenset)):
    return [to_jsonable(v) for v in value]
  if isinstance(value, os.PathLike):
    return os.fspath(value)
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    return to_jsonable(dataclasses.asdict(value))
  if isinstance(value, np.generic) or hasattr(value, "__array__"):  # numpy, JAX
    array = np.asarray(value)
    if array.dtype == object:
      return [to_jsonable(v) for v in array.tolist()]
    if array.dtype.kind in "fc" and not np.all(np.isfinite(array)):
      return to_jsonable(array.tolist())  # per element, so non-finite entries become null
    return array.tolist()
  raise TypeError(f"cannot write a {type(value).__name__} to JSON: {value!r}")


def dumps(value: Any, **kwargs) -> str:
  """Strict JSON (no NaN) of ``to_jsonable(value)``."""
  return json.dumps(to_jsonable(value), allow_nan=False, **kwargs)


# ---- atomic writes -----------------------------------------------------------------------

# ---- flag checks -------------------------------------------------------------------------


def check_real(name, value, *, low=None, high=None, low_open=True, high_open=False) -> float:
  """A finite number in the given interval, or ``ValueError`` naming ``--name``."""
  if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
    raise ValueError(f"--{name} must be a finite number, got {value!r}")
  ok = (low is None or (value > low if low_open else value >= low)) and (
    high is None or (value < high if high_open else value <= high)
  )
  if not ok:
    lo = "-inf" if low is None else f"{'(' if low_open else '['}{low:g}"
    hi = "inf)" if high is None else f"{high:g}{')' if high_open else ']'}"
    raise ValueError(f"--{name} must lie in {lo}, {hi}, got {value!r}")
  return float(value)


def check_positive(name, value, *, allow_zero: bool = False) -> float:
  """A finite number ``> 0`` (``>= 0`` with ``allow_zero``)."""
  return check_real(name, value, low=0.0, low_open=not allow_zero)


def check_int(name, value, minimum) -> int:
  """An integer ``>= minimum``, or ``ValueError`` naming ``--name``."""
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
    raise ValueError(f"--{name} must be an integer >= {minimum}, got {value!r}")
  return int(value)


def check_int_list(name, values, minimum, *, distinct: bool = False) -> tuple:
  """A non-empty comma list (or sequence) of integers ``>= minimum`` (distinct if asked)."""
  try:
    out = tuple(int(v) for v in values)
  except (TypeError, ValueError):
    raise ValueError(f"--{name} must be a comma list of integers, got {values!r}") from None
  if not out:
    raise ValueError(f"--{name} must name at least one value")
  for v in out:
    check_int(name, v, minimum)
  if distinct and len(set(out)) != len(out):
    raise ValueError(f"--{name} lists a value twice: {list(out)}")
  return out


# ---- the workdir -------------------------------------------------------------------------


def check_workdir(workdir, flag: str = "workdir") -> str:
  """``workdir`` as a string, or ``ValueError`` naming ``--flag`` when it is not a path."""
  if isinstance(workdir, os.PathLike):
    workdir = os.fspath(workdir)
  if not isinstance(workdir, str) or not workdir.strip():
    raise ValueError(f"--{flag} must be a non-empty path string, got {workdir!r}")
  return workdir


class Workdir:
  """One run's output directory (created if missing).

  A run writes its outputs into ``<workdir>/in_progress/`` (streamed metrics included), and
  :meth:`write_summary`, written last, moves them into the workdir, replacing the previous
  run's: until the new results are complete the previous ones stay whole (a failed or killed
  rerun leaves them, and its partial outputs stay in ``in_progress/`` until the next run).
  Only what a fedco experiment wrote is ever replaced or removed: the workdir keeps a
  manifest (``.fedco-written.json``) of every output it writes (results, figures,
  TensorBoard files, run checkpoint directories), so files a user put beside them (another
  ``tensorboard/`` tree, their own ``.tmp-*`` files) are never touched. The directory is
  locked for the process (a second process gets a one-line error naming it). An unwritable
  directory is a one-line ``ValueError``; so is a directory, or a file fedco did not write,
  where it writes its manifest, ``config.json``, ``metrics.jsonl``,
  ``metrics.csv`` or ``summary.json`` (checked before anything is written). A run killed while
  writing one of those leaves its temporary ``.tmp-<name>.<random>``; the next ``Workdir``
  (holding the lock) removes it.

  Args:
    path: the directory (``--workdir``).
    flag: the flag name used in error messages.
  """

  def __init__(self, path, *, flag: str = "workdir"):
    self.path = os.path.abspath(check_workdir(path, flag))
    try:
      os.makedirs(self.path, exist_ok=True)
    except OSError as e:
      raise ValueError(f"--{flag}={path!r} cannot be used as a directory: {e}") from None
    # One process per workdir: another gets a one-line error naming this one; released
    # when this object goes (or the process dies).
    lock = DirectoryLock(self.path, what=f"--{flag}").acquire()
    weakref.finalize(self, lock.release)
    try:  # before anything is written or removed
      _check_outputs(self.path, flag)
    except ValueError:
      lock.release()
      raise
    # A process killed while writing one of our files left its temporary file; no other
    # process writes them while we hold the lock, so those are stale. (Not figures':
    # ``experiments.plot`` writes PNGs here without the lock; ours go to in_progress/.)
    remove_stale_temporaries(self.path, [MANIFEST, *OUTPUT_FILES])
    self._staged: List[str] = []
    # A killed run's partial outputs go (they are ours: the manifest lists the folder);
    # the previous complete results stay until this run's replace them.
    staging = os.path.join(self.path, STAGING)
    if STAGING in read_manifest(self.path):
      shutil.rmtree(staging, ignore_errors=True)
    elif os.path.exists(staging):
      raise ValueError(
        f"--{flag}={path!r} holds {STAGING}/, which fedco did not write; "
        "move it away or use another workdir"
      )
    record_written(self.path, staging)
    os.makedirs(staging)
    self._stage = staging

  def file(self, name: str) -> str:
    """Where this run writes output ``name`` (inside ``in_progress/`` until the summary)."""
    return os.path.join(self._stage, name)

  def record(self, path: str) -> str:
    """Add ``path`` to the manifest of what this workdir wrote (an output in
    ``in_progress/`` is listed under its final name when it is moved into place)."""
    path = os.path.abspath(path)
    if os.path.dirname(path) == self._stage and self._stage != self.path:
      name = os.path.basename(path)
      if name not in self._staged:
        self._staged.append(name)
    else:
      record_written(self.path, path)
    return path

  def commit(self) -> None:
    """Move this run's outputs into the workdir, replacing the previous run's
    (``summary.json`` last, so its presence marks complete results); the previous outputs
    this run did not write again are removed. Later writes go straight to the workdir."""
    if self._stage == self.path:
      return
    previous = [n for n in read_manifest(self.path) if not _is_checkpoint(n) and n != STAGING]
    staged = [
      n
      for n in sorted(self._staged, key=lambda n: n == SUMMARY)
      if os.path.exists(os.path.join(self._stage, n))  # announced, never written: out
      and not (
        os.path.isdir(os.path.join(self._stage, n))
        and n not in previous
        and os.path.exists(os.path.join(self.path, n))
      )
    ]  # a user's folder
    _write_manifest(self.path, read_manifest(self.path) + staged)
    for name in staged:  # the new outputs first (os.replace overwrites a file) ...
      if os.path.isdir(os.path.join(self._stage, name)):
        _remove(self.path, name)
      os.replace(os.path.join(self._stage, name), os.path.join(self.path, name))
    for name in previous:  # ... then the previous run's outputs this run did not rewrite
      if name not in staged:
        _remove(self.path, name)
    _write_manifest(
      self.path, [n for n in read_manifest(self.path) if n not in previous or n in staged]
    )
    if not os.listdir(self._stage):
      os.rmdir(self._stage)
      _write_manifest(self.path, [n for n in read_manifest(self.path) if n != STAGING])
    self._stage = self.path

  def write_json(self, name: str, value: Any) -> str:
    path = self.file(name)
    self.record(path)
    atomic_write(path, dumps(value, indent=2) + "\n")
    return path

  def write_config(self, config: Mapping[str, Any]) -> str:
    """``config.json``: the run's flag values."""
    return self.write_json(CONFIG, dict(config))

  def write_summary(self, summary: Mapping[str, Any]) -> str:
    """``summary.json``: write it last; it completes the run (see :meth:`commit`)."""
    self.write_json(SUMMARY, dict(summary))
    self.commit()
    return os.path.join(self.path, SUMMARY)

  def save_figure(self, fig, name: str = "plot.png", *, dpi: int = 120) -> str:
    """Save a matplotlib figure as PNG, atomically."""
    self.record(self.file(name))
    return self.save_figure_to(self._stage, fig, name, dpi=dpi)

  @staticmethod
  def save_figure_to(directory, fig, name: str, *, dpi: int = 120) -> str:
    """Save ``fig`` as ``directory/name`` (PNG) atomically, without claiming the directory."""
    path = os.path.join(directory, name)
    atomic_write(
      path, lambda f: fig.savefig(f, format="png", dpi=dpi, bbox_inches="tight"), mode="wb"
    )
    return path


def _check_outputs(workdir: str, flag: str) -> None:
  """Refuse (``ValueError``) a workdir where a run could not write its output files (a
  directory in the way) or would replace files fedco did not write (not in the manifest)."""
  for name in (MANIFEST, *OUTPUT_FILES):
    target = os.path.join(workdir, name)
    if os.path.isdir(target):
      raise ValueError(
        f"--{flag}: {target} is a directory, where fedco writes a file; move "
        "it away or use another workdir"
      )
  ours = read_manifest(workdir)
  theirs = [n for n in OUTPUT_FILES if n not in ours and os.path.lexists(os.path.join(workdir, n))]
  if theirs:
    raise ValueError(
      f"--{flag}: {workdir} holds {', '.join(theirs)}, which fedco did not "
      f"write (its {MANIFEST} does not list them) and a run would replace; move "
      f"{'them' if len(theirs) > 1 else 'it'} away or use another workdir"
    )


def quiet_logs() -> None:
  """Show absl/orbax logs from WARNING up unless the user passed ``--verbosity``.

  Called at the start of each binary's ``main``: orbax logs every checkpoint at INFO.
  """
  from absl import flags, logging

  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)


def start_checkpoints(wd: "Workdir", config: Mapping[str, Any]) -> None:
  """With ``--noresume``, delete the run checkpoint directories this workdir wrote (its
  manifest lists them), so every run starts over; nothing else under ``checkpoints/``."""
  if config["resume"]:
    return
  names = read_manifest(wd.path)
  for name in names:
    if _is_checkpoint(name):
      shutil.rmtree(os.path.join(wd.path, name), ignore_errors=True)
  _write_manifest(wd.path, [n for n in names if not _is_checkpoint(n)])


MANIFEST = ".fedco-written.json"


def _is_checkpoint(name: str) -> bool:
  """Whether a manifest entry is a run's checkpoint directory."""
  return name.startswith(CHECKPOINTS + os.sep)


def read_manifest(workdir: str) -> List[str]:
  """The workdir-relative paths fedco's experiments wrote into ``workdir``."""
  try:
    with open(os.path.join(workdir, MANIFEST)) as f:
      names = json.load(f)
  except (OSError, ValueError):
    return []
  return [
    n for n in names if isinstance(n, str) and not os.path.isabs(n) and ".." not in n.split(os.sep)
  ]


def _remove(workdir: str, name: str) -> None:
  target = os.path.join(workdir, name)
  if os.path.isdir(target) and not os.path.islink(target):
    shutil.rmtree(target, ignore_errors=True)
  elif os.path.lexists(target):
    os.remove(target)


def _write_manifest(workdir: str, names: Sequence[str]) -> None:
  atomic_write(os.path.join(workdir, MANIFEST), json.dumps(sorted(set(names)), indent=1))


def record_written(workdir: str, path: str) -> None:
  """Add ``path`` to ``workdir``'s manifest (before writing it: a kill in between leaves at
  most a listed path that does not exist)."""
  name = os.path.relpath(os.path.abspath(path), workdir)
  names = read_manifest(workdir)
  if name not in names:
    _write_manifest(workdir, names + [name])


def final_metrics(metrics: Mapping[str, np.ndarray]) -> Dict[str, Any]:
  """Every scalar metric at the last *evaluated* round (a last round that was not evaluated
  holds NaN), and that ``round``."""
  last = int(np.flatnonzero(metrics["evaluated"])[-1])
  final = {k: float(v[last]) for k, v in metrics.items() if np.ndim(v) == 1 and k != "evaluated"}
  final["round"] = last + 1
  return final


def evaluated_records(
  metrics: Mapping[str, np.ndarray],
  fields,
  *,
  keys: Optional[Sequence[str]] = None,
  finite_keys: Optional[Sequence[str]] = None,
  finite_only: bool = False,
) -> List[Dict[str, Any]]:
  """One ``metrics.jsonl`` record per evaluated round of a ``simulate`` result.

  Args:
    metrics: ``result.metrics`` (or a ``NonFiniteError``'s ``metrics``).
    fields: ``round -> dict`` of the run's own fields (algorithm, seed, ...), placed after
      ``round``.
    keys: the metrics to copy (default: every one except ``evaluated`` and ``clients`` whose
      per-round value is a scalar or a vector).
    finite_keys: the metrics that must be finite when ``finite_only`` (default: ``keys``).
    finite_only: stop at the first round where one of them is not finite (a diverged run).
  """
  out = []
  for r in np.flatnonzero(metrics["evaluated"]):
    chosen = (
      keys
      if keys is not None
      else [
        k for k, v in metrics.items() if k not in ("evaluated", "clients") and np.ndim(v[r]) <= 1
      ]
    )
    rec = {"round": int(r) + 1, **fields(int(r) + 1)}
    rec.update({k: metrics[k][r] for k in chosen})
    checked = chosen if finite_keys is None else finite_keys
    if finite_only and not all(np.all(np.isfinite(rec[k])) for k in checked):
      break
    out.append(rec)
  return out


def seed_statistics(
  finals: Mapping[str, Mapping[Any, Mapping[str, Any]]],
  keys: Sequence[str],
  *,
  label_key: str = "method",
):
  """Per-run mean and standard deviation over the seeds that did not diverge.

  Args:
    finals: ``{label: {seed: final values, or {"diverged": message, ...}}}``.
    keys: the final values to summarise (``None`` for one no seed reports).
    label_key: the table column naming the run.

  Returns:
    ``(per_run, table)``: ``per_run[label]`` holds ``per_seed``, ``diverged_seeds`` and, per
    key, ``{"mean", "std"}`` (``None`` when every seed diverged); ``table`` has one row per
    run for :func:`format_table`: each key as ``"mean +- std"`` over the finite seeds (the
    std only with more than one), and for a diverged run a ``note`` saying at which round,
    in which quantity, and which setting to change.
  """
  per_run, table = {}, []
  for label, by_seed in finals.items():
    ok = {s: f for s, f in by_seed.items() if "diverged" not in f}
    entry = {"per_seed": dict(by_seed), "diverged_seeds": sorted(set(by_seed) - set(ok))}
    row = {label_key: label}
    notes = sorted({str(f["diverged"]) for f in by_seed.values() if "diverged" in f})
    for k in keys:  # a key no seed reports (epsilon without privacy) summarises to None
      vals = [f[k] for f in ok.values()] if any(k in f for f in ok.values()) else []
      entry[k] = {
        "mean": float(np.mean(vals)) if vals else None,
        "std": float(np.std(vals)) if vals else None,
      }
      row[k] = mean_std(vals)
    if notes:  # e.g. "diverged at round 1 (client_weights); try a lower --config..."
      seeds = entry["diverged_seeds"]
      row["note"] = (f"{len(seeds)} of {len(by_seed)} seeds " if len(by_seed) > 1 else "") + (
        notes[0] if len(notes) == 1 else f"{notes[0]} (and {len(notes) - 1} more)"
      )
    per_run[label] = entry
    table.append(row)
  return per_run, table


def mean_std(values: Sequence[float]) -> Optional[str]:
  """``"0.8123 +- 0.0210"`` over ``values`` (``"0.8123"`` for one value, ``None`` for none)."""
  if not values:
    return None
  mean = float(np.mean(values))
  if len(values) == 1:
    return f"{mean:.4f}"
  return f"{mean:.4f} +- {float(np.std(values)):.4f}"


def run_checkpoint_dir(workdir: str, label: str, settings: Mapping[str, Any]) -> str:
  """``workdir/checkpoints/<label>-<hash of settings>``: one run's checkpoints.

  The hash covers every setting that shapes the run, so rerunning with the same flags
  resumes it and a changed setting starts afresh instead of resuming a different run.
  """
  digest = hashlib.sha256(dumps(dict(settings), sort_keys=True).encode()).hexdigest()[:12]
  safe = "".join(c if c.isalnum() or c in "-_=." else "_" for c in label)
  return os.path.join(workdir, CHECKPOINTS, f"{safe}-{digest}")


def file_digest(path, algorithm: str = "sha256", chunk: int = 1 << 20) -> str:
  """The hex digest of a file's bytes (``hashlib`` algorithm name): a data file's identity."""
  h = hashlib.new(algorithm)
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(chunk), b""):
      h.update(block)
  return h.hexdigest()


def read_jsonl(path) -> List[Dict[str, Any]]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


# ---- plots and tables --------------------------------------------------------------------


def figure(**kwargs):
  """A matplotlib ``Figure`` on the Agg canvas (no pyplot, no display, no global state)."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure

  fig = Figure(**kwargs)
  FigureCanvasAgg(fig)
  return fig


def _cell(value) -> str:
  value = to_jsonable(value)
  if isinstance(value, float):
    return f"{value:.4g}"
  if value is None:
    return "-"
  return str(value)


def format_table(rows: Sequence[Mapping[str, Any]], columns: Optional[Sequence[str]] = None) -> str:
  """Rows of dicts as an aligned plain-text table (floats to 4 significant digits)."""
  if columns is None:
    columns = list(dict.fromkeys(k for r in rows for k in r))
  cells = [[_cell(r.get(c)) for c in columns] for r in rows]
  widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
  line = lambda values: "  ".join(v.ljust(w) for v, w in zip(values, widths)).rstrip()
  out = [line(columns), line("-" * w for w in widths)]
  out += [line(row) for row in cells]
  return "\n".join(out)


def plot_mean_curves(
  ax,
  records: Sequence[Mapping[str, Any]],
  key: str,
  *,
  x: str = "round",
  labels: Optional[Sequence[str]] = None,
  band: Optional[float] = None,
  label_names=None,
  skip_missing: bool = False,
  group: str = "algorithm",
) -> List[str]:
  """One line per algorithm label: the mean of ``key`` over the records at each ``x`` value.

  The records (``metrics.jsonl``-style dicts with an ``"algorithm"`` field, one per seed and
  ``x`` value, say) of each label are grouped by ``x``; the line joins the means over each
  group, in increasing ``x``, and ``band`` adds a mean +- standard deviation band.

  Args:
    ax: the matplotlib axes to draw on.
    records: the records.
    key: the value to average (every record of a drawn label must hold it, unless
      ``skip_missing``).
    x: the x-axis field (``"round"``, ``"iteration"``, ...).
    labels: the labels to draw, in this order (default: every label, in order of first
      appearance in ``records``).
    band: the alpha of the +- std band, filled in the line's colour; ``None``: no band.
    label_names: the legend text of a label: a mapping (labels it lacks stand for
      themselves) or a callable; default: the label itself.
    skip_missing: leave out the records whose ``key`` is missing or ``None``.
    group: the record field naming a line (``"method"`` in config experiments).

  Returns:
    The labels drawn, in order.
  """
  if labels is None:
    labels = list(dict.fromkeys(r[group] for r in records))
  if label_names is None:
    name = lambda label: label
  elif callable(label_names):
    name = label_names
  else:
    name = lambda label: label_names.get(label, label)
  for label in labels:
    rows = [
      r for r in records if r[group] == label and (not skip_missing or r.get(key) is not None)
    ]
    xs = sorted({r[x] for r in rows})
    values = [[r[key] for r in rows if r[x] == t] for t in xs]
    mean = np.array([np.mean(v) for v in values])
    (line,) = ax.plot(xs, mean, label=name(label))
    if band is not None:
      std = np.array([np.std(v) for v in values])
      ax.fill_between(xs, mean - std, mean + std, color=line.get_color(), alpha=band)
  return list(labels)


LINESTYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*")


def distinguish(line, i: int) -> None:
  """Style the ``i``-th line of a panel apart from the others: its own line style and hollow
  marker, later lines thinner, so a line drawn over an equal one leaves it visible."""
  line.set(
    linestyle=LINESTYLES[i % len(LINESTYLES)],
    marker=MARKERS[i % len(MARKERS)],
    markerfacecolor="none",
    linewidth=max(0.8, 2.6 - 0.3 * i),
    markersize=max(3.0, 8.0 - 0.8 * i),
  )


def save_with_legend(
  wd: "Workdir", fig, legend_ax, name: str, *, legend: bool = True, **legend_kwargs
) -> str:
  """Put the legend on ``legend_ax`` (when ``legend``: say, when any line was drawn), lay
  ``fig`` out tightly and save it as ``name`` in ``wd``; returns the path."""
  if legend:
    legend_ax.legend(**legend_kwargs)
  fig.tight_layout()
  return wd.save_figure(fig, name)
