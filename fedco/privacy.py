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
that ``dp_accounting`` event; :func:`epsilon_spent` evaluates it with one of
``dp_accounting``'s two accountants, and :func:`calibrate` bisects it for a target epsilon.
Dropped clients and stragglers send less; they are not credited (the count is the plan's, an
upper bound).

The accountant is ``accountant="rdp"`` (the default) or ``"pld"``, in :func:`epsilon_spent`,
:func:`calibrate` and :func:`gaussian`:

* ``"rdp"``, Renyi DP: the Renyi divergences of the rounds add up, then convert to
  :math:`(\varepsilon, \delta)` at the best of a fixed list of orders. Fast (one round's
  divergences are computed once; any number of rounds costs about the same), but the
  conversion is an upper bound: about 5% above PLD's epsilon at full participation, 10% to
  several times above it when few clients are sampled (decision 106).
* ``"pld"``, the privacy loss distribution: the distribution of the privacy loss itself,
  discretized on a grid of step :data:`PLD_DISCRETIZATION` (pessimistically: still an upper
  bound) and composed by FFT convolutions, gives epsilon numerically tight up to that grid
  (at full participation the run is one Gaussian mechanism, whose epsilon is exact). Slower,
  and the more so the more rounds and the larger the epsilon (see :func:`epsilon_spent`).

Pick ``"pld"`` to report or calibrate a run's final guarantee (the same epsilon for a
smaller ``z``: less noise); keep ``"rdp"`` for quick sweeps over many settings and for long
per-round curves, where its speed matters more than its slack.

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
import math
import warnings
from typing import Dict, Mapping, Optional, Union

import numpy as np

from fedco import _validate

#: The accountants :func:`epsilon_spent`, :func:`calibrate` and :func:`gaussian` take.
ACCOUNTANTS = ("rdp", "pld")

#: The PLD accountant's ``value_discretization_interval``: the grid step of privacy losses.
#: ``dp_accounting``'s default is ``1e-4``; ``1e-3`` moves epsilon by less than 0.1% on the
#: settings measured (``z = 1.1``, ``q = 0.01``, 1000 rounds: 1.5162 against 1.5154) and
#: composes 5 to 12 times faster (decision 106). The grid is pessimistic: a coarser one only
#: loosens the bound.
PLD_DISCRETIZATION = 1e-3


def _check_accountant(accountant) -> str:
  """``accountant`` if it is one of :data:`ACCOUNTANTS`, else a one-line ``ValueError``."""
  if not isinstance(accountant, str) or accountant not in ACCOUNTANTS:
    raise ValueError(
      f"accountant must be one of {', '.join(map(repr, ACCOUNTANTS))}, got {accountant!r}"
    )
  return str(accountant)


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
    accountant: what calibrates ``epsilon`` and reports the epsilon spent: ``"rdp"``
      (default) or ``"pld"`` (tighter, slower; see the module); the ``accountant=`` of
      :func:`epsilon_spent` and :func:`calibrate`.
    adaptive: an :class:`AdaptiveClipping` (the bounds of the fields sent once at a round's
      end follow a quantile of the clients' norms, ``clip`` their start), or ``None``.

  Examples:
    A bound per field, and the target spent over the run's rounds:

    >>> import fedco
    >>> dp = fedco.privacy.gaussian({"params": 1.0, "y": 0.1}, epsilon=8.0)
    >>> dp.clip_of("params"), dp.clip_of("y"), dp.clip_of("m")
    (1.0, 0.1, None)
    >>> dp.noise_multiplier is None, dp.over(20).rounds, dp.accountant
    (True, 20, 'rdp')
  """

  clip: Union[float, Mapping[str, float]]
  noise_multiplier: Optional[float] = None
  epsilon: Optional[float] = None
  delta: float = 1e-5
  rounds: Optional[int] = None
  adaptive: Optional["AdaptiveClipping"] = None
  accountant: str = "rdp"

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
  adaptive: Optional["AdaptiveClipping"] = None,
  accountant: str = "rdp",
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
    adaptive: :func:`adaptive_clipping`'s spec: the bounds of the fields sent once at a
      round's end adapt, starting at ``clip`` (Andrew et al. 2021); ``None`` (default):
      fixed bounds.
    accountant: ``"rdp"`` (default) or ``"pld"``: what calibrates ``epsilon`` and reports
      the epsilon spent (see the module).

  Returns:
    A :class:`ClientDP`.

  Raises:
    ValueError: if a bound is not positive, ``clip`` is an empty mapping, not exactly one
      of ``noise_multiplier`` and ``epsilon`` is given, ``delta`` or ``rounds`` is out of
      range, or ``accountant`` is not ``"rdp"`` or ``"pld"``.

  Examples:
    >>> import fedco
    >>> dp = fedco.privacy.gaussian(1.0, noise_multiplier=1.1)
    >>> dp.clip_of("params"), dp.noise_multiplier, dp.delta
    (1.0, 1.1, 1e-05)
    >>> fedco.privacy.gaussian({"params": 1.0, "y": 0.1}, epsilon=8.0, rounds=20).rounds
    20
    >>> fedco.privacy.gaussian(1.0, epsilon=8.0, accountant="pld").accountant
    'pld'
  """
  if isinstance(clip, Mapping):
    if not clip:
      raise ValueError("clip must name at least one field, got {}")
    clip = {str(k): _validate.positive(f"clip[{k!r}]", v) for k, v in clip.items()}
  else:
    clip = _validate.positive("clip", clip)
  noise_multiplier, epsilon, delta, rounds = _budget(noise_multiplier, epsilon, delta, rounds)
  accountant = _check_accountant(accountant)
  if adaptive is not None and not isinstance(adaptive, AdaptiveClipping):
    raise ValueError(
      f"adaptive must be fedco.privacy.adaptive_clipping(...) or None, got {adaptive!r}"
    )
  return ClientDP(
    clip,
    noise_multiplier,
    epsilon,
    delta,
    rounds,
    adaptive,
    accountant=accountant,
  )


def _budget(noise_multiplier, epsilon, delta, rounds):
  """A mechanism's budget checked, as floats: exactly one of ``noise_multiplier`` (``>= 0``)
  and ``epsilon`` (``> 0``), ``delta`` in ``(0, 1)``, ``rounds`` a positive int or ``None``
  (:func:`gaussian`'s and :func:`dp_ftrl`'s arguments alike)."""
  if (noise_multiplier is None) == (epsilon is None):
    raise ValueError(
      "give exactly one of noise_multiplier and epsilon, got "
      f"noise_multiplier={noise_multiplier!r}, epsilon={epsilon!r}"
    )
  if noise_multiplier is not None:
    noise_multiplier = float(
      _validate.positive("noise_multiplier", noise_multiplier, allow_zero=True)
    )
  if epsilon is not None:
    epsilon = float(_validate.positive("epsilon", epsilon))
  delta = float(_validate.open_unit("delta", delta))
  if rounds is not None:
    rounds = _validate.positive_int("rounds", rounds)
  return noise_multiplier, epsilon, delta, rounds


@dataclasses.dataclass(frozen=True)
class AdaptiveClipping:
  r"""Adaptive clipping's settings (build with :func:`adaptive_clipping`).

  Attributes:
    target_quantile: :math:`\gamma`, the fraction of clients whose upload the bound should
      leave unclipped.
    learning_rate: :math:`\eta_C`, the geometric step of the bound.
    count_noise: :math:`\sigma_b`, the standard deviation of the noise on each round's count
      of clients within the bound; ``None``: ``clients_per_round / 20`` (the paper's), or
      the noise multiplier :math:`z` where that is larger (the count then takes at most a
      quarter of the budget: :math:`z_\Delta \le 1.155 z`).

  Examples:
    >>> import fedco
    >>> spec = fedco.privacy.adaptive_clipping(target_quantile=0.5)
    >>> spec.learning_rate, spec.count_noise
    (0.2, None)
  """

  target_quantile: float = 0.5
  learning_rate: float = 0.2
  count_noise: Optional[float] = None


def adaptive_clipping(
  target_quantile: float = 0.5, learning_rate: float = 0.2, count_noise: Optional[float] = None
) -> AdaptiveClipping:
  r"""Clip bounds that follow a quantile of the clients' upload norms (Andrew, Thakkar,
  McMahan and Ramaswamy 2021, "Differentially Private Learning with Adaptive Clipping").

  Give it to :func:`gaussian` as ``adaptive=``. Each round every client also reports
  whether its upload of a field sent once at the round's end was within the bound
  :math:`C`; the server moves :math:`C \leftarrow C \exp(-\eta_C (\tilde b - \gamma))`
  with :math:`\tilde b` the noised fraction of such clients, and the upload's noise
  multiplier becomes :math:`z_\Delta = (z^{-2} - (2\sigma_b)^{-2})^{-1/2}`, so the pair
  costs one Gaussian mechanism of multiplier :math:`z` (the accountant's). See
  :mod:`fedco.runtime.adaptive_clip`.

  Args:
    target_quantile: :math:`\gamma \in (0, 1)` (default 0.5, the median norm).
    learning_rate: :math:`\eta_C > 0` (default 0.2, the paper's).
    count_noise: :math:`\sigma_b > 0`; ``None`` (default): ``clients_per_round / 20`` (the
      paper's, for its cohorts of hundreds at :math:`z \approx 1`), or :math:`z` where that
      is larger (a few clients, or many rounds at a small epsilon). It must exceed half
      the noise multiplier (:func:`update_multiplier`).

  Returns:
    an :class:`AdaptiveClipping`.

  Raises:
    ValueError: a value out of range.

  Examples:
    >>> import fedco
    >>> dp = fedco.privacy.gaussian(0.1, noise_multiplier=1.0,
    ...                             adaptive=fedco.privacy.adaptive_clipping(0.8))
    >>> dp.adaptive.target_quantile
    0.8
  """
  target_quantile = _validate.interval("target_quantile", target_quantile, 0, 1)
  learning_rate = _validate.positive("learning_rate", learning_rate)
  if count_noise is not None:
    count_noise = _validate.positive("count_noise", count_noise)
  return AdaptiveClipping(float(target_quantile), float(learning_rate), count_noise)


def update_multiplier(noise_multiplier: float, count_noise: float) -> float:
  r"""The upload's noise multiplier :math:`z_\Delta = (z^{-2} - (2\sigma_b)^{-2})^{-1/2}`
  under adaptive clipping, so upload and count together cost one Gaussian of multiplier
  :math:`z` (Andrew et al. 2021, Theorem 1).

  Args:
    noise_multiplier: :math:`z \ge 0` (0: no noise anywhere, returns 0).
    count_noise: :math:`\sigma_b`, more than :math:`z / 2`.

  Returns:
    :math:`z_\Delta` (a float).

  Raises:
    ValueError: ``count_noise`` at most ``noise_multiplier / 2``: the count alone would
      spend the whole budget.

  Examples:
    >>> import fedco
    >>> round(fedco.privacy.update_multiplier(1.0, 5.0), 4)  # 10 clients a round x 100 / 20
    1.005
  """
  if noise_multiplier == 0:
    return 0.0
  if 2 * count_noise <= noise_multiplier:
    raise ValueError(
      f"adaptive clipping's count_noise={count_noise:g} must exceed half the noise "
      f"multiplier ({noise_multiplier:g} / 2): the count would spend the whole budget; "
      f"raise count_noise or sample more clients a round"
    )
  return float((noise_multiplier**-2 - (2 * count_noise) ** -2) ** -0.5)


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
  ``rounds`` times. ``dp_accounting``'s RDP accountant evaluates it, and
  :func:`epsilon_spent` gives the same epsilon, for many round counts at once. Its PLD
  accountant (``dp_accounting`` 0.6) refuses a Poisson sample of a composition
  (``messages > 1`` at ``sampling_rate < 1``); ``epsilon_spent(..., accountant="pld")``
  evaluates the equivalent event it takes: ``n`` Gaussian mechanisms of multiplier ``z`` on
  the same data are one of multiplier ``z / sqrt(n)`` (the RDP accountant's reduction too).

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


def _gaussian_pld(noise_multiplier: float, mechanisms: int, sampling_rate: float = 1.0):
  """The privacy loss distribution of ``mechanisms`` Gaussians of multiplier ``z`` on the same
  data (one of multiplier ``z / sqrt(mechanisms)``), Poisson-subsampled at ``sampling_rate``:
  what ``dp_accounting``'s ``PLDAccountant`` builds for a ``GaussianDpEvent`` (or its
  ``PoissonSampledDpEvent``), on the grid of :data:`PLD_DISCRETIZATION`."""
  import dp_accounting  # pylint: disable=g-import-not-at-top
  from dp_accounting.pld import privacy_loss_distribution  # pylint: disable=g-import-not-at-top

  return privacy_loss_distribution.from_gaussian_mechanism(
    standard_deviation=noise_multiplier / math.sqrt(mechanisms),
    value_discretization_interval=PLD_DISCRETIZATION,
    sampling_prob=min(float(sampling_rate), 1.0),
    neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
  )


def _gaussian_epsilon(standard_deviation: float, delta: float) -> float:
  """Epsilon at ``delta`` of one Gaussian mechanism of sensitivity 1, exactly: its privacy
  loss distribution is known in closed form (``dp_accounting``'s ``GaussianPrivacyLoss``
  gives delta for an epsilon; Balle and Wang 2018), inverted by bisection to a relative
  ``1e-12``, the upper end returned (its delta is at most ``delta``)."""
  from dp_accounting.pld import privacy_loss_mechanism  # pylint: disable=g-import-not-at-top

  loss = privacy_loss_mechanism.GaussianPrivacyLoss(standard_deviation)
  over = lambda epsilon: loss.get_delta_for_epsilon(epsilon) > delta
  if not over(0.0):
    return 0.0
  low, high = 0.0, 1.0
  while over(high):
    low, high = high, 2 * high
  while high - low > 1e-12 * high:
    middle = 0.5 * (low + high)
    low, high = (middle, high) if over(middle) else (low, middle)
  return high


def _pld_epsilons(
  noise_multiplier: float,
  sampling_rate: float,
  messages: int,
  counts: np.ndarray,
  delta: float,
  init_messages: int,
) -> np.ndarray:
  """:func:`epsilon_spent`'s ``accountant="pld"`` for ``z > 0``: epsilon after each of
  ``counts``, composing the rounds incrementally in increasing order of count."""
  messages, init_messages = int(messages), int(init_messages)
  wanted, where = np.unique(np.maximum(counts, 0), return_inverse=True)
  eps = np.zeros(len(wanted))
  if sampling_rate >= 1:  # every message on every client: one Gaussian, known exactly
    for i, t in enumerate(wanted):
      n = messages * int(t) + init_messages
      eps[i] = _gaussian_epsilon(noise_multiplier / math.sqrt(n), delta) if n else 0.0
    return eps[where]
  total = _gaussian_pld(noise_multiplier, init_messages) if init_messages else None
  per_round = None
  if messages and sampling_rate > 0:
    per_round = _gaussian_pld(noise_multiplier, messages, sampling_rate)
  done = 0
  for i, t in enumerate(wanted):
    if per_round is not None and t > done:
      more = per_round if t - done == 1 else per_round.self_compose(int(t - done))
      total = more if total is None else total.compose(more)
      done = int(t)
    eps[i] = 0.0 if total is None else total.get_epsilon_for_delta(delta)
  return eps[where]


def epsilon_spent(
  noise_multiplier: float,
  sampling_rate: float,
  messages: int,
  rounds,
  delta: float,
  *,
  init_messages: int = 0,
  accountant: str = "rdp",
):
  r"""Epsilon spent after each of ``rounds``, by the RDP or the PLD accountant.

  The run is :func:`run_event`: ``init_messages`` Gaussian mechanisms of every client
  before round 1 (the ``at_init`` means), not subsampled, then per round ``messages``
  Gaussian mechanisms on a Poisson sample at rate ``sampling_rate``.

  ``accountant="rdp"``: their Renyi divergences add up,
  :math:`\rho(\alpha) = \rho_0(\alpha) + t\, \rho_q(\alpha)` after :math:`t` rounds, and
  ``dp_accounting`` converts that to :math:`\varepsilon` at ``delta`` with the best order
  :math:`\alpha`. One round's divergence is computed once, so a sequence of round counts
  costs little more than one.

  ``accountant="pld"``: ``dp_accounting.pld``'s privacy loss distributions (what its
  ``PLDAccountant`` composes for :func:`run_event`, on a grid of step
  :data:`PLD_DISCRETIZATION`; a round's ``messages`` Gaussians are the one Gaussian of
  multiplier ``z / sqrt(messages)``). At ``sampling_rate < 1`` one round's distribution is
  built once and composed round count after round count, in increasing order (the
  differences by FFT self-composition), epsilon read at each requested count. One count,
  even of thousands of rounds, takes a few tenths of a second; each further count adds a
  convolution of the grown distribution and a read: the epsilon after each of 1000 rounds
  takes 3 s at ``z = 1.1``, ``q = 0.01``, one message per round, and 12 s at ``q = 0.1``
  (RDP: 0.2 and 0.4 s), more at a larger epsilon (a wider distribution). At
  ``sampling_rate >= 1`` the run is one Gaussian mechanism, of multiplier
  ``z / sqrt(messages * t + init_messages)``, whose privacy loss distribution is known in
  closed form: its exact epsilon (Balle and Wang 2018, inverted to a relative ``1e-12``;
  within ``1e-6`` of the discretized one where epsilon is above 0.1), about 10 ms a count.

  Args:
    noise_multiplier: ``z >= 0``; ``0`` (no noise) spends infinite epsilon after any round.
    sampling_rate: the chance ``q = clients_per_round / K`` that a client is in a round.
    messages: Gaussian mechanisms per round (the sum of :func:`messages_per_round`).
    rounds: a round count (int), or a sequence of them.
    delta: the run's delta, in ``(0, 1)``.
    init_messages: the ``at_init`` means before round 1 (default ``0``: none).
    accountant: ``"rdp"`` (default) or ``"pld"`` (tighter, slower; see the module).

  Returns:
    A float for an int ``rounds``, else a NumPy array of epsilons, one per entry of
    ``rounds``.

  Raises:
    ValueError: ``accountant`` is not ``"rdp"`` or ``"pld"``.

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

    The PLD accountant's tighter epsilons for the same runs:

    >>> sampled = fedco.privacy.epsilon_spent(1.0, 0.1, 1, [1, 10, 100], 1e-5, accountant="pld")
    >>> [round(float(e), 2) for e in sampled]
    [1.68, 2.85, 7.05]
    >>> everyone = fedco.privacy.epsilon_spent(1.0, 1.0, 1, [1, 10, 100], 1e-5, accountant="pld")
    >>> [round(float(e), 2) for e in everyone]
    [4.38, 17.86, 91.82]
  """
  from dp_accounting import rdp  # pylint: disable=g-import-not-at-top

  accountant = _check_accountant(accountant)
  scalar = np.ndim(rounds) == 0
  counts = np.atleast_1d(np.asarray(rounds, np.int64))
  if noise_multiplier == 0:  # no noise: the at_init means already spend everything
    out = np.where((counts > 0) | (init_messages > 0), np.inf, 0.0)
    return float(out[0]) if scalar else out
  if accountant == "pld":
    out = _pld_epsilons(noise_multiplier, sampling_rate, messages, counts, delta, init_messages)
    return float(out[0]) if scalar else out
  with _quiet():
    by_rdp = rdp.RdpAccountant()
    by_rdp.compose(round_event(noise_multiplier, sampling_rate, messages), 1)
    orders = np.asarray(by_rdp._orders)  # pylint: disable=protected-access
    per_round = np.asarray(by_rdp._rdp)  # pylint: disable=protected-access
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
  accountant: str = "rdp",
) -> float:
  """The smallest noise multiplier whose run spends at most ``epsilon``.

  Bisection on ``z``, over which the spent epsilon (:func:`epsilon_spent` after ``rounds``,
  by ``accountant``) decreases: ``z`` doubles from 1 until the run spends at most
  ``epsilon``, then the bracket shrinks to a relative width ``rtol``. The upper end is
  returned, so the run never spends more than ``epsilon``. ``fedco.simulate`` calls it when
  :func:`gaussian` was given an epsilon. Each step evaluates one epsilon (see
  :func:`epsilon_spent`): at ``sampling_rate < 1`` 0.03 to 0.2 s by RDP and 0.03 to 0.5 s
  by PLD, so one to a few seconds in all at the default ``rtol`` either way.

  Args:
    epsilon: the target epsilon of the whole run, ``> 0``.
    delta: the run's delta, in ``(0, 1)``.
    sampling_rate: the chance ``q = clients_per_round / K`` that a client is in a round.
    messages: Gaussian mechanisms per round (the sum of :func:`messages_per_round`).
    rounds: the run's number of rounds.
    init_messages: the ``at_init`` means before round 1 (default ``0``: none).
    rtol: the relative precision of ``z`` (default ``1e-6``).
    accountant: ``"rdp"`` (default) or ``"pld"``: PLD's tighter epsilon buys a smaller
      ``z`` (see the module).

  Returns:
    The noise multiplier ``z``, a float.

  Raises:
    ValueError: ``epsilon`` is not a positive number, even ``z = 1e6`` spends more than
      ``epsilon``, or ``accountant`` is not ``"rdp"`` or ``"pld"``.

  Examples:
    Epsilon 8 over 20 rounds of every client, for 6 messages per round and one ``at_init``
    mean (FedDRO with 5 local steps):

    >>> import fedco
    >>> z = fedco.privacy.calibrate(8.0, 1e-5, 1.0, messages=6, rounds=20, init_messages=1)
    >>> print(round(z, 2))
    7.01
    >>> print(round(fedco.privacy.epsilon_spent(z, 1.0, 6, 20, 1e-5, init_messages=1), 2))
    8.0

    The PLD accountant needs less noise for the same target (here to a precision of 0.1%,
    ten bisection steps fewer than the default's):

    >>> z = fedco.privacy.calibrate(8.0, 1e-5, 1.0, messages=1, rounds=5, rtol=1e-3)
    >>> z_pld = fedco.privacy.calibrate(8.0, 1e-5, 1.0, messages=1, rounds=5, rtol=1e-3,
    ...                                 accountant="pld")
    >>> print(round(z, 3), round(z_pld, 3))
    1.427 1.343
  """
  _validate.positive("epsilon", epsilon)
  accountant = _check_accountant(accountant)
  spent = lambda z: epsilon_spent(
    z, sampling_rate, messages, rounds, delta, init_messages=init_messages, accountant=accountant
  )
  return _bisect(spent, epsilon, rtol, f"delta={delta} over {rounds} rounds")


def _bisect(spent, epsilon: float, rtol: float, what: str) -> float:
  """The smallest ``z`` (to a relative ``rtol``, its upper end) with ``spent(z) <= epsilon``,
  ``spent`` decreasing in ``z``: doubling from 1, then bisection."""
  low, high = 0.0, 1.0
  while spent(high) > epsilon:
    low, high = high, 2 * high
    if high > 1e6:
      raise ValueError(
        f"epsilon={epsilon} is out of reach for {what}: even noise_multiplier=1e6 spends more"
      )
  while high - low > rtol * high:
    middle = 0.5 * (low + high)
    low, high = (middle, high) if spent(middle) > epsilon else (low, middle)
  return high


@dataclasses.dataclass(frozen=True)
class TreeDP:
  r"""DP-FTRL for a run (build it with :func:`dp_ftrl`, which checks the values).

  The model changes clients send are clipped to ``clip``; the server sums them, adds
  tree-aggregated noise (each node :math:`\mathcal N(0, (z\, C / m)^2)` on the mean's scale)
  and steps by follow-the-regularized-leader with momentum
  (:mod:`fedco.algorithms.core.ftrl`), one tree per epoch of the run's ``"epochs"`` client
  schedule. The attributes a :class:`ClientDP` has mean the same here.

  Attributes:
    clip: the L2 bound of each client's model change (DP-FTRL covers the model only).
    learning_rate: the server's :math:`\eta`.
    momentum: the server's :math:`\mu \in [0, 1)`.
    nesterov: the Nesterov form of the momentum.
    noise_multiplier: ``z``, each node's noise over the sensitivity; ``None`` until
      calibrated from ``epsilon``.
    epsilon: the target epsilon of the whole run (``None`` when ``noise_multiplier`` is
      given).
    delta: the run's delta.
    rounds: the rounds ``epsilon`` is calibrated for (``None``: ``fedco.simulate`` fills in
      its own).
    efficient: Honaker's estimator of each tree node (less noise, the same privacy).

  Examples:
    Calibrated over a run's rounds, as ``fedco.simulate`` does for its own:

    >>> import fedco
    >>> spec = fedco.privacy.dp_ftrl(1.0, momentum=0.9, epsilon=4.0)
    >>> spec.over(100).rounds, spec.noise_multiplier is None
    (100, True)
  """

  clip: float
  learning_rate: float = 1.0
  momentum: float = 0.0
  nesterov: bool = False
  noise_multiplier: Optional[float] = None
  epsilon: Optional[float] = None
  delta: float = 1e-5
  rounds: Optional[int] = None
  efficient: bool = True

  #: Tree aggregation is accounted by RDP (``dp_accounting``'s only accountant of it).
  accountant = "rdp"
  #: No adaptive clipping: the bound sets every node's noise, which is drawn once.
  adaptive = None

  def over(self, rounds: int) -> "TreeDP":
    """This mechanism for a run of ``rounds`` rounds (as :meth:`ClientDP.over`).

    Args:
      rounds: the run's number of rounds.

    Returns:
      A :class:`TreeDP` with ``rounds`` set (``self`` if it already had rounds).
    """
    return ClientDP.over(self, rounds)  # type: ignore[arg-type,return-value]

  def clip_of(self, field: str) -> Optional[float]:
    """The model's bound for ``"params"``; ``None`` for any other field."""
    return self.clip if field == "params" else None


def dp_ftrl(
  clip: float,
  *,
  learning_rate: float = 1.0,
  momentum: float = 0.0,
  nesterov: bool = False,
  noise_multiplier: Optional[float] = None,
  epsilon: Optional[float] = None,
  delta: float = 1e-5,
  rounds: Optional[int] = None,
  efficient: bool = True,
) -> TreeDP:
  r"""DP-FTRL with tree aggregation (Kairouz et al. 2021) for a run's ``privacy=``.

  Private training without sampling: each client's model change is clipped to ``clip``;
  the server keeps the running sum of the rounds' mean clipped changes and releases it with
  the noise of a binary tree (every client's round in at most :math:`\lceil \log_2(T + 1)
  \rceil` nodes of a ``T``-round tree), stepping from the tree's starting model by
  follow-the-regularized-leader with momentum (DP-FTRLM). The run's algorithm's own
  server is replaced by this one. The run must visit each client at most once per tree:
  ``SimOptions(sampling="epochs")`` (each epoch a fresh permutation of the clients, ``m``
  of them a round, ``K // m`` rounds; the tree restarts every epoch). Accounting:
  :func:`tree_epsilon_spent`.

  Covers algorithms that send only their model (FedAvg, FedProx, local SGD with any
  client optimizer), weighted alike.

  Args:
    clip: the L2 bound ``> 0`` of each client's model change.
    learning_rate: the server's step :math:`\eta > 0` (default 1: the sum of the mean
      changes, FedAvg's step).
    momentum: :math:`\mu \in [0, 1)` (default 0; the paper's 0.9 in its experiments).
    nesterov: the Nesterov form (needs ``momentum > 0``).
    noise_multiplier: ``z >= 0`` (0: clipping only, epsilon infinite).
    epsilon: a target epsilon ``> 0`` of the whole run, instead of ``noise_multiplier``.
    delta: the run's delta, in ``(0, 1)`` (default ``1e-5``).
    rounds: the rounds to calibrate ``epsilon`` for (``None``: ``fedco.simulate``'s).
    efficient: ``True`` (default, as TensorFlow Federated's ``efficient_tree``): each
      node's sum is Honaker's estimate from its own noisy value and its children's, which
      lowers the noise on the prefix sums (a node of level ``l``: variance
      ``2^l / (2^(l+1) - 1)`` of the plain node's, about half at high levels) at the same
      privacy; it keeps one model-sized buffer per tree level in the server's state.
      ``False``: each node's own noisy value (Kairouz et al.'s analysis as printed).

  Returns:
    A :class:`TreeDP`.

  Raises:
    ValueError: a value out of range, or not exactly one of ``noise_multiplier`` and
      ``epsilon``.

  Examples:
    >>> import fedco
    >>> spec = fedco.privacy.dp_ftrl(0.5, learning_rate=1.0, momentum=0.9, epsilon=8.0)
    >>> spec.clip_of("params"), spec.clip_of("y"), spec.momentum, spec.accountant
    (0.5, None, 0.9, 'rdp')
  """
  clip = _validate.positive("clip", clip)
  learning_rate = _validate.positive("learning_rate", learning_rate)
  _validate.interval("momentum", momentum, 0, 1, closed_low=True)
  for name, flag in (("nesterov", nesterov), ("efficient", efficient)):
    if not isinstance(flag, bool):
      raise ValueError(f"{name} must be True or False, got {flag!r}")
  if nesterov and momentum == 0:
    raise ValueError("nesterov=True needs momentum > 0, got momentum=0")
  noise_multiplier, epsilon, delta, rounds = _budget(noise_multiplier, epsilon, delta, rounds)
  return TreeDP(
    float(clip),
    float(learning_rate),
    float(momentum),
    nesterov,
    noise_multiplier,
    epsilon,
    delta,
    rounds,
    efficient,
  )


def tree_event(noise_multiplier: float, rounds_per_tree: int, rounds: int):
  """DP-FTRL's run of ``rounds`` rounds as one ``dp_accounting`` event.

  ``rounds // rounds_per_tree`` full trees (each client in at most one round of each),
  composed, then the part of the last one: ``SingleEpochTreeAggregationDpEvent`` s, which
  ``dp_accounting``'s RDP accountant evaluates under the replace-one-by-zero relation
  (``NeighboringRelation.REPLACE_SPECIAL``; Kairouz et al. 2021, appendix D).

  Args:
    noise_multiplier: ``z > 0``.
    rounds_per_tree: rounds between the tree's restarts (an epoch).
    rounds: the run's rounds so far.

  Returns:
    A ``dp_accounting.DpEvent``.

  Examples:
    Two full trees of ten rounds and half of a third:

    >>> import fedco
    >>> event = fedco.privacy.tree_event(2.0, 10, 25)
    >>> [type(e).__name__ for e in event.events]
    ['SelfComposedDpEvent', 'SingleEpochTreeAggregationDpEvent']
    >>> event.events[0].count, event.events[0].event.step_counts, event.events[1].step_counts
    (2, 10, 5)
  """
  import dp_accounting  # pylint: disable=g-import-not-at-top

  trees, rest = divmod(int(rounds), int(rounds_per_tree))
  events = []
  if trees:
    one = dp_accounting.SingleEpochTreeAggregationDpEvent(noise_multiplier, int(rounds_per_tree))
    events.append(dp_accounting.SelfComposedDpEvent(one, trees))
  if rest:
    events.append(dp_accounting.SingleEpochTreeAggregationDpEvent(noise_multiplier, rest))
  return dp_accounting.ComposedDpEvent(events)


def tree_epsilon_spent(noise_multiplier: float, rounds_per_tree: int, rounds, delta: float):
  r"""Epsilon DP-FTRL spends after each of ``rounds``, by the RDP accountant.

  A ``T``-round tree with each client in at most one of its rounds is
  :math:`\rho`-zCDP with :math:`\rho = \lceil \log_2(T + 1) \rceil / (2 z^2)`: its Renyi
  divergence at order :math:`\alpha` is :math:`\alpha \rho`; trees (epochs) add up, the last
  one counted for the rounds it had. ``dp_accounting`` converts that to epsilon at ``delta``
  (:func:`tree_event` is the same run as an event: its ``RdpAccountant`` with
  ``REPLACE_SPECIAL`` gives the same epsilon).

  Args:
    noise_multiplier: ``z >= 0`` (``0``: infinite after any round).
    rounds_per_tree: rounds between restarts, an int ``>= 1``.
    rounds: a round count, or a sequence of them.
    delta: in ``(0, 1)``.

  Returns:
    A float for an int ``rounds``, else a NumPy array.

  Examples:
    Ten rounds a tree at ``z = 5``: the depth grows with the rounds in the tree, then the
    trees compose:

    >>> import fedco
    >>> eps = fedco.privacy.tree_epsilon_spent(5.0, 10, [1, 3, 10, 20, 100], 1e-5)
    >>> [round(float(e), 2) for e in eps]
    [0.79, 1.16, 1.69, 2.48, 6.21]
  """
  from dp_accounting import rdp  # pylint: disable=g-import-not-at-top

  from fedco.algorithms.core.ftrl import tree_depth  # pylint: disable=g-import-not-at-top

  rounds_per_tree = _validate.positive_int("rounds_per_tree", rounds_per_tree)
  scalar = np.ndim(rounds) == 0
  counts = np.atleast_1d(np.asarray(rounds, np.int64))
  if noise_multiplier == 0:
    out = np.where(counts > 0, np.inf, 0.0)
    return float(out[0]) if scalar else out
  orders = np.asarray(rdp.RdpAccountant()._orders)  # pylint: disable=protected-access
  spent = []
  for t in counts:
    trees, rest = divmod(int(t), rounds_per_tree)
    depth = trees * tree_depth(rounds_per_tree) + tree_depth(rest)
    if depth == 0:
      spent.append(0.0)
      continue
    divergence = orders * depth / (2 * noise_multiplier**2)
    spent.append(rdp.rdp_privacy_accountant.compute_epsilon(orders, divergence, delta)[0])
  out = np.asarray(spent, float)
  return float(out[0]) if scalar else out


def tree_calibrate(
  epsilon: float, delta: float, rounds_per_tree: int, rounds: int, *, rtol: float = 1e-6
) -> float:
  """The smallest noise multiplier with which DP-FTRL spends at most ``epsilon``.

  :func:`tree_epsilon_spent` after ``rounds``, bisected on ``z`` as :func:`calibrate`
  does; ``fedco.simulate`` calls it when :func:`dp_ftrl` was given an epsilon.

  Args:
    epsilon: the target, ``> 0``.
    delta: in ``(0, 1)``.
    rounds_per_tree: rounds between restarts.
    rounds: the run's rounds.
    rtol: the relative precision of ``z``.

  Returns:
    ``z``, a float.

  Examples:
    >>> import fedco
    >>> z = fedco.privacy.tree_calibrate(8.0, 1e-5, 10, 100)
    >>> round(z, 3), round(fedco.privacy.tree_epsilon_spent(z, 10, 100, 1e-5), 3)
    (4.033, 8.0)
  """
  _validate.positive("epsilon", epsilon)
  spent = lambda z: tree_epsilon_spent(z, rounds_per_tree, rounds, delta)
  return _bisect(spent, epsilon, rtol, f"delta={delta} over {rounds} rounds of DP-FTRL")


__all__ = [
  "ACCOUNTANTS",
  "PLD_DISCRETIZATION",
  "ClientDP",
  "gaussian",
  "messages_per_round",
  "round_event",
  "init_event",
  "run_event",
  "epsilon_spent",
  "calibrate",
  "TreeDP",
  "dp_ftrl",
  "tree_event",
  "tree_epsilon_spent",
  "tree_calibrate",
]
