"""Run fingerprints: what makes two simulations the same run, so a checkpoint is resumed only
by the run that wrote it.

A fingerprint is a digest of a JSON description: the algorithm (registry factory and its
arguments, the communication plan), the problem (its name and a probe: its client objective
on client 0's first rows at the initial model and at a nearby one, so a changed temperature
or loss shows even where the initial model, all zeros say, makes it a constant), a
digest of the data, the seed, a digest of the whole initial ``SimState`` (initial model,
PRNG key, trackers, injected hyperparameters, optimizer states) and the runtime options.
An algorithm a factory did not build whole (``fedco.chain``, ``named_chain``,
``Algorithm.replace``, ``with_server``: no recorded ``arguments``) is also described by its
``update`` and server functions: their names and the constants their closures hold,
followed through nested functions and transforms, so ``chain(clip(1.0), fedavg(0.1))`` and
``chain(clip(5.0), fedavg(0.3))`` differ. Limits: a function's body is not seen (its
name is), e.g. a changed ``metrics_fn``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from functools import partial as functools_partial
from typing import Any, Dict, List, Tuple

import jax
import jax.numpy as jnp
import numpy as np


def array_digest(tree) -> str:
  """blake2b of every leaf's shape, dtype and bytes (shape and dtype only for arrays held
  partly by other processes)."""
  h = hashlib.blake2b(digest_size=16)
  for leaf in jax.tree.leaves(tree):
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
      h.update(f"{leaf.shape}{leaf.dtype}global".encode())
      continue
    a = np.ascontiguousarray(np.asarray(leaf))
    h.update(f"{a.shape}{a.dtype}".encode())
    h.update(a.tobytes())
  return h.hexdigest()


def describe(value) -> Any:
  """A JSON-able description of an argument value."""
  if value is None or isinstance(value, (bool, str)):
    return value
  if isinstance(value, (int, float, np.integer, np.floating)):
    return value.item() if hasattr(value, "item") else value
  if isinstance(value, (np.ndarray, jax.Array)):
    return {"array": array_digest(value)}
  if isinstance(value, dict):
    return {str(k): describe(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [describe(v) for v in value]
  name = getattr(value, "__qualname__", None) or type(value).__qualname__
  module = getattr(value, "__module__", "") or type(value).__module__
  if module.startswith(_CORE):  # named as before base.py was split: old checkpoints resume
    module = "fedco.algorithms.base"
  return f"<{module}.{name}>"


# fedco.algorithms.base was split into fedco.algorithms.core.* (issue 46); what moved keeps
# the name fingerprints gave it.
_CORE = "fedco.algorithms.core."


# NamedTuple fields added after runs were fingerprinted that change nothing by themselves:
# left out, so those runs' checkpoints still resume. ``ServerAggregator.combines`` only
# says a run's aggregation rule can reach the server (the rule is in the uplink's entry).
UNDESCRIBED = {("ServerAggregator", "combines")}


def describe_callable(value, depth: int = 24, seen=None) -> Any:
  """A JSON-able description of a function or transform by its name and closure constants
  (numbers, arrays by digest, strings), following nested functions, NamedTuples and
  containers up to ``depth`` levels (cycles cut)."""
  seen = set() if seen is None else seen
  if depth == 0 or id(value) in seen:
    return "<...>"
  if value is None or isinstance(value, (bool, str, int, float, np.integer, np.floating)):
    return describe(value)
  if isinstance(value, (np.ndarray, jax.Array)):
    return describe(value)
  seen = seen | {id(value)}
  follow = lambda v: describe_callable(v, depth - 1, seen)
  if isinstance(value, dict):
    return {str(k): follow(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
  if isinstance(value, tuple) and hasattr(value, "_fields"):  # a NamedTuple (optax transform)
    name = type(value).__qualname__
    fields = [f for f in value._fields if (name, f) not in UNDESCRIBED]
    return {name: {f: follow(getattr(value, f)) for f in fields}}
  if isinstance(value, (list, tuple)):
    return [follow(v) for v in value]
  if callable(value) and hasattr(value, "__code__"):
    cells = [c.cell_contents for c in (value.__closure__ or ()) if _filled(c)]
    defaults = list(value.__defaults__ or ()) + list((value.__kwdefaults__ or {}).values())
    return {describe(value): [follow(v) for v in cells + defaults]}
  if isinstance(value, functools_partial):
    return {"partial": [follow(value.func), follow(value.args), follow(value.keywords)]}
  return describe(value)


def _filled(cell) -> bool:
  try:
    cell.cell_contents  # noqa: B018
  except ValueError:  # an empty cell (a name not yet bound)
    return False
  return True


def _objective(problem, params, examples, rows, weights):
  """The objective at ``params`` and at ``params`` moved by a fixed uneven pattern (at an
  all-zero model a KL-DRO temperature or a portfolio's risk aversion changes nothing)."""
  batch = jax.tree.map(lambda a: a[rows], examples)
  moved = jax.tree.map(
    lambda p: (
      p + 0.1 * jnp.sin(1.0 + jnp.arange(p.size)).reshape(p.shape).astype(p.dtype)
      if jnp.issubdtype(p.dtype, jnp.inexact)
      else p
    ),
    params,
  )
  return [problem.client_objective(p, batch, weights) for p in (params, moved)]


_objective_per_problem = jax.jit(_objective, static_argnums=0)


def _probe(problem, *args):
  """:func:`_objective`, compiled as one program (cached per problem object; a problem that
  cannot be hashed compiles anew): run op by op, each of its operations would compile alone,
  hundreds for a MAML step through a CNN (seconds at a process's first start)."""
  try:
    hash(problem)
  except TypeError:
    return jax.jit(functools_partial(_objective, problem))(*args)
  return _objective_per_problem(problem, *args)


def describe_run(sim, params, seed, state) -> Dict[str, Any]:
  """The JSON description of a run (see the module)."""
  cfg = sim.config
  algorithm, problem, data = cfg.algorithm, cfg.problem, sim.data
  # round_start_value changes nothing without an outer link: older fingerprints stay
  plan = {
    k: describe(v)
    for k, v in cfg.plan._asdict().items()
    if k != "round_start_reduce"
    and not (k == "round_start_value" and (v == "inner" or problem.outer_link is None))
    and not (k == "round_local" and not v)  # only when set: earlier runs keep theirs
  }
  probe = None
  if all(
    not isinstance(a, jax.Array) or a.is_fully_addressable for a in jax.tree.leaves(data.examples)
  ):
    start, count = int(data.offsets[0]), min(int(data.counts[0]), 8)
    rows = np.asarray(data.flat_rows[start : start + count])
    weights = np.full((count,), 1.0 / count, np.result_type(float))
    probe = array_digest(_probe(problem, params, data.examples, rows, weights))
  description = {
    "algorithm": {
      "name": algorithm.name,
      "arguments": describe(algorithm.__dict__.get("arguments")),
      "plan": plan,
    },
    "problem": {"name": problem.name, "kind": problem.kind, "probe": probe},
    "data": getattr(sim, "data_description", None)
    or {
      "digest": array_digest((data.examples, data.counts, data.flat_rows)),
      "clients": data.num_clients,
      "examples": data.num_examples,
    },
    "seed": describe(seed),
    "initial_state": array_digest(state),
    "options": {
      "clients_per_round": cfg.clients_per_round,
      "batch_size": cfg.batch_size,
      "outer_batch_size": cfg.outer_batch_size,
      "paired_batches": cfg.paired_batches,
      "evaluate": cfg.evaluate,
      "exact_grad_norm": cfg.exact_grad_norm,
      "eval_every": cfg.eval_every,
      "participation": cfg.participation,
      "straggler_prob": cfg.straggler_prob,
      "metrics_fn": describe(cfg.metrics_fn),
      "mesh": None if cfg.mesh is None else dict(cfg.mesh.shape),
    },
  }
  if algorithm.__dict__.get("arguments") is None:  # only then: earlier runs keep theirs
    description["algorithm"]["functions"] = {
      "update": describe_callable(algorithm.update),
      "server": describe_callable(algorithm.server),
    }
  for name in ("local_epochs", "client_chunk"):  # only when set: earlier runs keep theirs
    if getattr(cfg, name) is not None:
      description["options"][name] = getattr(cfg, name)
  if cfg.sampling != "uniform":  # only then: earlier runs keep their fingerprints
    description["options"]["sampling"] = cfg.sampling
  if cfg.uplink is not None:  # only then: earlier runs keep their fingerprints
    description["options"]["uplink"] = describe(cfg.uplink.describe())
  for name in ("delays", "asynchronous"):  # only when set: earlier runs keep theirs
    if getattr(cfg, name) is not None:
      description["options"][name] = dataclasses.asdict(getattr(cfg, name))
  return description


def fingerprint(description: Dict[str, Any]) -> str:
  return hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()[:16]


def differences(saved: Any, current: Any, prefix: str = "") -> Tuple[str, ...]:
  """The dotted paths at which two descriptions differ (leaves only)."""
  if not isinstance(saved, dict) or not isinstance(current, dict):
    return () if saved == current else (prefix.rstrip(".") or "run",)
  out: List[str] = []
  for key in sorted(set(saved) | set(current)):
    out.extend(differences(saved.get(key), current.get(key), f"{prefix}{key}."))
  return tuple(out)
