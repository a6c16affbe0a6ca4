r"""Byzantine clients, and the aggregation rules that survive them.

Two halves, each usable alone:

* **Aggregation rules** (:class:`Rule`): what the server makes of the round's uploads of one
  field in place of their weighted mean: :func:`mean` (the usual), :func:`coordinate_median`
  and :func:`trimmed_mean` (Yin et al. 2018), :func:`krum` and :func:`multi_krum` (Blanchard
  et al. 2017), :func:`centered_clipping` (Karimireddy, He and Jaggi 2021). Give one to a
  run as ``aggregation=`` (:class:`fedco.runtime.SimOptions`): it replaces *every* mean the
  round takes of what clients send, the model's and the state fields' alike (FedDRO's
  ``y`` after each step, DS-FedDRO's once a round, a ``round_start`` inner value), for any
  algorithm whose server is an optax transform and for those
  :class:`~fedco.extend.ServerAggregator` s that combine through ``RoundInfo.combine``
  (AFL). In your own loop, :func:`robust_server` is the rule as a server.
* **Byzantine clients** (:func:`attack`): a fixed set of ``round(fraction K)`` clients,
  drawn from the attack's ``seed``, that send, in place of each upload the plan names, its
  sign flipped (``-scale`` times their honest change), their honest change times ``scale``
  (for values sent as such, e.g. a loss report: an inflated report), or Gaussian noise of
  standard deviation ``scale``; :func:`flip_labels` makes them train on flipped labels
  instead. Give one to a run as ``byzantine=``: inside the compiled round, after each
  Byzantine client's codec and clipping (an attacker follows neither).

What the rules read: the round's surviving clients' uploads of one field, stacked on a
leading ``[m]`` axis, as changes from the server's copy where the server holds one (the model,
``every_step`` and ``every_round`` fields; ``centered=True``: the change 0 means "stay") or
as values (``report`` and ``round_start`` fields). Every rule but :func:`mean` and
:func:`centered_clipping` treats the surviving clients alike, as its paper does (a data-size
weight is what a Byzantine client would lie about); those two use the plan's weights.

Examples:
  Three honest clients and one that sends a huge change: the mean follows it, the median
  and Krum do not.

  >>> import jax.numpy as jnp
  >>> from fedco import byzantine
  >>> uploads = {"w": jnp.array([[1.0, 1.0], [1.2, 0.8], [0.9, 1.1], [100.0, -100.0]])}
  >>> weights = jnp.full(4, 0.25)
  >>> for rule in (byzantine.mean(), byzantine.coordinate_median(), byzantine.krum(1)):
  ...   print(rule.name, [round(float(v), 3) for v in rule(uploads, weights)["w"]])
  mean [25.775, -24.275]
  coordinate_median [1.1, 0.9]
  krum [1.0, 1.0]
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedco import _validate
from fedco.algorithms.core.servers import (
  RoundInfo,
  ServerAggregator,
  as_aggregator,
  optax_aggregator,
  weighted_client_mean,
)

PyTree = Any

#: The rules' factories by name (an experiment config's ``aggregation.rule``).
RULES = ("mean", "coordinate_median", "trimmed_mean", "krum", "multi_krum", "centered_clipping")
#: The kinds of upload a Byzantine client sends (:func:`attack`'s ``kind``).
ATTACKS = ("sign_flip", "scale", "gaussian")
#: Each kind's ``scale`` when :func:`attack` is given none.
DEFAULT_SCALE = {"sign_flip": 1.0, "scale": 10.0, "gaussian": 1.0}


@dataclasses.dataclass(frozen=True, eq=False)
class Rule:
  """An aggregation rule: ``rule(values, weights, alive=None, centered=True) -> center``.

  Build one with :func:`coordinate_median`, :func:`trimmed_mean`, :func:`krum`,
  :func:`multi_krum`, :func:`centered_clipping` or :func:`mean`; call it on a field's
  uploads.

  Attributes:
    name: its name (``"coordinate_median"``, ``"krum"``, ...).
    settings: its parameters, as a run's fingerprint records them.
    fn: ``(values, weights, alive, centered) -> center``; ``values`` a pytree whose leaves
      are stacked on a leading ``[m]`` clients axis, ``weights`` ``[m]`` (summing to 1 over
      the surviving clients), ``alive`` ``bool [m]`` (the clients whose uploads count),
      ``centered`` whether the values are changes from a server copy (0: stay where it is).

  Examples:
    >>> import jax.numpy as jnp
    >>> from fedco import byzantine
    >>> rule = byzantine.trimmed_mean(0.25)
    >>> rule.describe()
    {'rule': 'trimmed_mean', 'beta': 0.25}
    >>> rule(jnp.array([[0.0], [1.0], [2.0], [90.0]]), jnp.full(4, 0.25)).tolist()
    [1.5]
  """

  name: str
  settings: Dict[str, Any]
  fn: Callable[..., PyTree]

  def __call__(self, values, weights, alive=None, centered: bool = True) -> PyTree:
    weights = jnp.asarray(weights)
    alive = weights > 0 if alive is None else jnp.asarray(alive, bool)
    return self.fn(values, weights, alive, centered)

  def describe(self) -> Dict[str, Any]:
    """The rule's name and settings (a fingerprint's and a ledger's entry)."""
    return {"rule": self.name, **self.settings}


def _expand(mask, a):
  return mask.reshape(mask.shape + (1,) * (a.ndim - 1))


def _mean(values, weights, alive, centered):
  del centered
  return weighted_client_mean(values, jnp.where(alive, weights, 0))


def mean() -> Rule:
  r"""The weighted mean :math:`\sum_k w_k v_k` of the surviving clients.

  What a run without ``aggregation=`` computes; one Byzantine client moves it anywhere.

  Returns:
    a :class:`Rule`.

  Examples:
    >>> import jax.numpy as jnp
    >>> from fedco import byzantine
    >>> byzantine.mean()(jnp.array([[1.0], [3.0]]), jnp.array([0.25, 0.75])).tolist()
    [2.5]
  """
  return Rule("mean", {}, _mean)


def _sorted(a, alive):
  """Each coordinate's surviving values in increasing order, the others (``+inf``) last."""
  return jnp.sort(jnp.where(_expand(alive, a), a, jnp.inf), axis=0)


def _median_leaf(a, alive):
  """The surviving values' median per coordinate: the two middle ones of the ``m // 2 + 1``
  largest (``lax.top_k`` over the clients axis: about half a full sort's time on a CPU)."""
  n = jnp.sum(alive)
  m = a.shape[0]
  flat = jnp.where(_expand(alive, a), a, -jnp.inf).reshape(m, -1).T  # [d, m], dead last
  top = jax.lax.top_k(flat, m // 2 + 1)[0]  # [d, m // 2 + 1], decreasing
  hi = jax.lax.dynamic_index_in_dim(top, jnp.maximum((n - 1) // 2, 0), axis=1, keepdims=False)
  lo = jax.lax.dynamic_index_in_dim(top, jnp.maximum(n // 2, 0), axis=1, keepdims=False)
  median = ((lo + hi) / 2).reshape(a.shape[1:])
  return jnp.where(n > 0, median, jnp.zeros_like(median))


def coordinate_median() -> Rule:
  r"""The coordinate-wise median of the surviving clients' values (Yin et al. 2018).

  Each coordinate is the median of the clients' values of it (the mean of the two middle
  ones for an even count), ignoring the weights: it tolerates fewer than half the clients
  being Byzantine. A round nobody survived gives 0.

  Returns:
    a :class:`Rule`.

  Examples:
    >>> import jax.numpy as jnp
    >>> from fedco import byzantine
    >>> values = jnp.array([[1.0, 5.0], [2.0, -9.0], [50.0, 6.0], [3.0, 7.0]])
    >>> byzantine.coordinate_median()(values, jnp.full(4, 0.25)).tolist()
    [2.5, 5.5]
  """

  def fn(values, weights, alive, centered):
    del weights, centered
    return jax.tree.map(lambda a: _median_leaf(a, alive), values)

  return Rule("coordinate_median", {}, fn)


def trimmed_mean(beta: float) -> Rule:
  r"""The coordinate-wise :math:`\beta`-trimmed mean (Yin et al. 2018).

  Of the :math:`n` surviving clients, each coordinate drops its :math:`\lfloor \beta n
  \rfloor` largest and as many smallest values and averages the rest (uniformly): it
  tolerates a fraction of Byzantine clients below :math:`\beta`.

  Args:
    beta: the fraction trimmed from each end, in ``[0, 0.5)``.

  Returns:
    a :class:`Rule`.

  Raises:
    ValueError: ``beta`` outside ``[0, 0.5)``.

  Examples:
    >>> import jax.numpy as jnp
    >>> from fedco import byzantine
    >>> values = jnp.array([[1.0], [2.0], [3.0], [4.0], [100.0]])
    >>> byzantine.trimmed_mean(0.2)(values, jnp.full(5, 0.2)).tolist()  # drops 1 and 100
    [3.0]
  """
  _validate.interval("beta", beta, 0, 0.5, closed_low=True)
  beta = float(beta)

  def leaf(a, alive):
    # With v_1 >= ... >= v_n the surviving values, the kept ones are v_{b+1}, ..., v_{n-b}:
    # clipping every value to [v_{n-b}, v_{b+1}] and summing gives their sum plus
    # b (v_{b+1} + v_{n-b}), with no huge outlier left to cancel. Both order statistics
    # come from lax.top_k over at most floor(beta m) + 1 values, not a full sort.
    m = a.shape[0]
    n = jnp.sum(alive)
    b = jnp.floor(beta * n).astype(n.dtype)
    live = _expand(alive, a)
    flat = lambda x: x.reshape(m, -1).T  # [d, m]
    k = min(int(beta * m) + 1, m)
    high = jax.lax.top_k(flat(jnp.where(live, a, -jnp.inf)), k)[0]
    low = -jax.lax.top_k(flat(jnp.where(live, -a, -jnp.inf)), k)[0]
    at = jnp.clip(b, 0, k - 1)
    hi = jax.lax.dynamic_index_in_dim(high, at, axis=1, keepdims=False).reshape(a.shape[1:])
    lo = jax.lax.dynamic_index_in_dim(low, at, axis=1, keepdims=False).reshape(a.shape[1:])
    total = jnp.sum(jnp.where(live, jnp.clip(a, lo, hi), 0), axis=0)
    kept = total - b.astype(a.dtype) * (hi + lo)
    return jnp.where(n > 0, kept / jnp.maximum(n - 2 * b, 1).astype(a.dtype), 0)

  def fn(values, weights, alive, centered):
    del weights, centered
    return jax.tree.map(lambda a: leaf(a, alive), values)

  return Rule("trimmed_mean", {"beta": beta}, fn)


def _flat(values):
  """``[m, d]``: each client's upload of a field as one vector (every leaf, in order)."""
  leaves = jax.tree.leaves(values)
  dtype = jnp.result_type(*leaves)
  return jnp.concatenate([jnp.reshape(a, (a.shape[0], -1)).astype(dtype) for a in leaves], 1)


def krum_scores(values, alive, f: int) -> jax.Array:
  r"""Krum's score of each client (Blanchard et al. 2017).

  The sum of its squared distances to its :math:`n - f - 2` nearest other surviving clients
  (at least 1); ``+inf`` for the others.

  Args:
    values: a pytree of ``[m, ...]`` uploads (the whole field is one vector).
    alive: ``bool [m]``.
    f: the number of Byzantine clients tolerated.

  Returns:
    ``[m]`` scores.

  Examples:
    >>> import jax.numpy as jnp
    >>> from fedco import byzantine
    >>> values = jnp.array([[0.0], [1.0], [3.0]])
    >>> byzantine.krum_scores(values, jnp.array([True, True, True]), 0).tolist()  # 1 nearest
    [1.0, 1.0, 4.0]
  """
  x = _flat(values)
  sq = jnp.sum(x * x, axis=1)
  d2 = jnp.maximum(sq[:, None] + sq[None, :] - 2 * (x @ x.T), 0)
  m = x.shape[0]
  pair = alive[:, None] & alive[None, :] & ~jnp.eye(m, dtype=bool)
  d2 = jnp.sort(jnp.where(pair, d2, jnp.inf), axis=1)
  n = jnp.sum(alive)
  k = jnp.clip(n - f - 2, 1, max(m - 1, 1))
  near = jnp.arange(m)[None, :] < k
  scores = jnp.sum(jnp.where(near, d2, 0), axis=1)
  return jnp.where(alive, scores, jnp.inf)


def _krum_fn(f: int, select: int):
  def fn(values, weights, alive, centered):
    del weights, centered
    scores = krum_scores(values, alive, f)
    n = jnp.sum(alive)
    rank = jnp.argsort(jnp.argsort(scores, stable=True), stable=True)
    chosen = alive & (rank < jnp.minimum(select, n))
    return weighted_client_mean(values, chosen / jnp.maximum(jnp.sum(chosen), 1))

  return fn


def krum(f: int) -> Rule:
  r"""Krum (Blanchard et al. 2017): the upload with the smallest Krum score.

  The one surviving client's upload with the smallest :func:`krum_scores` (ties: the lowest
  slot), tolerating ``f`` Byzantine clients of :math:`n > 2f + 2`.

  Args:
    f: the number of Byzantine clients tolerated, an int ``>= 0``.

  Returns:
    a :class:`Rule`.

  Examples:
    >>> import jax.numpy as jnp
    >>> from fedco import byzantine
    >>> values = jnp.array([[0.0], [0.1], [0.3], [9.0]])
    >>> byzantine.krum(1)(values, jnp.full(4, 0.25)).tolist()
    [0.1]
  """
  f = _validate.positive_int("f", f, minimum=0)
  return Rule("krum", {"f": f}, _krum_fn(f, 1))


def multi_krum(f: int, m: int) -> Rule:
  r"""Multi-Krum (Blanchard et al. 2017): the mean of the ``m`` best-scored uploads.

  The uniform mean of the ``m`` surviving clients' uploads with the smallest
  :func:`krum_scores` (all of them if fewer survive).

  Args:
    f: the number of Byzantine clients tolerated, an int ``>= 0``.
    m: how many uploads are averaged, an int ``>= 1`` (``m = 1`` is :func:`krum`).

  Returns:
    a :class:`Rule`.

  Examples:
    >>> import jax.numpy as jnp
    >>> from fedco import byzantine
    >>> values = jnp.array([[0.0], [0.1], [0.3], [9.0]])
    >>> [round(v, 4) for v in byzantine.multi_krum(1, 2)(values, jnp.full(4, 0.25)).tolist()]
    [0.05]
  """
  f = _validate.positive_int("f", f, minimum=0)
  m = _validate.positive_int("m", m)
  return Rule("multi_krum", {"f": f, "m": m}, _krum_fn(f, m))


def centered_clipping(tau: float, iterations: int = 1) -> Rule:
  r"""Centered clipping (Karimireddy, He and Jaggi 2021).

  From a start :math:`v_0` (0 for changes from the server's copy, the coordinate-wise
  median for values sent as such), ``iterations`` times

  .. math::  v \leftarrow v + \sum_k \tilde w_k\, (x_k - v) \min\!\Big(1,
     \frac{\tau}{\lVert x_k - v \rVert}\Big),

  with :math:`\tilde w` the plan's weights of the surviving clients, renormalised, and the
  norm over the whole field.

  Args:
    tau: the clipping radius, ``> 0``.
    iterations: ``L >= 1`` (the paper: 1 suffices with momentum).

  Returns:
    a :class:`Rule`.

  Examples:
    >>> import jax.numpy as jnp
    >>> from fedco import byzantine
    >>> values = jnp.array([[1.0, 0.0], [0.0, 1.0], [100.0, 0.0]])
    >>> center = byzantine.centered_clipping(1.0)(values, jnp.full(3, 1 / 3))
    >>> [round(v, 4) for v in center.tolist()]
    [0.6667, 0.3333]
  """
  tau = _validate.positive("tau", tau)
  iterations = _validate.positive_int("iterations", iterations)

  def fn(values, weights, alive, centered):
    w = jnp.where(alive, weights, 0)
    w = w / jnp.maximum(jnp.sum(w), jnp.finfo(w.dtype).tiny)
    if centered:
      v = jax.tree.map(lambda a: jnp.zeros_like(a[0]), values)
    else:
      v = jax.tree.map(lambda a: _median_leaf(a, alive), values)
    for _ in range(iterations):
      diff = jax.tree.map(lambda a, c: a - c, values, v)
      norms = jax.vmap(optax.global_norm)(diff)
      factor = w * jnp.minimum(1, tau / jnp.maximum(norms, jnp.finfo(norms.dtype).tiny))
      v = jax.tree.map(jnp.add, v, weighted_client_mean(diff, factor))
    return v

  return Rule("centered_clipping", {"tau": tau, "iterations": iterations}, fn)


def with_rule(server, rule: Rule) -> ServerAggregator:
  """An algorithm's server taking its means of client values by ``rule``.

  ``server`` is an optax transform or a :class:`~fedco.extend.ServerAggregator` that
  ``combines``; this is what a run's ``aggregation=`` does to its algorithm's server.

  Args:
    server: an algorithm's ``server``.
    rule: a :class:`Rule`.

  Returns:
    a :class:`~fedco.extend.ServerAggregator` that reads every client's values.

  Raises:
    ValueError: ``rule`` is no :class:`Rule`, or ``server`` is an aggregator that combines
      client values itself (``combines=False``), which a rule cannot reach.

  Examples:
    >>> import fedco
    >>> from fedco import byzantine
    >>> byzantine.with_rule(fedco.afl(0.1).server, byzantine.krum(1)).reads_each
    True
    >>> byzantine.with_rule(fedco.scaffold(0.1, 2).server, byzantine.krum(1))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: aggregation cannot reach this algorithm's server: ...
  """
  if not isinstance(rule, Rule):
    raise ValueError(
      f"aggregation must be a fedco.byzantine rule (coordinate_median(), krum(f), ...), got {rule!r}"
    )
  agg = as_aggregator(server)
  if not agg.combines:
    raise ValueError(
      "aggregation cannot reach this algorithm's server: its ServerAggregator combines the "
      "clients' values itself (one that takes its means through RoundInfo.center declares "
      "combines=True)"
    )

  def update(values, state, client_values, info: RoundInfo):
    return agg.update(values, state, client_values, info._replace(combine=rule))

  return agg._replace(update=update, reads_each=True)


def robust_server(
  rule: Rule, tx: Optional[optax.GradientTransformation] = None
) -> ServerAggregator:
  r"""A server that moves by ``tx`` along the ``rule``'s center of the clients' changes.

  For each server value :math:`\bar v` (the model and the plan's ``every_round`` fields)
  the clients' changes :math:`v_k - \bar v` are combined by ``rule`` (``centered=True``) into
  :math:`c`, and ``tx`` takes the pseudo-gradient :math:`-c` (``optax.sgd(1.0)``: move to
  :math:`\bar v + c`; with :func:`mean`, FedAvg's server up to round-off). In a
  simulation, ``aggregation=rule`` does this to the algorithm's own server, and to the
  plan's other means too.

  Args:
    rule: a :class:`Rule`.
    tx: an optax transformation on ``{"params": ..., field: ...}`` dicts; ``None``:
      ``optax.sgd(1.0)`` (plain averaging).

  Returns:
    a :class:`~fedco.extend.ServerAggregator` that reads every client's values.

  Examples:
    FedAvg with a median server, one round of three clients (one far off):

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> from fedco import byzantine, extend
    >>> server = byzantine.robust_server(byzantine.coordinate_median())
    >>> opt = fedco.fedavg(0.1, 2).replace(server=server)
    >>> info = extend.RoundInfo(ids=jnp.arange(3), weights=jnp.full(3, 1 / 3),
    ...                         counts=jnp.ones(3, int), num_clients=3,
    ...                         key=jax.random.key(0), client_losses=None)
    >>> values = {"params": jnp.zeros(1)}
    >>> clients = {"params": jnp.array([[1.0], [2.0], [100.0]])}
    >>> values, _ = server.update(values, server.init(values, info.counts), clients, info)
    >>> values["params"].tolist(), opt.server.reads_each
    ([2.0], True)
  """
  return with_rule(optax_aggregator(optax.sgd(1.0) if tx is None else tx), rule)


@dataclasses.dataclass(frozen=True)
class Attack:
  """Byzantine clients: who they are and what they send (build with :func:`attack`).

  Attributes:
    fraction: the fraction of all clients that are Byzantine, in ``[0, 1)``.
    kind: ``"sign_flip"``, ``"scale"`` or ``"gaussian"``.
    scale: the attack's size (see :func:`attack`).
    fields: the uploads attacked (names of the plan's fields and ``"params"``); ``None``:
      every field the algorithm sends.
    seed: draws the Byzantine clients (and seeds nothing else).

  Examples:
    >>> import jax
    >>> import jax.numpy as jnp
    >>> from fedco import byzantine
    >>> spec = byzantine.attack(0.5, "sign_flip", scale=2.0)
    >>> keys = jax.random.split(jax.random.key(0), 2)
    >>> spec.corrupt(jnp.ones((2, 1)), jnp.array([False, True]), keys).tolist()
    [[1.0], [-2.0]]
  """

  fraction: float
  kind: str
  scale: float
  fields: Optional[Tuple[str, ...]]
  seed: int

  def clients(self, num_clients: int) -> np.ndarray:
    """The Byzantine clients' ids (sorted): the first ``round(fraction K)`` of a
    permutation of the ``K`` clients drawn from ``seed``."""
    count = int(round(self.fraction * num_clients))
    order = np.random.default_rng(self.seed).permutation(num_clients)
    return np.sort(order[:count]).astype(np.int32)

  def attacks(self, field: str) -> bool:
    return self.fields is None or field in self.fields

  def corrupt(self, uploads, byzantine, keys):
    """``uploads`` (leading ``[m]`` axis) with the slots marked in ``byzantine`` replaced
    by the attack's; ``keys`` ``[m]``: each slot's PRNG key (Gaussian draws)."""

    def one(a, key):
      if self.kind == "sign_flip":
        return -self.scale * a
      if self.kind == "scale":
        return self.scale * a
      return (self.scale * jax.random.normal(key, a.shape)).astype(a.dtype)

    leaves, treedef = jax.tree.flatten(uploads)
    out = []
    for i, a in enumerate(leaves):
      bad = jax.vmap(one)(a, jax.vmap(jax.random.fold_in, (0, None))(keys, i))
      out.append(jnp.where(_expand(byzantine, a), bad, a))
    return jax.tree.unflatten(treedef, out)

  def describe(self) -> Dict[str, Any]:
    return {
      "fraction": self.fraction,
      "kind": self.kind,
      "scale": self.scale,
      "fields": None if self.fields is None else list(self.fields),
      "seed": self.seed,
    }


def attack(
  fraction: float,
  kind: str = "sign_flip",
  *,
  scale: Optional[float] = None,
  fields=None,
  seed: int = 0,
) -> Attack:
  r"""Byzantine clients for a run's ``byzantine=``.

  ``round(fraction K)`` clients, the same all run (drawn from ``seed``), send in place of
  each attacked upload :math:`u` (their honest change from the server's copy, or the value
  itself for fields sent as values):

  * ``"sign_flip"``: :math:`-\,\mathrm{scale}\; u` (default scale 1);
  * ``"scale"``: :math:`\mathrm{scale}\; u` (default 10; on a loss or ``y`` report, an
    inflated report);
  * ``"gaussian"``: :math:`\mathcal N(0, \mathrm{scale}^2)` in every coordinate (default 1).

  They skip their codec and clip. For clients that train on flipped labels instead, see
  :func:`flip_labels`.

  Args:
    fraction: in ``[0, 1)``.
    kind: one of ``"sign_flip"``, ``"scale"``, ``"gaussian"``.
    scale: a number (``> 0`` for ``"gaussian"``); ``None``: the kind's default.
    fields: a field name or a sequence of them (``"params"``, ``"y"``, ``"loss"``...);
      ``None``: every field sent. Checked against the algorithm when the run starts.
    seed: an int ``>= 0``: which clients are Byzantine.

  Returns:
    an :class:`Attack`.

  Raises:
    ValueError: a value outside those ranges.

  Examples:
    >>> from fedco import byzantine
    >>> spec = byzantine.attack(0.2, "scale", fields="loss", seed=3)
    >>> spec.scale, spec.fields, spec.clients(10).tolist()
    (10.0, ('loss',), [6, 9])
  """
  _validate.interval("fraction", fraction, 0, 1, closed_low=True)
  if kind not in ATTACKS:
    raise ValueError(f"kind must be one of {list(ATTACKS)}, got {kind!r}")
  scale = DEFAULT_SCALE[kind] if scale is None else scale
  if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
    raise ValueError(f"scale must be a finite number, got {scale!r}")
  if kind == "gaussian":
    _validate.positive("scale", scale)
  if fields is not None:
    fields = (fields,) if isinstance(fields, str) else tuple(fields)
    if not fields or not all(isinstance(f, str) for f in fields):
      raise ValueError(
        f"fields must be a field name or a non-empty sequence of them, got {fields!r}"
      )
  seed = _validate.positive_int("seed", seed, minimum=0)
  return Attack(float(fraction), kind, float(scale), fields, seed)


def flip_labels(data, spec: Attack, num_classes: int, label_key: str = "y"):
  """``data`` whose Byzantine clients (``spec.clients``) hold labels ``C - 1 - y``.

  The label-flipping attack: those clients train honestly on wrong labels. Their rows are
  copied (a row shared with an honest client keeps its label there).

  Args:
    data: a :class:`fedco.FederatedData` with integer labels under ``label_key``.
    spec: an :class:`Attack` (its ``kind`` and ``scale`` are not used).
    num_classes: ``C``, an int ``>= 2``.
    label_key: the examples' label field.

  Returns:
    a new :class:`fedco.FederatedData`.

  Examples:
    >>> import numpy as np
    >>> import fedco
    >>> from fedco import byzantine
    >>> data = fedco.FederatedData.from_clients(
    ...   [{"x": np.zeros((2, 1)), "y": np.array([0, 1])} for _ in range(2)])
    >>> flipped = byzantine.flip_labels(data, byzantine.attack(0.5, seed=0), 3)
    >>> [flipped.client(k)["y"].tolist() for k in range(2)]
    [[2, 1], [0, 1]]
  """
  num_classes = _validate.positive_int("num_classes", num_classes, minimum=2)
  if not isinstance(data.examples, dict) or label_key not in data.examples:
    raise ValueError(f"label_key {label_key!r} is not a field of the data's examples")
  bad = set(spec.clients(data.num_clients).tolist())
  clients = []
  for k in range(data.num_clients):
    client = {key: np.asarray(v) for key, v in data.client(k).items()}
    if k in bad:
      client[label_key] = (num_classes - 1 - client[label_key]).astype(client[label_key].dtype)
    clients.append(client)
  return type(data).from_clients(clients)


__all__ = [
  "ATTACKS",
  "RULES",
  "Attack",
  "Rule",
  "attack",
  "centered_clipping",
  "coordinate_median",
  "flip_labels",
  "krum",
  "krum_scores",
  "mean",
  "multi_krum",
  "robust_server",
  "trimmed_mean",
  "with_rule",
]
