"""What a run sent: floats and bytes per client per round by item, and run totals under
faults; with ``privacy``, the mechanism and the epsilon spent."""

from __future__ import annotations

from typing import Any, Dict, NamedTuple, Optional

import jax
import numpy as np


class Ledger(NamedTuple):
  """Floats each participating client sends (up) and receives (down) per round, by item.

  :meth:`fedco.Simulator.ledger` builds it from the algorithm's communication plan;
  :func:`fedco.simulate` returns :meth:`as_dict` of it with the run's totals as
  ``SimulationResult.ledger``. An item is ``"params"`` or a state field the plan sends
  (FedDRO's ``y``). ``per_step_up`` are the items sent after every local step (FedDRO's
  ``y``), counted in ``up`` for a full round of ``local_steps``; a straggler sends them only
  for the steps it did, and a dropped client sends nothing up (:meth:`as_dict` with the
  run's fault record). ``up_bytes`` / ``down_bytes`` are the same in bytes: a compressed
  field costs its codec's bits (:mod:`fedco.compression`), any other its floats' size.

  Attributes:
    up: ``{item: floats}`` one client sends per round.
    down: ``{item: floats}`` one client receives per round.
    clients_per_round: ``m``, the clients sampled each round.
    per_step_up: ``{item: floats}`` of the items sent after every local step (one step's
      worth; empty by default).
    local_steps: ``I``, the local steps of a full round (default 1).
    up_bytes: ``{item: bytes}`` one client sends per round (empty: not counted).
    down_bytes: ``{item: bytes}`` one client receives per round.
    per_step_up_bytes: ``{item: bytes}`` of one step's ``per_step_up`` message.
    uplink: what describes the codecs and the privacy mechanism (``None`` without them).

  Examples:
    FedDRO's plan with 2 local steps on a 2-dimensional model and a 4-dimensional inner
    value: ``y`` goes up and down after every step, the model once a round. In round 2 of 3
    one client dropped out and one straggler did a single step:

    >>> import numpy as np
    >>> from fedco.runtime import Ledger
    >>> ledger = Ledger(
    ...   {"params": 2, "y": 8}, {"params": 2, "y": 8}, 4, per_step_up={"y": 4}, local_steps=2
    ... )
    >>> ledger.per_round()
    {'up': 40, 'down': 40}
    >>> ledger.as_dict(rounds=3)["total_up"]
    120
    >>> survivors = np.array([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1]], bool)
    >>> steps = np.array([[2, 2, 2, 2], [2, 1, 2, 0], [2, 2, 2, 2]])
    >>> ledger.as_dict(3, survivors, steps)["total_up"]  # 11 x 2 + 21 steps x 4
    106
  """

  up: Dict[str, int]
  down: Dict[str, int]
  clients_per_round: int
  per_step_up: Dict[str, int] = {}
  local_steps: int = 1
  up_bytes: Dict[str, float] = {}
  down_bytes: Dict[str, float] = {}
  per_step_up_bytes: Dict[str, float] = {}
  uplink: Optional[Dict[str, Any]] = None

  def per_round(self) -> Dict[str, int]:
    """Total floats over all participating clients in one round, both directions."""
    return {
      "up": self.clients_per_round * sum(self.up.values()),
      "down": self.clients_per_round * sum(self.down.values()),
    }

  def _totals(self, per_client_up, per_step_up, per_client_down, rounds, survivors, local_steps):
    """Run totals of one unit (floats or bytes) over participating clients."""
    total_up = self.clients_per_round * sum(per_client_up.values()) * rounds
    total_down = self.clients_per_round * sum(per_client_down.values()) * rounds
    if survivors is not None:
      alive = np.asarray(survivors, bool)
      done = self.local_steps if local_steps is None else np.asarray(local_steps)
      steps = np.where(alive, done, 0)
      per_step = sum(per_step_up.values())
      per_round = sum(per_client_up.values()) - self.local_steps * per_step
      total_up = int(alive.sum()) * per_round + int(steps.sum()) * per_step
      total_down = alive.size * sum(per_client_down.values())
    return total_up, total_down

  def as_dict(self, rounds: int, survivors=None, local_steps=None) -> Dict[str, Any]:
    """Per-client items and run totals over ``rounds`` rounds.

    Args:
      rounds: the run's rounds.
      survivors: ``bool [rounds, m]``, which sampled clients survived each round (``None``:
        all); with it only what was sent counts.
      local_steps: ``[rounds, m]``, the local steps each client did (with ``survivors``).

    Returns:
      ``{"up_per_client_per_round", "down_per_client_per_round", "clients_per_round",
      "rounds", "total_up", "total_down"}``, with the ``bytes_*`` and ``total_bytes_*``
      counterparts when bytes are counted and ``"uplink"`` (with the ``epsilon`` spent
      under noise) when there is one.
    """
    total_up, total_down = self._totals(
      self.up, self.per_step_up, self.down, rounds, survivors, local_steps
    )
    out: Dict[str, Any] = {
      "up_per_client_per_round": dict(self.up),
      "down_per_client_per_round": dict(self.down),
      "clients_per_round": self.clients_per_round,
      "rounds": rounds,
      "total_up": int(total_up),
      "total_down": int(total_down),
    }
    if self.up_bytes:
      bytes_up, bytes_down = self._totals(
        self.up_bytes, self.per_step_up_bytes, self.down_bytes, rounds, survivors, local_steps
      )
      out.update(
        bytes_up_per_client_per_round=dict(self.up_bytes),
        bytes_down_per_client_per_round=dict(self.down_bytes),
        total_bytes_up=float(bytes_up),
        total_bytes_down=float(bytes_down),
      )
    if self.uplink is not None:
      out["uplink"] = dict(self.uplink)
      if self.uplink.get("noise_multiplier"):  # 0: clipping only, no epsilon
        from fedco import privacy  # pylint: disable=g-import-not-at-top

        u = self.uplink
        if u.get("mechanism") == "dp_ftrl":
          out["uplink"]["epsilon"] = privacy.tree_epsilon_spent(
            u["noise_multiplier"], u["rounds_per_tree"], rounds, u["delta"]
          )
          return out
        out["uplink"]["epsilon"] = privacy.epsilon_spent(
          u["noise_multiplier"],
          u["sampling_rate"],
          sum(u["messages_per_round"].values()),
          rounds,
          u["delta"],
          init_messages=u["messages_at_init"],
          accountant=u.get("accountant", "rdp"),
        )
    return out

  def run_totals(self, rounds: int, metrics: Dict[str, Any]) -> Dict[str, Any]:
    """:meth:`as_dict` with a run's fault record from its metrics (``survivors``,
    ``local_steps``; absent without faults)."""
    return self.as_dict(rounds, metrics.get("survivors"), metrics.get("local_steps"))


def tree_size(tree) -> int:
  return int(sum(np.prod(np.shape(leaf)) for leaf in jax.tree.leaves(tree)))
