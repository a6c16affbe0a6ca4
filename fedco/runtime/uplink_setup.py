"""A run's uplink built from its arguments: ``compression``, ``privacy``, ``aggregation`` and
``byzantine`` checked against the algorithm's communication plan (one-line ``ValueError``
naming the argument), and what each field is sent as."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Optional, Tuple, cast

import optax

from fedco import byzantine as byzantine_lib
from fedco import compression as compression_lib
from fedco import privacy as privacy_lib
from fedco.algorithms.base import as_aggregator
from fedco.runtime.uplink import Uplink


def sent_fields(plan) -> Tuple[str, ...]:
  """Every field a client sends up: ``params`` and the plan's communicated state fields."""
  names = (
    ("params",)
    + tuple(plan.every_step)
    + tuple(plan.every_round)
    + tuple(plan.round_start)
    + tuple(plan.report)
    + tuple(plan.init_fields)
  )
  return tuple(dict.fromkeys(names))


def delta_fields(plan) -> Tuple[str, ...]:
  """The fields sent as changes from a server copy (the others are sent as values)."""
  return ("params",) + tuple(plan.every_step) + tuple(plan.every_round)


def _codecs(algorithm, compression) -> Dict[str, Any]:
  """``compression`` checked against what ``algorithm`` sends: ``{field: codec}``."""
  plan = algorithm.plan
  sent = sent_fields(plan)
  if not isinstance(compression, Mapping):
    raise ValueError(
      f"compression must be a dict {{field: fedco.compression codec}}, got "
      f"{type(compression).__name__}"
    )
  codecs = {}
  for field, codec in compression.items():
    if field not in sent:
      raise ValueError(
        f"compression names field {field!r}, which {algorithm.name} does "
        f"not send; it sends {list(sent)}"
      )
    if not isinstance(codec, compression_lib.Codec):
      raise ValueError(
        f"compression[{field!r}] must be a fedco.compression codec "
        f"(stochastic_quantization, top_k, ...), got {codec!r}"
      )
    if codec.memory and field not in delta_fields(plan):
      raise ValueError(
        f"compression[{field!r}] keeps an error-feedback memory, but "
        f"{algorithm.name} sends {field!r} as a value (not a change from "
        f"a server copy): last round's remainder would enter a new "
        f"statistic; use stochastic_quantization or "
        f"top_k(error_feedback=False)"
      )
    codecs[field] = codec
  return codecs


def _clip(algorithm, privacy) -> Dict[str, float]:
  """``privacy`` checked against ``algorithm`` (uniform weights, no loss queries, a clip
  bound for every field it sends and none other): ``{field: clip bound}``."""
  plan = algorithm.plan
  sent = sent_fields(plan)
  if not isinstance(privacy, privacy_lib.ClientDP):
    raise ValueError(
      f"privacy must be fedco.privacy.gaussian(...) or fedco.privacy.dp_ftrl(...), got {privacy!r}"
    )
  if as_aggregator(algorithm.server).queries_losses:
    raise ValueError(
      f"privacy cannot cover {algorithm.name}: its server queries client "
      f"losses outside its communication plan (DRFA's loss queries)"
    )
  if plan.weighting != "uniform":
    raise ValueError(
      f"privacy needs uniform client weights: {algorithm.name} weighs "
      f"clients by their data sizes (weighting={plan.weighting!r}), which "
      f"are private and set the noise's scale; build it with "
      f"weighting='uniform' where it has that argument"
    )
  missing = [f for f in sent if privacy.clip_of(f) is None]
  if missing:
    raise ValueError(
      f"privacy.clip has no bound for {missing}: {algorithm.name} sends "
      f"{list(sent)}, and every upload must be clipped"
    )
  if isinstance(privacy.clip, Mapping):
    unknown = sorted(set(privacy.clip) - set(sent))
    if unknown:
      raise ValueError(
        f"privacy.clip names {unknown}, which {algorithm.name} does not send; it sends {list(sent)}"
      )
  # no field is missing: every clip_of(f) is a number
  return {f: float(cast(float, privacy.clip_of(f))) for f in sent}


def make_uplink(
  algorithm,
  num_clients: int,
  clients_per_round: int,
  compression,
  privacy,
  aggregation=None,
  byzantine=None,
  sampling: str = "uniform",
) -> Optional[Uplink]:
  """Validate ``compression``, ``privacy``, ``aggregation`` and ``byzantine`` against the
  algorithm's plan (one-line ``ValueError`` naming the argument); ``None`` when all are
  absent."""
  if not compression and privacy is None and aggregation is None and byzantine is None:
    return None
  plan = algorithm.plan
  tree = None
  if isinstance(privacy, privacy_lib.TreeDP):
    tree = _tree(algorithm, privacy, num_clients, clients_per_round, aggregation, sampling)
    privacy = None  # the uplink only clips (``tree.clip``); the FTRL server adds the noise
  codecs = _codecs(algorithm, compression) if compression else {}
  clip, z = {}, 0.0
  messages = privacy_lib.messages_per_round(plan)
  rate = clients_per_round / num_clients
  if privacy is not None:
    clip = _clip(algorithm, privacy)
    privacy = _resolved(
      privacy,
      "gaussian",
      lambda spec: privacy_lib.calibrate(
        spec.epsilon,
        spec.delta,
        rate,
        sum(messages.values()),
        spec.rounds,
        init_messages=len(plan.init_fields),
        accountant=spec.accountant,
      ),
    )
    z = float(privacy.noise_multiplier)
  reads_each = as_aggregator(algorithm.server).reads_each
  if aggregation is not None:
    byzantine_lib.with_rule(algorithm.server, aggregation)  # refuses what it cannot reach
    reads_each = True
  bad_ids = None
  if byzantine is not None:
    bad_ids = _byzantine_ids(algorithm, byzantine, num_clients)
  routed = sent_fields(plan) if aggregation is not None or byzantine is not None else ()
  adapted: Tuple[str, ...] = ()
  z_update, count_noise = z, 0.0
  if privacy is not None and privacy.adaptive is not None:
    adapted = adapted_fields(plan)
    spec = privacy.adaptive
    # the paper's clients_per_round / 20, raised to z where that is less: the count then
    # takes at most a quarter of the budget (z_Delta <= 1.155 z)
    default = max(clients_per_round / 20, z)
    count_noise = default if spec.count_noise is None else spec.count_noise
    z_update = privacy_lib.update_multiplier(z, count_noise)
  if tree is not None:
    clip = {"params": tree.clip}
    privacy = tree
  return Uplink(
    codecs,
    clip,
    z,
    privacy,
    messages,
    rate,
    reads_each,
    len(plan.init_fields) if privacy is not None else 0,
    aggregation,
    byzantine,
    bad_ids,
    routed,
    adapted,
    z_update,
    float(count_noise),
    num_clients // clients_per_round if tree is not None else 0,
  )


def _tree(algorithm, spec, num_clients: int, clients_per_round: int, aggregation, sampling):
  """DP-FTRL's ``spec`` checked against the run (the model the only field sent, uniform
  weights, an optax server it can replace, each client once a tree), its ``z`` resolved."""
  sent = sent_fields(algorithm.plan)
  if sent != ("params",):
    raise ValueError(
      f"privacy=dp_ftrl covers the model only, but {algorithm.name} also sends "
      f"{list(sent[1:])}; use fedco.privacy.gaussian for it"
    )
  if algorithm.plan.weighting != "uniform":
    raise ValueError(
      f"privacy=dp_ftrl needs uniform client weights: {algorithm.name} weighs clients by "
      f"their data sizes; build it with weighting='uniform'"
    )
  if not isinstance(algorithm.server, optax.GradientTransformation):
    raise ValueError(
      f"privacy=dp_ftrl replaces the server with DP-FTRL's, but {algorithm.name}'s server "
      f"is a ServerAggregator it would drop; use an algorithm with an optax server"
    )
  if aggregation is not None:
    raise ValueError(
      "aggregation= cannot combine with privacy=dp_ftrl: its server sums the clipped "
      "changes under tree noise; a robust rule would change what the noise covers"
    )
  if sampling != "epochs" and clients_per_round < num_clients:
    raise ValueError(
      f"privacy=dp_ftrl needs each client at most once per tree: pass sampling='epochs' "
      f"(clients_per_round={clients_per_round} of {num_clients} clients)"
    )
  per_tree = num_clients // clients_per_round
  return _resolved(
    spec,
    "dp_ftrl",
    lambda s: privacy_lib.tree_calibrate(s.epsilon, s.delta, per_tree, s.rounds),
  )


def _resolved(spec, factory: str, calibrate):
  """``spec`` with its noise multiplier: as given, or ``calibrate(spec)`` for its target
  epsilon over its ``rounds`` (a one-line ``ValueError`` without them; ``factory`` names
  the ``fedco.privacy`` function that takes them)."""
  if spec.noise_multiplier is not None:
    return spec
  if spec.rounds is None:
    raise ValueError(
      "privacy was given a target epsilon but no rounds to spend it over: pass rounds= to "
      f"fedco.privacy.{factory} (fedco.simulate fills in its own; Simulator and fedco.sweep "
      "need it)"
    )
  return dataclasses.replace(spec, noise_multiplier=calibrate(spec))


def adapted_fields(plan) -> Tuple[str, ...]:
  """The fields whose bound adaptive clipping moves: those sent once, at a round's end (the
  model, ``every_round`` and ``report`` fields, none also sent after every step or at the
  round's start)."""
  once = ("params",) + tuple(plan.every_round) + tuple(plan.report)
  other = set(plan.every_step) | set(plan.round_start)
  return tuple(f for f in dict.fromkeys(once) if f not in other)


def _byzantine_ids(algorithm, byzantine, num_clients: int):
  """``byzantine`` checked against what ``algorithm`` sends: its clients' ids."""
  if not isinstance(byzantine, byzantine_lib.Attack):
    raise ValueError(f"byzantine must be fedco.byzantine.attack(...), got {byzantine!r}")
  sent = sent_fields(algorithm.plan)
  unknown = [f for f in byzantine.fields or () if f not in sent]
  if unknown:
    raise ValueError(
      f"byzantine.fields names {unknown}, which {algorithm.name} does not send; it sends {list(sent)}"
    )
  return byzantine.clients(num_clients)
