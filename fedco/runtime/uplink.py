"""What a round does to the uploads of fields that have a codec or a privacy mechanism.

A client's upload of a field is its *delta* from a value the server already holds (the
shared ``y_bar`` an ``every_step`` field started the step from; the server's model and
``every_round`` fields for the round's end) or, for values the server has no copy of
(``round_start`` inner values, ``report`` fields), the value itself. On the client the
delta passes through the field's codec (:mod:`fedco.compression`, its state kept per
client) and is clipped to the field's bound (:mod:`fedco.privacy`); the server decodes it,
adds it back to its reference and adds Gaussian noise: once to the weighted mean where that
is all it uses (``mean``), or to each client's value where it reads them all (``each``).

Fields with neither a codec nor a clip bound take the runtime's plain path, unchanged, so a
run without ``compression`` and ``privacy`` is bit-identical to one before they existed.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Optional, Tuple, Union

import jax
import jax.numpy as jnp
import optax

from fedco import compression as compression_lib
from fedco import privacy as privacy_lib
from fedco.algorithms.base import get_field, weighted_client_mean
from fedco.algorithms.core import ftrl

PyTree = Any


@dataclasses.dataclass(frozen=True, eq=False)
class Uplink:
  r"""The per-field codecs and clip bounds of a run, and its noise multiplier.

  Attributes:
    codecs: ``{field: Codec}``.
    clip: ``{field: bound}`` (every sent field under privacy; empty without).
    noise_multiplier: ``z`` (0 without privacy).
    privacy: the :class:`~fedco.privacy.ClientDP` (resolved ``noise_multiplier``) or ``None``.
    messages: messages per sampled client per round, by field (the accountant's count).
    sampling_rate: ``clients_per_round / K``.
    server_reads_each: the server reads every client's params and ``every_round`` values (a
      ``ServerAggregator`` with ``reads_each``), so their noise goes on each upload.
    init_messages: the ``at_init`` fields every client sends once, before round 1 (their
      mean starts every client's trackers); clipped and noised like the rest.
    rule: the run's aggregation rule (:mod:`fedco.byzantine`; ``aggregation=``) or
      ``None``: it combines every message this uplink sends in place of the weighted mean
      (noise then goes on each client's upload).
    attack: the run's Byzantine clients (:func:`fedco.byzantine.attack`) or ``None``.
    byzantine_ids: ``int32``, their ids (sorted), when ``attack`` is set.
    routed: the fields sent through this uplink because of ``rule`` or ``attack`` (every
      field sent), beside those with a codec or a clip bound.
    adapted: the fields whose clip bound adapts (:mod:`~fedco.runtime.adaptive_clip`): those
      sent once at a round's end, under ``privacy``'s ``adaptive``; ``clip`` holds their
      starting bounds.
    update_multiplier: their uploads' noise multiplier :math:`z_\Delta` (the bits take the
      rest of ``noise_multiplier``'s budget).
    count_noise: :math:`\sigma_b`, the noise on each round's count of clients within the
      bound.
    tree_rounds: under DP-FTRL (``privacy`` a :class:`~fedco.privacy.TreeDP`), the rounds
      of each tree (``K // m``); 0 otherwise. The uplink then only clips the model
      (``noise_multiplier`` 0); the server (:meth:`tree_server`) adds the tree's noise.
  """

  codecs: Mapping[str, compression_lib.Codec]
  clip: Mapping[str, float]
  noise_multiplier: float
  privacy: Optional[privacy_lib.ClientDP]
  messages: Mapping[str, int]
  sampling_rate: float
  server_reads_each: bool
  init_messages: int = 0
  rule: Any = None
  attack: Any = None
  byzantine_ids: Any = None
  routed: Tuple[str, ...] = ()
  adapted: Tuple[str, ...] = ()
  update_multiplier: float = 0.0
  count_noise: float = 0.0
  tree_rounds: int = 0

  @property
  def tree(self) -> Optional[privacy_lib.TreeDP]:
    """The run's DP-FTRL mechanism (its ``noise_multiplier`` resolved), or ``None``."""
    return self.privacy if self.tree_rounds else None  # type: ignore[return-value]

  def tree_server(self, clients_per_round: int):
    """DP-FTRL's server for a cohort of ``clients_per_round`` (:mod:`fedco.algorithms.core.ftrl`)."""
    spec = self.tree
    assert spec is not None and spec.noise_multiplier is not None
    return ftrl.ftrl_aggregator(
      spec.learning_rate,
      noise_std=spec.noise_multiplier * spec.clip / clients_per_round,
      rounds_per_tree=self.tree_rounds,
      clients_per_round=clients_per_round,
      momentum=spec.momentum,
      nesterov=spec.nesterov,
      efficient=spec.efficient,
    )

  def handles(self, field: str) -> bool:
    return field in self.codecs or field in self.clip or field in self.routed

  def multiplier(self, field: str) -> float:
    """The noise multiplier of ``field``'s uploads (``z_Delta`` for an adapted field)."""
    return self.update_multiplier if field in self.adapted else self.noise_multiplier

  def fields(self, names) -> Tuple[str, ...]:
    return tuple(f for f in names if self.handles(f))

  @property
  def private(self) -> bool:
    return self.privacy is not None

  @property
  def spends(self) -> bool:
    """Whether the run spends a finite epsilon (privacy with noise: the uplink's, or the
    DP-FTRL server's)."""
    if self.tree is not None:
      return bool(self.tree.noise_multiplier)
    return self.private and self.noise_multiplier > 0

  def epsilon(self, rounds):
    """Epsilon spent after ``rounds`` rounds (int or sequence), ``None`` without privacy."""
    if self.privacy is None:
      return None
    if self.tree is not None:
      assert self.tree.noise_multiplier is not None
      return privacy_lib.tree_epsilon_spent(
        self.tree.noise_multiplier, self.tree_rounds, rounds, self.tree.delta
      )
    return privacy_lib.epsilon_spent(
      self.noise_multiplier,
      self.sampling_rate,
      sum(self.messages.values()),
      rounds,
      self.privacy.delta,
      init_messages=self.init_messages,
      accountant=self.privacy.accountant,
    )

  def describe(self) -> Dict[str, Any]:
    """What a fingerprint and a ledger record about the uplink."""
    out: Dict[str, Any] = {"codecs": {f: c.name for f, c in sorted(self.codecs.items())}}
    spec = self.tree
    if spec is not None:
      out.update(
        mechanism="dp_ftrl",
        clip=dict(sorted(self.clip.items())),
        noise_multiplier=spec.noise_multiplier,
        delta=spec.delta,
        rounds_per_tree=self.tree_rounds,
        learning_rate=spec.learning_rate,
        momentum=spec.momentum,
        nesterov=spec.nesterov,
        efficient_tree=spec.efficient,
        accounting="RDP of tree aggregation (zCDP, replace-one-by-zero), one tree per epoch",
      )
    elif self.privacy is not None:
      out.update(
        clip=dict(sorted(self.clip.items())),
        noise_multiplier=self.noise_multiplier,
        delta=self.privacy.delta,
        messages_per_round=dict(self.messages),
        messages_at_init=self.init_messages,
        sampling_rate=self.sampling_rate,
        accounting="RDP; fixed-size client samples accounted as Poisson at clients_per_round / K",
      )
      if self.privacy.accountant != "rdp":  # only then: earlier runs keep their fingerprints
        out["accountant"] = self.privacy.accountant
        out["accounting"] = out["accounting"].replace("RDP", self.privacy.accountant.upper())
    if self.adapted:  # only then: earlier runs keep their fingerprints
      assert self.privacy is not None and self.privacy.adaptive is not None
      out["adaptive_clipping"] = {
        "fields": list(self.adapted),
        "target_quantile": self.privacy.adaptive.target_quantile,
        "learning_rate": self.privacy.adaptive.learning_rate,
        "count_noise": self.count_noise,
        "update_multiplier": self.update_multiplier,
      }
    if self.rule is not None:  # only then: earlier runs keep their fingerprints
      out["aggregation"] = self.rule.describe()
    if self.attack is not None:
      out["byzantine"] = self.attack.describe()
    return out

  # ---- per-client codec state ----------------------------------------------------------

  def init(self, server, shared, clients, num_clients: int) -> Dict[str, PyTree]:
    """Every client's codec state per field, stacked on a leading ``[K]`` axis."""
    out = {}
    for f, codec in self.codecs.items():
      template = _reference(f, server, shared, clients)
      state = codec.init(template)
      out[f] = jax.tree.map(lambda a: jnp.broadcast_to(a, (num_clients,) + jnp.shape(a)), state)
    return out

  def private_init_mean(self, field: str, values, weights, key):
    """The ``at_init`` mean of ``field`` over all clients: each value clipped, noise of
    ``z clip max(weights)`` on the mean (the trackers' start is data too)."""
    mean = self.clipped_sum(field, values, weights)
    return self.init_noise(field, mean, jnp.max(weights), key)

  def clipped_sum(self, field: str, values, weights):
    """``sum_k w_k clip(v_k)`` over the leading axis of ``values``: the private ``at_init``
    mean before its noise, or one block's part of it (a streamed run's pass)."""
    return weighted_client_mean(_clip_each(values, self.clip[field]), weights)

  def init_noise(self, field: str, mean, max_weight, key):
    """``mean`` with the ``at_init`` noise of ``z clip max_weight`` (``max_weight``: the
    largest weight over all clients)."""
    if not self.noise_multiplier:
      return mean
    return _add_noise(mean, self.noise_multiplier * self.clip[field] * max_weight, key)

  # ---- one message of one field from the round's slots ----------------------------------

  def encode(self, field: str, values, reference, ustate, keys, sending, ids=None, bound=None):
    """Client side: ``(deltas as the server decodes them, new codec states)``; ``values``
    and ``keys`` have a leading slots axis, ``reference`` has none (``None``: zeros).
    Slots not ``sending`` (dropped clients, finished stragglers) send nothing: their
    decoded delta is 0 and their codec state is kept. Byzantine clients among ``ids``
    send the attack's upload instead (after their codec and clip, which they skip).
    ``bound``: this round's clip bound of an adapted field (default: the fixed one)."""
    if reference is None:
      deltas = values
    else:
      deltas = jax.tree.map(lambda v, r: v - r, values, reference)
    mask = lambda a: sending.reshape(sending.shape + (1,) * (a.ndim - 1))
    codec = self.codecs.get(field)
    new = None
    if codec is not None:
      coded, new = jax.vmap(lambda d, s, k: codec.update(d, s, key=k))(deltas, ustate[field], keys)
      deltas = coded
    bound = self.clip.get(field) if bound is None else bound
    if bound is not None:
      clipped = _clip_each(deltas, bound)
      if isinstance(new, compression_lib.TopKState) and jax.tree.leaves(new.error):
        # error feedback keeps what clipping removed too, so it is sent later
        new = compression_lib.TopKState(
          jax.tree.map(lambda e, c, k: e + c - k, new.error, deltas, clipped)
        )
      deltas = clipped
    if self.attack is not None and ids is not None and self.attack.attacks(field):
      bad = self.is_byzantine(ids)
      deltas = self.attack.corrupt(
        deltas, bad, jax.vmap(jax.random.fold_in, (0, None))(keys, ATTACK_STREAM)
      )
    if new is not None:
      ustate = {
        **ustate,
        field: jax.tree.map(lambda n, o: jnp.where(mask(n), n, o), new, ustate[field]),
      }
    deltas = jax.tree.map(lambda d: jnp.where(mask(d), d, jnp.zeros_like(d)), deltas)
    return deltas, ustate

  def is_byzantine(self, ids) -> jax.Array:
    """``bool``, per slot: whether client ``ids`` are Byzantine."""
    bad = jnp.asarray(self.byzantine_ids, jnp.int32)
    if bad.size == 0:
      return jnp.zeros(jnp.shape(ids), bool)
    at = jnp.clip(jnp.searchsorted(bad, ids), 0, bad.size - 1)
    return bad[at] == ids

  def send_mean(self, field, values, reference, weights, ustate, key, ids, alive):
    """The server's weighted mean of one message (plus noise): ``(mean, codec states)``.
    ``key`` is the message's; client ``ids`` are folded into it for the codecs. Under an
    aggregation rule: the rule's center of the clients' uploads, each with its own noise."""
    if self.rule is not None:
      sent, ustate = self.send_each(
        field,
        values,
        reference,
        weights,
        ustate,
        key,
        ids,
        alive,
        shared_noise=False,
        decoded=False,
      )
      center = self.rule(sent, weights, alive, centered=reference is not None)
      if reference is not None:
        center = jax.tree.map(jnp.add, reference, center)
      return center, ustate
    keys = _client_keys(key, ids)
    deltas, ustate = self.encode(field, values, reference, ustate, keys, alive, ids)
    mean = weighted_client_mean(deltas, weights)
    if self.noise_multiplier and field in self.clip:
      std = self.noise_multiplier * self.clip[field] * jnp.max(weights)
      mean = _add_noise(mean, std, jax.random.fold_in(key, 1))
    if reference is not None:
      mean = jax.tree.map(jnp.add, reference, mean)
    return mean, ustate

  def send_each(
    self,
    field,
    values,
    reference,
    weights,
    ustate,
    key,
    ids,
    alive,
    *,
    shared_noise: bool,
    decoded: bool = True,
    bound=None,
  ):
    """Every client's value as the server decodes it: ``(values, codec states)``. With
    ``shared_noise`` the server averages them with ``weights`` (summing to 1), so one noise
    draw added to all lands once on that mean; otherwise each value gets its own.
    ``decoded=False``: the changes from ``reference``, not added back to it. ``bound``:
    this round's clip bound of an adapted field."""
    keys = _client_keys(key, ids)
    bound = self.clip.get(field) if bound is None else bound
    deltas, ustate = self.encode(field, values, reference, ustate, keys, alive, ids, bound)
    if self.noise_multiplier and field in self.clip:
      nkey = jax.random.fold_in(key, 1)
      one = jax.tree.map(lambda a: a[0], deltas)  # one upload's shapes
      std: Union[float, jax.Array]
      if shared_noise:
        std = self.multiplier(field) * bound * jnp.max(weights)
        noise = _noise(one, std, nkey)
        deltas = jax.tree.map(lambda d, z: d + z, deltas, noise)
      else:  # each client's own draw, keyed by its id (not its slot)
        std = self.multiplier(field) * bound
        noise = jax.vmap(lambda k: _noise(one, std, k))(
          jax.vmap(jax.random.fold_in, (None, 0))(nkey, ids)
        )
        deltas = jax.tree.map(jnp.add, deltas, noise)
    if reference is not None and decoded:
      deltas = jax.tree.map(lambda d, r: d + r, deltas, reference)
    return deltas, ustate


# Folded into a slot's codec key for a Byzantine client's own draws.
ATTACK_STREAM = 0xB12A


def _client_keys(key, ids):
  """Each slot's codec key: the message key folded with the slot's client id, so a client's
  randomness does not depend on which others were sampled."""
  return jax.vmap(jax.random.fold_in, (None, 0))(jax.random.fold_in(key, 0), ids)


def _clip_each(values, bound):
  """Each upload (leading slots axis) clipped to global L2 norm ``bound``."""
  clip = optax.clip_by_global_norm(bound)
  return jax.vmap(lambda v: clip.update(v, optax.EmptyState())[0])(values)


def _noise(tree, std, key):
  """Gaussian noise of standard deviation ``std`` shaped and typed like ``tree``."""
  leaves, treedef = jax.tree.flatten(tree)
  keys = jax.random.split(key, len(leaves))
  return jax.tree.unflatten(
    treedef, [(std * jax.random.normal(k, a.shape)).astype(a.dtype) for a, k in zip(leaves, keys)]
  )


def _add_noise(tree, std, key):
  return jax.tree.map(jnp.add, tree, _noise(tree, std, key))


def _reference(field, server, shared, clients):
  """One client's value of ``field``'s shape: the server's copy or client 0's."""
  if field in server:
    return server[field]
  if field in shared:
    return shared[field]
  return jax.tree.map(lambda a: a[0], get_field(clients, field))
