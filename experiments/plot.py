r"""Regenerate plots from an experiment's ``metrics.jsonl``.

    python -m experiments.plot --workdir=runs/e1 --metrics=val_acc_avg,val_acc_worst

One panel per metric; one line per method (the mean over seeds, with a band of +- one
standard deviation when there are several); the x axis is ``--x`` (default ``round``).
Writes ``--out`` (default ``plot.png``) into the workdir, atomically.
"""

from __future__ import annotations

import os
import sys
from typing import Dict, List, Sequence

import numpy as np
from absl import app, flags

from experiments import common

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
  workdir = common.check_workdir(workdir)
  path = os.path.join(workdir, common.METRICS)
  if not os.path.exists(path):
    raise FileNotFoundError(f"--workdir has no {common.METRICS}: {path}")
  records = common.read_jsonl(path)
  if not records:
    raise ValueError(f"{path} holds no records to plot")
  available = numeric_fields(records, x)
  metrics = tuple(metrics) or tuple(available)
  unknown = [m for m in metrics if m not in available]
  if unknown:
    raise ValueError(f"--metrics: unknown {unknown}; available: {', '.join(available)}")
  if not out.endswith(".png") or os.sep in out:
    raise ValueError(f"--out must be a .png file name inside --workdir, got {out!r}")
  label = lambda r: r.get("method", r.get("algorithm", "run"))
  algorithms = sorted({label(r) for r in records})
  fig = common.figure(figsize=(5 * len(metrics), 3.8))
  axes = np.atleast_1d(fig.subplots(1, len(metrics)))
  for ax, metric in zip(axes, metrics):
    for alg in algorithms:
      rows = [
        r for r in records if label(r) == alg and isinstance(r.get(metric), (int, float)) and x in r
      ]
      xs = sorted({r[x] for r in rows})
      if not xs:
        continue
      values = [[r[metric] for r in rows if r[x] == t] for t in xs]
      mean = np.array([np.mean(v) for v in values])
      ax.plot(xs, mean, label=alg)
      if max(len(v) for v in values) > 1:
        std = np.array([np.std(v) for v in values])
        ax.fill_between(xs, mean - std, mean + std, alpha=0.2)
    ax.set_xlabel(x)
    ax.set_ylabel(metric)
    ax.set_title(metric)
    ax.grid(alpha=0.3)
    if log_y:
      ax.set_yscale("log")
  axes[0].legend()
  fig.tight_layout()
  return common.Workdir.save_figure_to(workdir, fig, out)


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
