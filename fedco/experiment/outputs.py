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
import shlex
import shutil
import sys
import textwrap
import weakref
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from fedco import extend
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


# ---- the machine a run went on -----------------------------------------------------------


def command_line() -> str:
  """The command that started this process, as a user retypes it, for the results it writes
  (a run's ``summary.json``, a merged JSON's ``commands``; decision 118).

  Returns:
    ``python`` for the interpreter's path, then the arguments as given
    (``python -m experiments.main --config=...``), quoted for a shell.

  Examples:
    >>> from fedco.experiment import outputs
    >>> outputs.command_line().startswith("python")
    True
  """
  return shlex.join(["python", *sys.orig_argv[1:]])


def machine_info() -> Dict[str, Any]:
  """The machine a run went on, for its ``summary.json`` (results carry their machine).

  Returns:
    ``platform``, ``cpu_model`` (``/proc/cpuinfo``'s model name), ``cpu_count``,
    ``mem_total_gib``, ``python``, ``jax``, ``jaxlib``, ``default_backend``, ``devices``
    and ``load_average`` (1, 5, 15 minutes: other work on a shared machine slows a run).

  Examples:
    >>> from fedco.experiment import outputs
    >>> info = outputs.machine_info()
    >>> info["default_backend"] in ("cpu", "gpu", "tpu"), info["cpu_count"] >= 1
    (True, True)
  """
  import platform  # pylint: disable=g-import-not-at-top

  import jax  # pylint: disable=g-import-not-at-top
  import jaxlib  # pylint: disable=g-import-not-at-top

  return {
    "platform": platform.platform(),
    "cpu_model": _proc_field("/proc/cpuinfo", "model name") or platform.processor(),
    "cpu_count": os.cpu_count(),
    "mem_total_gib": _mem_total_gib(),
    "python": platform.python_version(),
    "jax": jax.__version__,
    "jaxlib": jaxlib.__version__,
    "default_backend": jax.default_backend(),
    "devices": [f"{d.platform}:{d.id} {d.device_kind}" for d in jax.devices()],
    "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
  }


def _proc_field(path: str, name: str) -> Optional[str]:
  """The value of the first ``name: value`` line of a ``/proc`` file (``None``: absent)."""
  try:
    with open(path) as f:
      for line in f:
        if line.startswith(name):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return None


def _mem_total_gib() -> Optional[float]:
  total = _proc_field("/proc/meminfo", "MemTotal")  # "24684420 kB"
  return round(int(total.split()[0]) / 2**20, 2) if total else None


# ---- flag checks (one-line errors; numbers: fedco.extend.positive, positive_int, bounded) -


def check_int_list(name, values, minimum, *, distinct: bool = False) -> tuple:
  """A non-empty comma list (or sequence) of integers ``>= minimum`` (distinct if asked)."""
  try:
    out = tuple(extend.positive_int(name, v, minimum=minimum) for v in values)
  except TypeError:
    raise ValueError(f"{name} must be a comma list of integers, got {values!r}") from None
  if not out or (distinct and len(set(out)) != len(out)):
    raise ValueError(f"{name} must list {'distinct ' * distinct}integers, got {values!r}")
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

  Examples:
    >>> import os, tempfile
    >>> from fedco import experiment
    >>> path = tempfile.mkdtemp()
    >>> wd = experiment.Workdir(path)
    >>> _ = wd.write_config({"rounds": 3})
    >>> os.listdir(os.path.join(path, "in_progress"))  # until the summary
    ['config.json']
    >>> _ = wd.write_summary({"table": []})
    >>> sorted(n for n in os.listdir(path) if not n.startswith("."))
    ['config.json', 'summary.json']
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
    # ``fedco.experiment.plot`` writes PNGs here without the lock; ours go to in_progress/.)
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

  def save_figure(self, fig, name: str, *, dpi: int = 120) -> str:
    """Save a matplotlib figure as PNG, atomically (``name`` ends in ``.png``)."""
    if not isinstance(name, str) or not name.endswith(".png") or os.sep in name:
      raise ValueError(f"a figure's name must be a file name ending in .png, got {name!r}")
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


def changed_config(wd: Workdir, config: Mapping[str, Any]) -> List[str]:
  """The dotted fields in which ``config`` differs from the ``config.json`` of the
  workdir's last complete run (``[]`` when there is none or it is the same); a group only
  one of them has (a method left out by ``--methods``) is named once."""
  try:
    with open(os.path.join(wd.path, CONFIG)) as f:
      before = json.load(f)
  except (OSError, ValueError):
    return []

  def flat(value, prefix=""):
    if isinstance(value, Mapping):
      return {k: v for key, item in value.items() for k, v in flat(item, f"{prefix}{key}.").items()}
    return {prefix[:-1]: value}

  old, new = flat(before), flat(json.loads(dumps(config)))

  def named(key):  # "methods.scaffold" for every field of a method only one run has
    parts = key.split(".")
    for n in range(1, len(parts)):
      prefix = ".".join(parts[:n]) + "."
      if not all(any(k.startswith(prefix) for k in side) for side in (old, new)):
        return prefix[:-1]
    return key

  differ = (k for k in set(old) | set(new) if old.get(k, _ABSENT) != new.get(k, _ABSENT))
  return sorted({named(k) for k in differ})


_ABSENT = object()


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
  labels: Mapping[str, Any],
  *,
  keys: Optional[Sequence[str]] = None,
  finite_only: bool = False,
) -> List[Dict[str, Any]]:
  """One ``metrics.jsonl`` record per evaluated round of a ``simulate`` result.

  Args:
    metrics: ``result.metrics`` (or a ``NonFiniteError``'s ``metrics``).
    labels: the run's own fields (method, seed), placed after ``round``.
    keys: the metrics to copy (default: every one except ``evaluated`` and ``clients`` whose
      per-round value is a scalar or a vector).
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
    rec = {"round": int(r) + 1, **labels, **{k: metrics[k][r] for k in chosen}}
    if finite_only and not all(np.all(np.isfinite(rec[k])) for k in chosen):
      break
    out.append(rec)
  return out


def seed_statistics(
  finals: Mapping[str, Mapping[Any, Mapping[str, Any]]],
  keys: Sequence[str],
):
  """Per-run mean and standard deviation over the seeds that did not diverge.

  Args:
    finals: ``{label: {seed: final values, or {"diverged": message, ...}}}``.
    keys: the final values to summarise (``None`` for one no seed reports).

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
    row: Dict[str, Any] = {"method": label}
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


def standard_error(values: Union[Sequence[float], np.ndarray]) -> Optional[float]:
  """The standard error of the mean of ``values``, ``std(ddof=1) / sqrt(n)``: the error
  every table over seeds and every seed-paired difference reports (``None`` for fewer than
  two values).

  Examples:
    >>> from fedco.experiment import outputs
    >>> outputs.standard_error([1.0, 2.0, 3.0])  # std 1 over sqrt(3)
    0.5773502691896258
    >>> outputs.standard_error([1.0]) is None
    True
  """
  v = np.asarray(values, np.float64)
  return float(v.std(ddof=1) / np.sqrt(v.size)) if v.size > 1 else None


def mean_and_stderr(values: Union[Sequence[float], np.ndarray]) -> Dict[str, Any]:
  """``{"mean", "stderr"}`` of ``values``: one cell of a table over seeds (the standard
  error by :func:`standard_error`, ``None`` for one value).

  Examples:
    >>> from fedco.experiment import outputs
    >>> outputs.mean_and_stderr([1.0, 2.0, 3.0])
    {'mean': 2.0, 'stderr': 0.5773502691896258}
  """
  v = np.asarray(values, np.float64)
  return {"mean": float(v.mean()), "stderr": standard_error(v)}


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


def read_jsonl(path, *, partial_last: bool = False) -> List[Dict[str, Any]]:
  """The records of a JSON-lines file; ``ValueError`` naming the file and line of one that
  is not a JSON object. ``partial_last``: a last line that does not parse (a write that a
  kill cut short) is left out instead."""
  with open(path) as f:
    lines = [(i, line) for i, line in enumerate(f, 1) if line.strip()]
  records = []
  for i, line in lines:
    try:
      record = json.loads(line)
    except ValueError:
      record = None
    if not isinstance(record, dict):
      if partial_last and i == lines[-1][0]:
        break
      raise ValueError(f"{path}: line {i} is not a JSON object: {line.strip()[:60]!r}")
    records.append(record)
  return records


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


LINESTYLES = ("-", "--", "-.", ":")
MAX_COLUMNS = 4  # curves' panels per row by default: 12 panels are 3 rows of 4
MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*")


def _spread(values: np.ndarray, band: str) -> float:
  """``curves``' band half-width: the std, or the standard error (0 with one value)."""
  if band == "std":
    return float(values.std())
  return standard_error(values) or 0.0


def curves(
  records: Sequence[Mapping[str, Any]],
  labels: Sequence[str],
  panels: Sequence[tuple],
  *,
  title: str = "",
  x: str = "round",
  x_key: Optional[str] = None,
  steps: Optional[Mapping[str, int]] = None,
  finals: Optional[Mapping[str, Mapping[Any, Mapping[str, Any]]]] = None,
  notes: Mapping[str, str] = {},
  hlines: Mapping[str, float] = {},
  ncols: Optional[int] = None,
  band: str = "std",
):
  """An experiment's figure: one panel per metric, one line per method against rounds.

  Each line is the mean over seeds of the method's rows (``metrics.jsonl``-style: ``method``,
  ``seed``, ``round``, metrics) with a +- std band (``band="stderr"``: +- the standard
  error of the mean, the sample std over the square root of the seeds), in its own line style and with markers at
  staggered points, so methods that coincide stay visible. Runs that diverged
  (``finals[label][seed]`` holds ``diverged``) are left out, as in the table: their last
  rows before the divergence would set the axis; the legend says where they diverged. A
  panel whose values are all 0 (or none finite) holds no flat lines but a sentence saying so
  (``notes[key]``: why).

  Args:
    records: the rows.
    labels: the methods in legend order; one with a diverged run is named with the round it
      diverged at (``finals[label][seed]["diverged_round"]``).
    panels: ``(metric, y label)`` pairs, or ``(metric, y label, "log")`` for a logarithmic
      axis (values ``<= 0`` left out), in ``ncols`` columns (default: one row of up to
      four panels; more in rows of at most four, as even as they go: 12 are 3 rows of 4).
    title: the panels' title prefix (``"<title>: <y label>"``).
    x: the x axis: ``"round"``, or with ``steps`` (``{label: local steps per round}``) the
      name of ``round * steps``, say ``"meta-iteration (round x local_steps)"``.
    x_key: a record key to draw against instead (``"time"``: the simulated clock), its
      mean over the seeds at each round.
    steps, finals, notes: see above. hlines: ``{metric: y}`` dotted reference lines.
    band: ``"std"`` (the default) or ``"stderr"``.

  Returns:
    The ``Figure``, laid out, with the legend on the first panel holding a line.

  Examples:
    >>> from fedco import experiment
    >>> rows = [{"method": "fedavg", "seed": s, "round": r, "loss": 1.0 / r + s}
    ...         for s in (0, 1) for r in (1, 2, 3)]
    >>> fig = experiment.curves(rows, ["fedavg"], [("loss", "training loss")], title="demo")
    >>> [ax.get_title() for ax in fig.axes]
    ['demo: training loss']
  """
  from matplotlib.ticker import MaxNLocator  # pylint: disable=g-import-not-at-top

  if band not in ("std", "stderr"):
    raise ValueError(f"band must be 'std' or 'stderr', got {band!r}")
  for panel in panels:
    if len(panel) not in (2, 3) or panel[2:] not in ((), ("log",)):
      raise ValueError(
        f"panels: each is (metric, y label) or (metric, y label, 'log'), got {panel!r}"
      )
  at = (lambda r: r["round"] * steps[r["method"]]) if steps else (lambda r: r["round"])
  lost = {  # (label, seed) of the runs that diverged; seeds as str: summary.json's keys
    (label, str(seed)): f
    for label, by in (finals or {}).items()
    for seed, f in by.items()
    if "diverged" in f
  }
  records = [r for r in records if (r["method"], str(r.get("seed"))) not in lost]
  names = {label: _named(label, lost, len((finals or {}).get(label, ()))) for label in labels}
  drawn = [label for label in labels if any(r["method"] == label for r in records)]
  if not panels:
    raise ValueError("panels: at least one (metric, y label) to draw")
  ncols = ncols or -(-len(panels) // -(-len(panels) // MAX_COLUMNS))  # even rows
  nrows = -(-len(panels) // ncols)
  fig = figure(figsize=(5 * ncols, 4 * nrows))
  axes = np.atleast_1d(fig.subplots(nrows, ncols)).ravel()
  for ax in axes[len(panels) :]:  # the grid's last row, where it is not full
    ax.remove()
  axes = axes[: len(panels)]
  for ax, (key, ylabel, *scale) in zip(axes, panels):
    log = scale == ["log"]
    ax.set(xlabel=x, ylabel=ylabel, yscale="log" if log else "linear")
    # wrapped to the panel's width: a long title would run into the next panel's
    ax.set_title(textwrap.fill(f"{title}: {ylabel}" if title else ylabel, 62), fontsize=9)
    if x_key is None:
      ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    rows = [r for r in records if r["method"] in drawn and _finite(r.get(key))]
    if not any(r[key] > 0 if log else r[key] for r in rows):  # nothing, or flat lines
      text = f"{ylabel}: " + (
        ("no positive value for a log axis" if log else "0 for every method at every evaluation")
        if rows
        else "no finite evaluation"
      )
      ax.text(
        0.5,
        0.5,
        textwrap.fill(notes.get(key, text) if rows else text, 55),
        transform=ax.transAxes,
        ha="center",
        va="center",
        fontsize=8,
      )
      continue
    for i, label in enumerate(drawn):
      own = [r for r in rows if r["method"] == label]
      xs = sorted({at(r) for r in own})
      by_x = [np.array([r[key] for r in own if at(r) == t], np.float64) for t in xs]
      mean = np.array([v.mean() for v in by_x])
      spread = np.array([_spread(v, band) for v in by_x])
      if x_key is not None:  # each round at its seeds' mean of x_key
        xs = [np.mean([r[x_key] for r in own if at(r) == t]) for t in xs]
      shown = (lambda a: np.where(a > 0, a, np.nan)) if log else (lambda a: a)  # no log of 0
      every = max(1, len(xs) // 10)
      (line,) = ax.plot(
        xs,
        shown(mean),
        label=names[label],
        linestyle=LINESTYLES[i % len(LINESTYLES)],
        marker=MARKERS[i % len(MARKERS)],
        markerfacecolor="none",
        linewidth=max(0.8, 2.6 - 0.3 * i),
        markersize=max(3.0, 7.0 - 0.6 * i),
        markevery=(i * every // len(drawn), every),
      )
      edges = shown(mean - spread), shown(mean + spread)
      ax.fill_between(xs, *edges, color=line.get_color(), alpha=0.15)
    if key in hlines:
      ax.axhline(hlines[key], color="k", lw=0.8, ls=":")
  legend = next((ax for ax in axes if ax.lines), axes[0])
  for label in labels:
    if label not in drawn:
      name = names[label] if names[label] != label else f"{label} (no finite evaluation)"
      legend.plot([], [], linestyle="none", marker="x", color="black", label=name)
  if legend.lines:
    legend.legend(fontsize=8)
  fig.tight_layout()
  return fig


def _named(label: str, lost: Mapping[tuple, Mapping[str, Any]], seeds: int) -> str:
  """``label``, with where its runs diverged: ``"sgd (diverged at round 3 on 1 of 2 seeds)"``
  (``seeds``: how many the method ran; ``"sgd (diverged at round 3)"`` when all diverged)."""
  mine = [f for (name, _), f in lost.items() if name == label]
  if not mine:
    return label
  rounds = sorted(f["diverged_round"] for f in mine if "diverged_round" in f)
  where = f"diverged at round {rounds[0]}" if rounds else "diverged"
  return f"{label} ({where}{f' on {len(mine)} of {seeds} seeds' if len(mine) < seeds else ''})"


def _finite(value) -> bool:
  """Whether ``value`` is one finite number (not ``None``, not a vector)."""
  try:
    return value is not None and np.ndim(value) == 0 and bool(np.isfinite(value))
  except TypeError:
    return False
