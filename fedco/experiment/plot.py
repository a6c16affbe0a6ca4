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


def plot(workdir, metrics=(), x="round", out="plot.png", log_y=False) -> str:
  """Draws the figure and returns its path; ``ValueError``/``FileNotFoundError`` on bad input."""
  workdir = outputs.check_workdir(workdir)
  path = os.path.join(workdir, outputs.METRICS)
  running = os.path.join(workdir, outputs.STAGING, outputs.METRICS)
  complete = os.path.exists(path)
  path = path if complete else running  # no complete results yet: the running run's rows
  if not os.path.exists(path):
    raise FileNotFoundError(
      f"--workdir has no {outputs.METRICS}, nor {outputs.STAGING}/{outputs.METRICS} of a run "
      f"still going: {workdir}"
    )
  records = outputs.read_jsonl(path)
  if not records:
    raise ValueError(f"{path} holds no records to plot")
  available = numeric_fields(records, x)
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
  labels = sorted({r["method"] for r in rows})
  if x != "round":  # outputs.curves draws against rounds: the x field takes their place
    rows = [{**r, "round": r[x]} for r in rows]
  finals = None  # runs that diverged are left out, as in the table (summary.json says which)
  summary = os.path.join(workdir, outputs.SUMMARY)
  if complete and os.path.exists(summary):  # (beside in_progress/ rows: an earlier run's)
    try:
      with open(summary) as f:
        methods = json.load(f).get("methods", {})
      finals = {label: entry.get("per_seed", {}) for label, entry in methods.items()}
    except (OSError, ValueError, AttributeError):
      pass
  panels = [(m, m, "log") if log_y else (m, m) for m in metrics]
  fig = outputs.curves(rows, labels, panels, x=x, finals=finals)
  return outputs.Workdir.save_figure_to(workdir, fig, out)


def main(argv):
  del argv
  try:
    print(plot(FLAGS.workdir, FLAGS.metrics, FLAGS.x, FLAGS.out, FLAGS.log_y))
  except (ValueError, FileNotFoundError) as err:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  define_flags()
  app.run(main)
