"""A simulation's frozen, validated settings: everything the round and the host loop read.

:func:`make_config` checks every argument once (one-line ``ValueError`` naming it) and picks
the client layout; :func:`check_params` checks a model against the data and problem by
tracing the problem on one example's shapes.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import errors as flax_errors

from fedco import _labels, _validate, byzantine
from fedco.algorithms.base import Algorithm, CommPlan, ServerAggregator, as_aggregator
from fedco.data.datasets import FederatedDataset
from fedco.data.federated import FederatedData
from fedco.data.store import ClientStore
from fedco.problems.base import Problem
from fedco.runtime import adaptive_clip, asynchrony, layouts, uplink_setup
from fedco.runtime.checks import check_dtypes, check_kinds, check_scalar
from fedco.runtime.mesh import check_mesh
from fedco.runtime.options import DEFAULT_BATCH_SIZE, SimOptions

PyTree = Any

#: The client schedules ``SimOptions.sampling`` takes.
SAMPLINGS = ("uniform", "epochs")


@dataclasses.dataclass(frozen=True, eq=False)
class RunConfig:
  """The validated settings of one simulation: the problem, the algorithm, the client
  layout and the uplink chosen from them, and the checked :class:`SimOptions` (their
  fields read as this object's own: ``cfg.batch_size`` is ``cfg.options.batch_size``).
  Frozen: the compiled round closes over it, so nothing can change under it.
  """

  problem: Problem
  algorithm: Algorithm
  layout: Any  # a layouts.Compact or layouts.Resident
  num_clients: int
  options: SimOptions  # checked: clients_per_round an int, outer_batch_size resolved, no
  # metrics_data (the Simulator holds it, placed on its devices)
  uplink: Optional[Any] = None  # an uplink.Uplink: codecs and privacy of the uploads

  def __getattr__(self, name: str):
    if name == "options":  # not set yet (a copy being built): no recursion
      raise AttributeError(name)
    try:
      return getattr(self.options, name)
    except AttributeError:
      raise AttributeError(f"RunConfig has no setting {name!r}") from None

  @property
  def plan(self) -> CommPlan:
    return self.algorithm.plan

  @property
  def aggregator(self) -> ServerAggregator:
    """The algorithm's server, under the run's aggregation rule when it has one (and
    holding the adaptive clip bounds under adaptive clipping)."""
    up = self.uplink
    server = self.algorithm.server
    if up is not None and up.tree is not None:  # DP-FTRL: its server replaces the algorithm's
      return up.tree_server(self.clients_per_round)
    aggregator = (
      as_aggregator(server)
      if up is None or up.rule is None
      else byzantine.with_rule(server, up.rule)
    )
    if up is not None and up.adapted:  # its state also holds the adaptive clip bounds
      aggregator = adaptive_clip.wrap(aggregator, up)
    return aggregator

  @property
  def faults(self) -> bool:
    return self.participation < 1 or self.straggler_prob > 0

  @property
  def may_drop(self) -> bool:
    """Whether a round's clients may fail to count: dropout, or stale asynchronous reports."""
    return self.faults or self.asynchronous is not None

  @property
  def varied_steps(self) -> bool:
    """Whether clients may take different numbers of local steps in a round (a discarded
    asynchronous report's client takes none)."""
    return self.faults or self.local_epochs is not None or self.asynchronous is not None


def refuse_oversized_batch(name: str, size: Optional[int], counts, whole: str = "None") -> None:
  """``ValueError`` naming ``name`` when the batch size ``size`` exceeds the largest client
  of ``counts`` and :data:`DEFAULT_BATCH_SIZE` (decision 98): every batch would repeat its
  client's rows, at many times the cost of its whole data. ``whole`` is how ``name`` spells
  "each client's whole data" (``None``; a config field's ``0``); ``None`` or ``0`` sizes pass."""
  if not size or not np.size(counts):
    return
  largest = int(np.max(counts))
  if size > max(largest, DEFAULT_BATCH_SIZE):
    raise ValueError(
      f"{name}={size} is larger than the largest client ({largest} examples): every "
      f"batch would repeat its client's rows (draws are with replacement), at "
      f"{size / largest:.3g}x the work of that client's whole data; use {name}={whole} (each "
      f"client's whole data) or at most {largest}"
    )


def make_config(
  problem: Problem, algorithm: Algorithm, data: FederatedData, options: SimOptions
) -> RunConfig:
  """Validate a simulation's arguments and choose its client layout."""
  o = options
  batch_size, local_epochs, client_chunk = o.batch_size, o.local_epochs, o.client_chunk
  _check_types(problem, algorithm, data)
  check_kinds(problem, algorithm)
  n = data.num_clients
  if problem.num_clients is not None and problem.num_clients != n:
    raise ValueError(
      f"problem {problem.name!r} was built for num_clients="
      f"{problem.num_clients}, but data holds {n} clients; build it with "
      f"num_clients={n}"
    )
  m = (
    n
    if o.clients_per_round is None
    else _validate.positive_int(
      "clients_per_round", o.clients_per_round, maximum=n, note="the number of clients"
    )
  )
  outer_batch_size = _check_batches(batch_size, o.outer_batch_size, o.paired_batches)
  eval_every = _validate.positive_int("eval_every", o.eval_every)
  mesh = check_mesh(o.mesh)
  _validate.open_unit("participation", o.participation, closed_right=True)
  _validate.interval("straggler_prob", o.straggler_prob, 0, 1, closed_low=True)
  straggler_prob = _validate.plain(o.straggler_prob)  # as given: it is in run fingerprints
  counts = np.asarray(data.counts)
  smallest = int(np.min(counts))
  for name, size in (("batch_size", batch_size), ("outer_batch_size", outer_batch_size)):
    refuse_oversized_batch(name, size, counts)
  if local_epochs is not None:
    local_epochs = _check_epochs(algorithm, local_epochs, batch_size, outer_batch_size, counts)
  for name, size in (("batch_size", batch_size), ("outer_batch_size", outer_batch_size)):
    if local_epochs is None and size is not None and size > smallest:
      warnings.warn(
        f"{name}={size} is larger than the smallest client ({smallest} "
        "examples): batches are drawn with replacement, so its rows repeat",
        stacklevel=3,
      )
      break
  if o.sampling not in SAMPLINGS:
    raise ValueError(f"sampling must be one of {list(SAMPLINGS)}, got {o.sampling!r}")
  layout = layouts.for_data(data, m, mesh)
  if client_chunk is not None:
    client_chunk = _check_chunk(algorithm, client_chunk, m, mesh, layout)
  delays, buffered = asynchrony.checked(algorithm, o, m, n, layout)
  link = uplink_setup.make_uplink(
    algorithm, n, m, o.compression, o.privacy, o.aggregation, o.byzantine, o.sampling
  )
  checked = dataclasses.replace(
    o,
    clients_per_round=m,
    outer_batch_size=outer_batch_size,
    eval_every=eval_every,
    mesh=mesh,
    straggler_prob=straggler_prob,
    local_epochs=local_epochs,
    client_chunk=client_chunk,
    delays=delays,
    asynchronous=buffered,
    metrics_data=None,  # the simulator's, placed on its devices: no host copy held here
  )
  return RunConfig(problem, algorithm, layout, n, checked, link)


def _check_types(problem, algorithm, data) -> None:
  """One line for a problem, algorithm or data of the wrong type (with the likely fix)."""
  if not isinstance(problem, Problem):
    raise ValueError(f"problem must be a fedco Problem, got {type(problem).__name__}")
  if not isinstance(algorithm, Algorithm):
    hint = ""
    if isinstance(algorithm, optax.GradientTransformation):
      hint = (
        "; optax.chain and optax.inject_hyperparams drop the communication plan: use "
        "fedco.chain / fedco.inject_hyperparams, which keep it"
      )
    raise ValueError(f"algorithm must be a fedco Algorithm, got {type(algorithm).__name__}{hint}")
  if not isinstance(data, FederatedData):
    hint = "; pass its .train" if isinstance(data, FederatedDataset) else ""
    if isinstance(data, ClientStore):
      hint = "; clients on disk are streamed by fedco.simulate only (data=store)"
    raise ValueError(f"data must be a fedco FederatedData, got {type(data).__name__}{hint}")


def _check_batches(batch_size, outer_batch_size, paired_batches) -> Optional[int]:
  """The batch sizes checked; returns the outer one (``-1``: the inner one's)."""
  if batch_size is not None:
    _validate.positive_int("batch_size", batch_size)
  if outer_batch_size == -1:
    outer_batch_size = batch_size
  if outer_batch_size is not None:
    _validate.positive_int("outer_batch_size", outer_batch_size)
  if not isinstance(paired_batches, bool):
    raise ValueError(f"paired_batches must be a bool, got {paired_batches!r}")
  if paired_batches and outer_batch_size != batch_size:
    raise ValueError(
      f"paired_batches=True draws the outer batch as the inner one, so "
      f"outer_batch_size must equal batch_size={batch_size!r}, got "
      f"{outer_batch_size!r}"
    )
  return outer_batch_size


def _check_epochs(algorithm, local_epochs, batch_size, outer_batch_size, counts) -> int:
  """``local_epochs`` checked against the batch sizes; warns once when the algorithm's
  ``local_steps`` (the cap) cut some clients' epochs short."""
  local_epochs = _validate.positive_int("local_epochs", local_epochs)
  if batch_size is None:
    raise ValueError(
      f"local_epochs={local_epochs} needs batch_size, an int >= 1 (an epoch is "
      "ceil(count / batch_size) batches); batch_size=None is each client's whole data"
    )
  if outer_batch_size != batch_size:
    raise ValueError(
      f"local_epochs={local_epochs} uses each epoch batch as the inner and outer batch, so "
      f"outer_batch_size must equal batch_size={batch_size}, got {outer_batch_size!r}"
    )
  cap = algorithm.plan.local_steps
  needed = local_epochs * ((counts.astype(np.int64) + batch_size - 1) // batch_size)
  cut = int(np.sum(needed > cap))
  if cut:
    warnings.warn(
      f"local_steps={cap} cuts the {local_epochs} local epoch(s) of {cut} of "
      f"{counts.size} clients short; local_steps={int(np.max(needed))} lets every client "
      "finish (fedco.runtime.epoch_steps)",
      stacklevel=4,
    )
  return local_epochs


def _check_chunk(algorithm, client_chunk, clients_per_round, mesh, layout) -> int:
  """``client_chunk``: clients run a chunk at a time only where they are independent
  within a round, on one device."""
  client_chunk = _validate.positive_int(
    "client_chunk", client_chunk, maximum=clients_per_round, note="clients_per_round"
  )
  every_step = algorithm.plan.every_step
  if every_step:
    raise ValueError(
      f"client_chunk={client_chunk} runs clients one chunk after another, but "
      f"{algorithm.name}'s every_step fields {list(every_step)} are averaged over all "
      "clients after each step; use client_chunk=None"
    )
  if mesh is not None or layout.resident:
    raise ValueError(
      f"client_chunk={client_chunk} runs a round's clients on one device; use it without "
      "mesh= and client blocks (or client_chunk=None)"
    )
  return client_chunk


_FLAX_SHAPE = re.compile(
  r'parameter "(?P<name>[^"]*)" in "(?P<scope>[^"]*)".*?expected to generate shape '
  r'(?P<want>\([^)]*\)).*?received has shape (?P<got>\([^)]*\))'
)


def check_params(params: PyTree, data: FederatedData, problem: Problem) -> PyTree:
  """``params`` as arrays, refused (``ValueError``) when their dtypes or shapes do not fit
  the data and problem."""
  params = jax.tree.map(jnp.asarray, params)
  check_dtypes(params, data.examples)
  # Shapes only: indexing a multi-process array on the host would move a row.
  example = jax.tree.map(
    lambda a: jax.ShapeDtypeStruct(np.shape(a)[1:], jnp.result_type(a)), data.examples
  )

  def over_data(fn):  # labels read from the example are checked against the data's values
    def traced(*args):
      with _labels.from_data(args[-1], data.examples, data.flat_rows, owners=data.flat_owner):
        return fn(*args)

    return traced

  def trace():
    if problem.extra is not None:
      check_scalar("extra", jax.eval_shape(over_data(problem.extra), params, example))
    if problem.compositional:
      y = jax.eval_shape(over_data(problem.inner), params, example)
      if problem.outer_uses_data:
        check_scalar("outer", jax.eval_shape(over_data(problem.outer), y, example))
      else:
        check_scalar("outer", jax.eval_shape(problem.outer, y))

  try:
    trace()
  except _labels.LabelError:  # already names the labels and the allowed range
    raise
  except flax_errors.ScopeParamShapeError as err:  # a flax model's parameter, wrong shape
    found = _FLAX_SHAPE.search(str(err))
    if found is None:
      raise ValueError(
        f"params do not fit problem {problem.name!r}: {str(err).splitlines()[0]}"
      ) from None
    raise ValueError(
      f"params do not fit problem {problem.name!r}: the model's parameter "
      f"{found['name']!r} in {found['scope']!r} has shape {found['want']}, but params give "
      f"it shape {found['got']}; build params with the model's init (e.g. "
      f"fedco.models.init_params)"
    ) from None
  except (TypeError, ValueError, IndexError, KeyError, flax_errors.FlaxError) as err:
    shapes = lambda t: jax.tree.map(lambda a: tuple(np.shape(a)), t)
    missing = err.args[0] if isinstance(err, KeyError) and err.args else None
    hint = ""
    if isinstance(example, dict) and isinstance(missing, str) and missing not in example:
      hint = f"; the problem reads the example field {missing!r}, which the data lack"
      if missing == "client":  # the client-level KL-DRO log form's owner ids
        hint += " (each example's client: pass data.with_owner(), also to write_store)"
    raise ValueError(
      f"params and data do not fit problem {problem.name!r}: params shapes "
      f"{shapes(params)}, one example's shapes {shapes(example)}; evaluating the problem "
      f"on them failed with {type(err).__name__}: {str(err).splitlines()[0]}{hint}"
    ) from None
  return params
