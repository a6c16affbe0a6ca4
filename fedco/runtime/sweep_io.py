"""A sweep's host side (:func:`fedco.sweep`): each run's rows for the metric writers and
the progress bar's name and value (its checkpoints: :mod:`fedco.runtime.checkpoints`)."""

from __future__ import annotations

import itertools
from typing import Dict, Optional

import numpy as np

from fedco.runtime import host


def bar_name(labels, algorithm) -> str:
  """The progress bar's name: the runs' shared ``method`` label and seeds, when there are."""
  methods = {str(l.get("method")) for l in labels}
  if len(methods) == 1 and None not in (l.get("method") for l in labels):
    return f"{methods.pop()} seeds {','.join(str(l.get('seed')) for l in labels)}"
  return f"sweep of {len(labels)} {algorithm.name} runs"


class RunRows:
  """Each chunk's metrics per run, kept and streamed to the writers with each run's labels."""

  def __init__(self, labels, writers, count):
    self.labels, self.writers, self.count = labels, tuple(writers), count
    self.collected: Dict[str, np.ndarray] = {}

  def rewind(self):
    """The writers drop every run's rows and get the restored ones again."""
    for r, labels in enumerate(self.labels):
      rows = self._rows(r, self.collected, 0) if self.collected else []
      for writer in self.writers:
        writer.rewind(0, labels)
        if rows and writer.can_rewind:
          writer.write(rows)

  def _rows(self, r, metrics, first_round):
    rows = host.rows({k: v[r] for k, v in metrics.items()}, first_round, self.labels[r])
    return list(itertools.takewhile(host.finite_row, rows))

  def chunk(self, metrics, done, sim):
    metrics = {k: np.swapaxes(np.asarray(v), 0, 1)[: self.count] for k, v in metrics.items()}
    link = sim.config.uplink
    if link is not None and link.spends:  # as simulate's
      size = next(iter(metrics.values())).shape[1]
      metrics["epsilon"] = np.tile(
        link.epsilon(np.arange(done + 1, done + size + 1)), (self.count, 1)
      )
    rows = [row for r in range(self.count) for row in self._rows(r, metrics, done)]
    for writer in self.writers if rows else ():
      writer.write(rows)
    self.collected = (
      metrics
      if not self.collected
      else {k: np.concatenate([self.collected[k], metrics[k]], axis=1) for k in metrics}
    )

  def shown(self, name) -> Optional[float]:
    """The mean over runs of ``name``'s last finite evaluated value."""
    values = self.collected.get(name)
    if values is None or values.ndim != 2:
      return None
    evaluated = np.asarray(self.collected.get("evaluated", np.ones(values.shape, bool)))
    last = [
      v[e & np.isfinite(v)][-1] for v, e in zip(values, evaluated) if np.any(e & np.isfinite(v))
    ]
    return float(np.mean(last)) if last else None
