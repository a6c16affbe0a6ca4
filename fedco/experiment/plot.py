r"""Regenerate plots from an experiment's ``metrics.jsonl``.

    python -m fedco.experiment.plot --workdir=runs/e1 --metrics=val_acc_avg,val_acc_worst

One panel per metric; one line per method (the mean over seeds, with a band of +- one
standard deviation when there are several, runs that diverged left out as in the table);
the x axis is ``--x`` (default ``round``). A workdir without complete results yet (a run
still going, or stopped) is drawn from the rows its run has written so far
(``in_progress/metrics.jsonl``). Writes ``--out`` (default ``plot.png``) into the workdir,
atomically.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Dict, List, Sequence

from absl import app, flags

from fedco import _startup
from fedco.experiment import outputs

FLAGS = flags.FLAGS


def define_flags():
  flags.DEFINE_string("workdir", None, "An experiment's output directory.")
  flags.DEFINE_list("metrics", [], "Metrics to plot (default: every numeric one).")
  flags.DEFINE_string("x", "round", "The x-axis field.")
  flags.DEFINE_string("out", "plot.png", "Output file name inside --workdir.")
  flags.DEFINE_bool("log_y", False, "Logarithmic y axis.")


def numeric_fields(records: Sequence[Dict], x: str) -> List[str]:
  skip = {x, "seed", "round", "step"}
  fields = []
  for r in records:
    for k, v in r.items():
      if (
        k not in skip
        and k not in fields
        and isinstance(v, (int, float))
        and not isinstance(v, bool)
      ):
        fields.append(k)
  return fields


class NothingToDraw(ValueError):
  """A workdir without a row to draw (no run has evaluated a round yet, or every run
  diverged before its first evaluation): one line, no figure."""


def plot(workdir, metrics=(), x="round", out="plot.png", log_y=False) -> str:
  """Draws the figure and returns its path; ``ValueError``/``FileNotFoundError`` on bad input,
  :class:`NothingToDraw` (a ``ValueError``) for a workdir without rows to draw.

  Any workdir the driver leaves works: complete results, a run still going or stopped
  (``in_progress/`` rows, a last row cut short by a kill left out), runs that all diverged.
  """
  workdir = outputs.check_workdir(workdir)
  if not os.path.isdir(workdir):
    raise FileNotFoundError(f"--workdir={workdir!r} is not a directory")
  path = os.path.join(workdir, outputs.METRICS)
  running = os.path.join(workdir, outputs.STAGING, outputs.METRICS)
  complete = os.path.exists(path)
  path = path if complete else running  # no complete results yet: the running run's rows
  records = outputs.read_jsonl(path, partial_last=True) if os.path.exists(path) else []
  summary = os.path.join(workdir, outputs.SUMMARY)
  finals = None  # runs that diverged are left out, as in the table (summary.json says which)
  if os.path.exists(summary) and (complete or not os.path.isdir(os.path.dirname(running))):
    try:  # (beside in_progress/ rows: an earlier run's)
      with open(summary) as f:
        methods = json.load(f).get("methods", {})
      finals = {label: entry.get("per_seed", {}) for label, entry in methods.items()}
    except (OSError, ValueError, AttributeError):
      pass
  if not records:
    raise NothingToDraw(_nothing(workdir, finals))
  available = numeric_fields(records, x)
  if not available:
    raise NothingToDraw(f"nothing to draw in {workdir}: {path} holds no numeric metric")
  metrics = tuple(metrics) or tuple(available)
  unknown = [m for m in metrics if m not in available]
  if unknown:
    raise ValueError(f"--metrics: unknown {unknown}; available: {', '.join(available)}")
  if not out.endswith(".png") or os.sep in out:
    raise ValueError(f"--out must be a .png file name inside --workdir, got {out!r}")
  rows = [
    {**r, "method": r.get("method", r.get("algorithm", "run"))}
    for r in records
    if isinstance(r.get(x), (int, float))
  ]
  if not rows:
    raise NothingToDraw(f"nothing to draw in {workdir}: no row of {path} has a number in {x!r}")
  labels = sorted({r["method"] for r in rows})
  if x != "round":  # outputs.curves draws against rounds: the x field takes their place
    rows = [{**r, "round": r[x]} for r in rows]
  panels = [(m, m, "log") if log_y else (m, m) for m in metrics]
  fig = outputs.curves(rows, labels, panels, x=x, finals=finals)
  return outputs.Workdir.save_figure_to(workdir, fig, out)


def _nothing(workdir: str, finals) -> str:
  """Why a workdir has no row to draw, in one line."""
  diverged = [
    label
    for label, by_seed in (finals or {}).items()
    if by_seed and all(isinstance(f, dict) and "diverged" in f for f in by_seed.values())
  ]
  if finals is not None and diverged and len(diverged) == len(finals):
    why = f"every run diverged before its first evaluation ({', '.join(diverged)}: summary.json)"
  elif os.path.isdir(os.path.join(workdir, outputs.STAGING)):
    why = (
      f"the run in {outputs.STAGING}/ has written no metrics rows yet (rows come at each "
      "evaluated round; a run that diverged writes none past its divergence)"
    )
  else:
    why = f"it holds no {outputs.METRICS} (is it an experiment's --workdir?)"
  return f"nothing to draw in {workdir}: {why}"


def main(argv):
  del argv
  _startup.end()  # started: a Ctrl-C from here is handled below
  try:
    print(plot(FLAGS.workdir, FLAGS.metrics, FLAGS.x, FLAGS.out, FLAGS.log_y))
  except (ValueError, FileNotFoundError) as err:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(1)
  except KeyboardInterrupt:
    print(
      "interrupted: no figure written (figures are written whole or not at all)", file=sys.stderr
    )
    sys.exit(130)


if __name__ == "__main__":
  define_flags()
  app.run(main)
