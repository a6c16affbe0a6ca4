r"""Client-level differential privacy of everything a client sends, with its accountant.

:func:`gaussian` describes the mechanism for a run (``fedco.simulate(..., privacy=...)``):

* every upload of every field the algorithm's communication plan sends (the model, FedDRO's
  per-step ``y``, Local-SCGDM's ``u`` and ``m``, q-FedAvg's and AFL's losses, ...) is
  clipped on the client to that field's L2 bound ``clip[field]`` (the upload is the
  field's change from the server's copy where the server holds one, else its value; after
  the field's codec, if any: :mod:`fedco.runtime.uplink`);
* Gaussian noise of standard deviation ``noise_multiplier * clip[field] * s`` is added where
  the server combines the uploads: to the weighted mean when that is all the server uses
  (``s`` = the largest averaging weight of the round: ``1 / m`` for uniform weights), and to
  each client's upload (``s = 1``) where the server reads every value (a ``round_start``
  statistic other than the mean, ``report`` fields, servers that are
  :class:`~fedco.algorithms.base.ServerAggregator` s).

For a field ``f`` with bound :math:`C_f`, noise multiplier :math:`z` and the round's sampled
clients :math:`S` (weights :math:`w_k`), the server's mean is

.. math::

  \bar v_f = \sum_{k \in S} w_k \operatorname{clip}(v_k, C_f)
    + \mathcal N\big(0, (z\, C_f \max_k w_k)^2 \mathbf I\big),
  \qquad \operatorname{clip}(v, C) = v \min\big(1, C / \|v\|_2\big),

where :math:`\|v\|_2` is the global L2 norm of the whole field (a pytree). One client
moves the clipped sum by at most :math:`C_f \max_k w_k`, the noise's standard deviation
over :math:`z`.

Either way each message is a Gaussian mechanism of noise multiplier ``z`` on one client's
contribution, so the accountant needs only ``z``, the messages per round and the sampling
rate. A round's messages are :func:`messages_per_round` (one per field per round, ``I`` for
the ``every_step`` fields), all from the round's sampled clients, so the round is one
Poisson-subsampled composition at rate :math:`q` = ``clients_per_round / K`` (the fixed-size
sample is accounted as Poisson at the same rate, as pfl-research and TensorFlow Federated
do), and the run composes ``rounds`` of them, after the ``at_init`` means (one Gaussian
mechanism per ``at_init`` field over every client, not subsampled). :func:`run_event` is
that ``dp_accounting`` event; :func:`epsilon_spent` evaluates it with ``dp_accounting``'s
RDP accountant (the Renyi divergences of the rounds add up, then convert to
:math:`(\varepsilon, \delta)` at the best order), and :func:`calibrate` bisects it for a
target epsilon. Dropped clients and stragglers send less; they are not credited (the count
is the plan's, an upper bound).

Examples:
  The noise multiplier that spends epsilon 8 over 20 rounds of full participation, for a
  plan sending 6 messages per round and one ``at_init`` mean (FedDRO with 5 local steps):

  >>> import fedco
  >>> z = fedco.privacy.calibrate(8.0, 1e-5, 1.0, messages=6, rounds=20, init_messages=1)
  >>> print(round(z, 2))
  7.01
  >>> eps = fedco.privacy.epsilon_spent(z, 1.0, 6, [10, 20, 40], 1e-5, init_messages=1)
  >>> [round(float(e), 2) for e in eps]
  [5.35, 8.0, 12.15]
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
  """A run's privacy mechanism (build it with :func:`gaussian`, which checks the values).

  A frozen dataclass: clipping bounds per sent field plus either a noise multiplier or a
  target ``(epsilon, delta)`` that the run calibrates ``z`` for (:func:`calibrate`) over
  ``rounds``. Give it to ``fedco.simulate(..., privacy=...)``; the run checks that ``clip``
  covers every field its algorithm sends.

  Attributes:
    clip: the L2 bound per field name (a mapping), or one float bound for every field.
    noise_multiplier: ``z``; ``None`` until calibrated from ``epsilon``.
    epsilon: the target epsilon for the whole run (``None`` when ``noise_multiplier`` is
      given).
    delta: the run's delta (default ``1e-5``).
    rounds: the rounds ``epsilon`` is calibrated for (``None``: ``fedco.simulate`` fills in
      its own).

  Examples:
    A bound per field, and the target spent over the run's rounds:

    >>> import fedco
    >>> dp = fedco.privacy.gaussian({"params": 1.0, "y": 0.1}, epsilon=8.0)
    >>> dp.clip_of("params"), dp.clip_of("y"), dp.clip_of("m")
    (1.0, 0.1, None)
    >>> dp.noise_multiplier is None, dp.over(20).rounds
    (True, 20)
  """

  clip: Union[float, Mapping[str, float]]
  noise_multiplier: Optional[float] = None
  epsilon: Optional[float] = None
  delta: float = 1e-5
  rounds: Optional[int] = None

  def over(self, rounds: int) -> "ClientDP":
    """This mechanism for a run of ``rounds`` rounds.

    A target epsilon without ``rounds`` is spent over them; one calibrated for other rounds
    warns that the run spends more or less (``metrics["epsilon"]`` says how much).

    Args:
      rounds: the run's number of rounds.

    Returns:
      A :class:`ClientDP` with ``rounds`` set (``self`` if it already had rounds).
    """
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
    """The L2 bound of ``field``: its entry in ``clip``, the one bound, or ``None``.

    Args:
      field: a field name of the communication plan (``"params"``, ``"y"``, ...).

    Returns:
      The field's bound, or ``None`` when ``clip`` is a mapping without it.
    """
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
  """Client-level DP by clipping per field plus Gaussian noise.

  The noise is at a given ``noise_multiplier`` or calibrated to ``(epsilon, delta)`` over
  ``rounds`` when the run starts (see the module): each upload of field ``f`` is clipped
  to L2 norm ``clip[f]`` and the server adds noise of standard deviation
  ``z * clip[f] * s``.

  Args:
    clip: one L2 bound ``> 0`` for every sent field, or ``{field: bound}`` naming every
      field the plan sends (``"params"`` and the plan's state fields) and no other.
    noise_multiplier: ``z >= 0`` (``0``: clipping only, epsilon infinite).
    epsilon: target epsilon ``> 0`` of the whole run, instead of ``noise_multiplier``.
    delta: the run's delta, in ``(0, 1)`` (default ``1e-5``).
    rounds: the rounds to calibrate ``epsilon`` for, a positive int; ``None`` (default):
      ``fedco.simulate`` uses its own (``Simulator`` and ``fedco.sweep`` need it given).

  Returns:
    A :class:`ClientDP`.

  Raises:
    ValueError: if a bound is not positive, ``clip`` is an empty mapping, not exactly one
      of ``noise_multiplier`` and ``epsilon`` is given, or ``delta`` or ``rounds`` is out of
      range.

  Examples:
    >>> import fedco
    >>> dp = fedco.privacy.gaussian(1.0, noise_multiplier=1.1)
    >>> dp.clip_of("params"), dp.noise_multiplier, dp.delta
    (1.0, 1.1, 1e-05)
    >>> fedco.privacy.gaussian({"params": 1.0, "y": 0.1}, epsilon=8.0, rounds=20).rounds
    20
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
  """Messages each sampled client sends per round, by field.

  ``params`` and every ``every_round``, ``round_start`` and ``report`` field count once,
  ``every_step`` fields ``local_steps`` (``I``) times; a field in several lists adds up.
  The ``at_init`` means are not counted (they come once, before round 1: the accountant's
  ``init_messages``). The sum over fields is the ``messages`` of :func:`epsilon_spent`.

  Args:
    plan: the algorithm's :class:`~fedco.CommPlan` (``algorithm.plan``).
    fields: ``None`` (default) for every sent field, or the field names to report (each
      must be sent).

  Returns:
    A dict ``{field: messages per round}``.

  Raises:
    ValueError: ``fields`` names a field the plan does not send.

  Examples:
    FedDRO with 5 local steps sends the model once and ``y`` every step:

    >>> import fedco
    >>> fedco.privacy.messages_per_round(fedco.feddro(0.1, 5).plan)
    {'params': 1, 'y': 5}
  """
  counts = {"params": 1}
  for f in tuple(plan.every_round) + tuple(plan.round_start) + tuple(plan.report):
    counts[f] = counts.get(f, 0) + 1
  for f in plan.every_step:
    counts[f] = counts.get(f, 0) + plan.local_steps
  if fields is None:
    return counts
  unsent = [f for f in fields if f not in counts]
  if unsent:
    raise ValueError(
      f"fields names {unsent}, which the plan does not send; it sends {list(counts)}"
    )
  return {f: counts[f] for f in fields}


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
  """One round's ``dp_accounting`` event.

  ``messages`` Gaussian mechanisms of multiplier ``z``, all on the same Poisson sample of
  clients at rate ``sampling_rate``: a ``PoissonSampledDpEvent`` of their composition, or
  the composition alone at ``sampling_rate >= 1`` (every client, every round).

  Args:
    noise_multiplier: ``z > 0``.
    sampling_rate: the chance ``q = clients_per_round / K`` that a client is in the round.
    messages: Gaussian mechanisms per round (the sum of :func:`messages_per_round`).

  Returns:
    A ``dp_accounting.DpEvent``.

  Examples:
    >>> import fedco
    >>> fedco.privacy.round_event(2.0, 0.1, messages=2)
    PoissonSampledDpEvent(sampling_probability=0.1,
      event=ComposedDpEvent(events=[GaussianDpEvent(noise_multiplier=2.0),
                                    GaussianDpEvent(noise_multiplier=2.0)]))
  """
  import dp_accounting  # pylint: disable=g-import-not-at-top

  gaussian_ = dp_accounting.GaussianDpEvent(noise_multiplier)
  composed = dp_accounting.ComposedDpEvent([gaussian_] * int(messages))
  if sampling_rate >= 1:
    return composed
  return dp_accounting.PoissonSampledDpEvent(sampling_rate, composed)


def init_event(noise_multiplier: float, messages: int):
  """The ``at_init`` means before round 1, as one ``dp_accounting`` event.

  ``messages`` Gaussian mechanisms of multiplier ``z`` over every client (no subsampling):
  one per ``at_init`` field of the plan (e.g. FedDRO's starting ``y_bar``).

  Args:
    noise_multiplier: ``z > 0``.
    messages: the ``at_init`` means (``len(plan.init_fields)``).

  Returns:
    A ``dp_accounting.ComposedDpEvent``.

  Examples:
    >>> import fedco
    >>> fedco.privacy.init_event(2.0, messages=1)
    ComposedDpEvent(events=[GaussianDpEvent(noise_multiplier=2.0)])
  """
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
  """The whole run's ``dp_accounting`` event.

  :func:`init_event` once (when ``init_messages > 0``), then :func:`round_event` composed
  ``rounds`` times. Any ``dp_accounting`` accountant evaluates it; :func:`epsilon_spent`
  gives the same epsilon with the RDP accountant, for many round counts at once.

  Args:
    noise_multiplier: ``z > 0``.
    sampling_rate: the chance ``q = clients_per_round / K`` that a client is in a round.
    messages: Gaussian mechanisms per round (the sum of :func:`messages_per_round`).
    rounds: the run's number of rounds.
    init_messages: the ``at_init`` means before round 1 (default ``0``: none).

  Returns:
    A ``dp_accounting.DpEvent``.

  Examples:
    >>> import fedco
    >>> from dp_accounting import rdp
    >>> event = fedco.privacy.run_event(2.0, 1.0, 2, rounds=10, init_messages=1)
    >>> accountant = rdp.RdpAccountant()
    >>> print(round(accountant.compose(event).get_epsilon(1e-5), 2))
    12.68
    >>> print(round(fedco.privacy.epsilon_spent(2.0, 1.0, 2, 10, 1e-5, init_messages=1), 2))
    12.68
  """
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
  r"""Epsilon spent after each of ``rounds``, by the RDP accountant.

  The run is :func:`run_event`: ``init_messages`` Gaussian mechanisms of every client
  before round 1 (the ``at_init`` means), not subsampled, then per round ``messages``
  Gaussian mechanisms on a Poisson sample at rate ``sampling_rate``. Their Renyi
  divergences add up, :math:`\rho(\alpha) = \rho_0(\alpha) + t\, \rho_q(\alpha)` after
  :math:`t` rounds, and ``dp_accounting`` converts that to :math:`\varepsilon` at
  ``delta`` with the best order :math:`\alpha`. One round's divergence is computed once,
  so a sequence of round counts costs little more than one.

  Args:
    noise_multiplier: ``z >= 0``; ``0`` (no noise) spends infinite epsilon after any round.
    sampling_rate: the chance ``q = clients_per_round / K`` that a client is in a round.
    messages: Gaussian mechanisms per round (the sum of :func:`messages_per_round`).
    rounds: a round count (int), or a sequence of them.
    delta: the run's delta, in ``(0, 1)``.
    init_messages: the ``at_init`` means before round 1 (default ``0``: none).

  Returns:
    A float for an int ``rounds``, else a NumPy array of epsilons, one per entry of
    ``rounds``.

  Examples:
    Subsampling amplifies privacy: one message per round at ``z = 1``, with 10% of the
    clients per round and with all of them:

    >>> import fedco
    >>> sampled = fedco.privacy.epsilon_spent(1.0, 0.1, 1, [1, 10, 100], 1e-5)
    >>> [round(float(e), 2) for e in sampled]
    [2.13, 3.44, 7.9]
    >>> everyone = fedco.privacy.epsilon_spent(1.0, 1.0, 1, [1, 10, 100], 1e-5)
    >>> [round(float(e), 2) for e in everyone]
    [4.73, 19.05, 96.12]
  """
  from dp_accounting import rdp  # pylint: disable=g-import-not-at-top

  scalar = np.ndim(rounds) == 0
  counts = np.atleast_1d(np.asarray(rounds, np.int64))
  if noise_multiplier == 0:  # no noise: the at_init means already spend everything
    out = np.where((counts > 0) | (init_messages > 0), np.inf, 0.0)
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
  """The smallest noise multiplier whose run spends at most ``epsilon`` (RDP).

  Bisection on ``z``, over which the spent epsilon (:func:`epsilon_spent` after ``rounds``)
  decreases: ``z`` doubles from 1 until the run spends at most ``epsilon``, then the bracket
  shrinks to a relative width ``rtol``. The upper end is returned, so the run never spends
  more than ``epsilon``. ``fedco.simulate`` calls it when :func:`gaussian` was given an
  epsilon.

  Args:
    epsilon: the target epsilon of the whole run, ``> 0``.
    delta: the run's delta, in ``(0, 1)``.
    sampling_rate: the chance ``q = clients_per_round / K`` that a client is in a round.
    messages: Gaussian mechanisms per round (the sum of :func:`messages_per_round`).
    rounds: the run's number of rounds.
    init_messages: the ``at_init`` means before round 1 (default ``0``: none).
    rtol: the relative precision of ``z`` (default ``1e-6``).

  Returns:
    The noise multiplier ``z``, a float.

  Raises:
    ValueError: ``epsilon`` is not a positive number, or even ``z = 1e6`` spends more than
      ``epsilon``.

  Examples:
    Epsilon 8 over 20 rounds of every client, for 6 messages per round and one ``at_init``
    mean (FedDRO with 5 local steps):

    >>> import fedco
    >>> z = fedco.privacy.calibrate(8.0, 1e-5, 1.0, messages=6, rounds=20, init_messages=1)
    >>> print(round(z, 2))
    7.01
    >>> print(round(fedco.privacy.epsilon_spent(z, 1.0, 6, 20, 1e-5, init_messages=1), 2))
    8.0
  """
  _validate.positive("epsilon", epsilon)
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
