"""Client-level differential privacy of everything a client sends, with its accountant.

:func:`gaussian` describes the mechanism for a run (``fedco.simulate(..., privacy=...)``):

* every upload of every field the algorithm's communication plan sends (the model, FedDRO's
  per-step ``y``, Local-SCGDM's ``u`` and ``m``, q-FedAvg's and AFL's losses, ...) is
  clipped on the client to that field's L2 bound ``clip[field]``;
* Gaussian noise of standard deviation ``noise_multiplier * clip[field] * s`` is added where
  the server combines the uploads: to the weighted mean when that is all the server uses
  (``s`` = the largest averaging weight of the round: ``1 / m`` for uniform weights), and to
  each client's upload (``s = 1``) where the server reads every value (a ``round_start``
  statistic other than the mean, ``report`` fields, servers that are
  :class:`~fedco.algorithms.base.ServerAggregator` s).

Either way each message is a Gaussian mechanism of noise multiplier ``z`` on one client's
contribution, so the accountant needs only ``z``, the messages per round and the sampling
rate. A round's messages are :func:`messages_per_round` (one per field per round, ``I`` for
the ``every_step`` fields), all from the round's sampled clients, so the round is one
Poisson-subsampled composition at rate ``clients_per_round / K`` (the fixed-size sample is
accounted as Poisson at the same rate, as pfl-research and TensorFlow Federated do), and the
run composes ``rounds`` of them. :func:`epsilon_spent` evaluates that with
``dp_accounting``'s RDP accountant, and :func:`calibrate` bisects it for a target. Dropped clients and stragglers send less; they are
not credited (the count is the plan's, an upper bound).
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from typing import Dict, Mapping, Optional, Union

import numpy as np

from fedco import _validate


@dataclasses.dataclass(frozen=True)
class ClientDP:
  """A run's privacy mechanism (build it with :func:`gaussian`).

  Attributes:
    clip: the L2 bound per field name, or one bound for every field.
    noise_multiplier: ``z``; ``None`` until calibrated from ``epsilon``.
    epsilon: the target epsilon for the whole run (``None`` when ``noise_multiplier`` is
      given).
    delta: the run's delta.
    rounds: the rounds ``epsilon`` is calibrated for (``fedco.simulate`` fills in its own).
  """

  clip: Union[float, Mapping[str, float]]
  noise_multiplier: Optional[float] = None
  epsilon: Optional[float] = None
  delta: float = 1e-5
  rounds: Optional[int] = None

  def over(self, rounds: int) -> "ClientDP":
    """This mechanism for a run of ``rounds`` rounds: a target epsilon without ``rounds``
    is spent over them; one calibrated for other rounds warns that the run spends more
    or less (``metrics["epsilon"]`` says how much)."""
    if self.rounds is None:
      return dataclasses.replace(self, rounds=rounds)
    if self.epsilon is not None and self.rounds != rounds:
      warnings.warn(
        f"privacy's epsilon={self.epsilon} is calibrated for "
        f"rounds={self.rounds}, but this run has rounds={rounds}: it spends "
        f"{'more' if rounds > self.rounds else 'less'}; metrics['epsilon'] "
        f"says how much",
        stacklevel=3,
      )
    return self

  def clip_of(self, field: str) -> Optional[float]:
    if isinstance(self.clip, Mapping):
      return self.clip.get(field)
    return self.clip


def gaussian(
  clip,
  *,
  noise_multiplier: Optional[float] = None,
  epsilon: Optional[float] = None,
  delta: float = 1e-5,
  rounds: Optional[int] = None,
) -> ClientDP:
  """Clipping per field plus Gaussian noise, at a given ``noise_multiplier`` or calibrated
  to ``(epsilon, delta)`` over ``rounds`` (see the module).

  Args:
    clip: one L2 bound for every sent field, or ``{field: bound}`` naming every field the
      plan sends (``"params"`` and the plan's state fields).
    noise_multiplier: ``z >= 0`` (``0``: clipping only, epsilon infinite).
    epsilon: target epsilon of the whole run instead of ``noise_multiplier``.
    delta: the run's delta, in ``(0, 1)``.
    rounds: the rounds to calibrate ``epsilon`` for; ``fedco.simulate`` uses its own.
  """
  if isinstance(clip, Mapping):
    if not clip:
      raise ValueError("clip must name at least one field, got {}")
    clip = {str(k): _validate.positive(f"clip[{k!r}]", v) for k, v in clip.items()}
  else:
    clip = _validate.positive("clip", clip)
  if (noise_multiplier is None) == (epsilon is None):
    raise ValueError(
      "give exactly one of noise_multiplier and epsilon, got "
      f"noise_multiplier={noise_multiplier!r}, epsilon={epsilon!r}"
    )
  if noise_multiplier is not None:
    noise_multiplier = _validate.positive("noise_multiplier", noise_multiplier, allow_zero=True)
  if epsilon is not None:
    epsilon = _validate.positive("epsilon", epsilon)
  delta = _validate.open_unit("delta", delta)
  if rounds is not None:
    rounds = _validate.positive_int("rounds", rounds)
  return ClientDP(
    clip,
    None if noise_multiplier is None else float(noise_multiplier),
    None if epsilon is None else float(epsilon),
    float(delta),
    rounds,
  )


def messages_per_round(plan, fields=None) -> Dict[str, int]:
  """Messages each sampled client sends per round, by field: ``params`` and every
  ``every_round``, ``round_start`` and ``report`` field once, ``every_step`` fields
  ``local_steps`` times."""
  counts = {"params": 1}
  for f in tuple(plan.every_round) + tuple(plan.round_start) + tuple(plan.report):
    counts[f] = counts.get(f, 0) + 1
  for f in plan.every_step:
    counts[f] = counts.get(f, 0) + plan.local_steps
  return counts if fields is None else {f: counts[f] for f in fields}


@contextlib.contextmanager
def _quiet():
  """dp_accounting logs a warning for every fractional RDP order it skips; they say nothing
  a user can act on."""
  from absl import logging  # pylint: disable=g-import-not-at-top

  level = logging.get_verbosity()
  logging.set_verbosity(logging.ERROR)
  try:
    yield
  finally:
    logging.set_verbosity(level)


def round_event(noise_multiplier: float, sampling_rate: float, messages: int):
  """One round's ``dp_accounting`` event: ``messages`` Gaussian mechanisms of multiplier
  ``z``, all on the same Poisson sample of clients."""
  import dp_accounting  # pylint: disable=g-import-not-at-top

  gaussian_ = dp_accounting.GaussianDpEvent(noise_multiplier)
  composed = dp_accounting.ComposedDpEvent([gaussian_] * int(messages))
  if sampling_rate >= 1:
    return composed
  return dp_accounting.PoissonSampledDpEvent(sampling_rate, composed)


def init_event(noise_multiplier: float, messages: int):
  """The ``at_init`` means before round 1: ``messages`` Gaussian mechanisms over every
  client (no subsampling)."""
  import dp_accounting  # pylint: disable=g-import-not-at-top

  return dp_accounting.ComposedDpEvent(
    [dp_accounting.GaussianDpEvent(noise_multiplier)] * int(messages)
  )


def run_event(
  noise_multiplier: float,
  sampling_rate: float,
  messages: int,
  rounds: int,
  *,
  init_messages: int = 0,
):
  """The whole run's event: :func:`init_event` once, then :func:`round_event` composed
  ``rounds`` times."""
  import dp_accounting  # pylint: disable=g-import-not-at-top

  rounds_ = dp_accounting.SelfComposedDpEvent(
    round_event(noise_multiplier, sampling_rate, messages), int(rounds)
  )
  if not init_messages:
    return rounds_
  return dp_accounting.ComposedDpEvent([init_event(noise_multiplier, init_messages), rounds_])


def epsilon_spent(
  noise_multiplier: float,
  sampling_rate: float,
  messages: int,
  rounds,
  delta: float,
  *,
  init_messages: int = 0,
):
  """Epsilon after each of ``rounds`` (an int: a float; a sequence: an array), RDP; with
  ``init_messages`` Gaussian mechanisms of every client before round 1 (the ``at_init``
  means), not subsampled."""
  from dp_accounting import rdp  # pylint: disable=g-import-not-at-top

  scalar = np.ndim(rounds) == 0
  counts = np.atleast_1d(np.asarray(rounds, np.int64))
  if noise_multiplier == 0:
    out = np.where(counts > 0, np.inf, 0.0)
    return float(out[0]) if scalar else out
  with _quiet():
    accountant = rdp.RdpAccountant()
    accountant.compose(round_event(noise_multiplier, sampling_rate, messages), 1)
    orders = np.asarray(accountant._orders)  # pylint: disable=protected-access
    per_round = np.asarray(accountant._rdp)  # pylint: disable=protected-access
    at_init = np.zeros_like(per_round)
    if init_messages:
      first = rdp.RdpAccountant()
      first.compose(init_event(noise_multiplier, init_messages))
      at_init = np.asarray(first._rdp)  # pylint: disable=protected-access
    out = np.array(
      [
        rdp.rdp_privacy_accountant.compute_epsilon(orders, at_init + t * per_round, delta)[0]
        for t in counts
      ]
    )
  return float(out[0]) if scalar else out


def calibrate(
  epsilon: float,
  delta: float,
  sampling_rate: float,
  messages: int,
  rounds: int,
  *,
  init_messages: int = 0,
  rtol: float = 1e-6,
) -> float:
  """The smallest noise multiplier whose run spends at most ``epsilon`` (RDP), to a
  relative ``rtol``: bisection on ``z``, over which the spent epsilon decreases."""
  spent = lambda z: epsilon_spent(
    z, sampling_rate, messages, rounds, delta, init_messages=init_messages
  )
  low, high = 0.0, 1.0
  while spent(high) > epsilon:
    low, high = high, 2 * high
    if high > 1e6:
      raise ValueError(
        f"epsilon={epsilon} is out of reach for delta={delta} over {rounds} "
        f"rounds: even noise_multiplier=1e6 spends more"
      )
  while high - low > rtol * high:
    middle = 0.5 * (low + high)
    low, high = (middle, high) if spent(middle) > epsilon else (low, middle)
  return high


__all__ = [
  "ClientDP",
  "gaussian",
  "messages_per_round",
  "round_event",
  "init_event",
  "run_event",
  "epsilon_spent",
  "calibrate",
]
