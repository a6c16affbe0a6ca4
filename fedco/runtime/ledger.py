"""What a run sent: floats per client per round by item, and run totals under faults."""

from __future__ import annotations

from typing import Any, Dict, NamedTuple

import jax
import numpy as np


class Ledger(NamedTuple):
  """Floats each participating client sends (up) and receives (down) per round, by item.

  ``per_step_up`` are the items sent after every local step (FedDRO's ``y``), counted in
  ``up`` for a full round of ``local_steps``; a straggler sends them only for the steps it
  did, and a dropped client sends nothing up (:meth:`as_dict` with the run's fault record).
  """
  up: Dict[str, int]
  down: Dict[str, int]
  clients_per_round: int
  per_step_up: Dict[str, int] = {}
  local_steps: int = 1

  def per_round(self) -> Dict[str, int]:
    """Total floats over all participating clients in one round, both directions."""
    return {"up": self.clients_per_round * sum(self.up.values()),
            "down": self.clients_per_round * sum(self.down.values())}

  def as_dict(self, rounds: int, survivors=None, local_steps=None) -> Dict[str, Any]:
    """Per-client items and run totals; ``survivors`` (``bool [rounds, m]``) and
    ``local_steps`` (``[rounds, m]``, steps each client did) count only what was sent."""
    totals = self.per_round()
    total_up, total_down = totals["up"] * rounds, totals["down"] * rounds
    if survivors is not None:
      alive = np.asarray(survivors, bool)
      steps = np.where(alive, np.asarray(local_steps), 0)
      per_step = sum(self.per_step_up.values())
      per_round = sum(self.up.values()) - self.local_steps * per_step
      total_up = int(alive.sum()) * per_round + int(steps.sum()) * per_step
      total_down = alive.size * sum(self.down.values())
    return {"up_per_client_per_round": dict(self.up),
            "down_per_client_per_round": dict(self.down),
            "clients_per_round": self.clients_per_round,
            "rounds": rounds,
            "total_up": int(total_up),
            "total_down": int(total_down)}

  def run_totals(self, rounds: int, metrics: Dict[str, Any]) -> Dict[str, Any]:
    """:meth:`as_dict` with a run's fault record from its metrics (``survivors``,
    ``local_steps``; absent without faults)."""
    return self.as_dict(rounds, metrics.get("survivors"), metrics.get("local_steps"))


def _tree_size(tree) -> int:
  return int(sum(np.prod(np.shape(leaf)) for leaf in jax.tree.leaves(tree)))
