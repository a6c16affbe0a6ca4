"""The simulator's settings, spelled and documented once: :class:`SimOptions`.

:class:`~fedco.runtime.Simulator`, :func:`fedco.simulate` and :func:`fedco.sweep` take a
``SimOptions`` (``options=``) and, as a convenience, its fields as keyword arguments, which
build one (:meth:`SimOptions.of`); :func:`fedco.runtime.config.make_config` validates it into
the run's :class:`~fedco.runtime.config.RunConfig`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Tuple, Union

import jax

PyTree = Any

# The default batch size: a size up to it is never refused (toy data of a few examples a
# client keep running with the default, warned); a larger one above every client is refused.
DEFAULT_BATCH_SIZE = 32


@dataclasses.dataclass(frozen=True)
class SimOptions:
  r"""How a simulation runs: sampling, batches, evaluation, devices, faults, the uplink.

  Every field has its default; the values are checked when a simulator is built (one-line
  ``ValueError`` naming the field and what is allowed).

  Attributes:
    clients_per_round: ``m``, an int in ``[1, K]``: clients sampled without replacement
      each round; ``None`` (default) means all ``K``.
    sampling: how a round's ``m`` clients are drawn: ``"uniform"`` (default), uniformly
      without replacement each round, independently of other rounds; ``"epochs"``, in
      epochs of ``K // m`` rounds, each a fresh random permutation of the clients cut into
      cohorts of ``m`` (every client in at most one round of an epoch; the ``K mod m`` left
      over sit the epoch out), what DP-FTRL's accounting needs (:func:`fedco.privacy.dp_ftrl`).
    batch_size: an int ``>= 1``: examples per inner (and next-inner) batch per step, drawn
      with replacement (a size above the smallest client's warns); ``None`` is each client's
      whole data (deterministic). Default 32.
    outer_batch_size: ``b1``, an int ``>= 1`` or ``None``: examples per outer / extra batch;
      the default ``-1`` means ``batch_size``.
    paired_batches: a bool: the outer (and extra) batch of a step is its inner batch, the
      same rows, instead of an independent draw (needs ``outer_batch_size == batch_size``).
      For problems whose outer data must belong to the inner sample, e.g. MAML over
      episodes of random tasks (E4, :mod:`fedco.data.omniglot`): an episode's query sets
      score the parameters adapted on its own support sets. The next-inner batch stays
      independent. Default ``False``.
    evaluate: compute the exact objective (``metrics["objective"]``) and the per-client
      losses (``metrics["client_losses"]``, ``[K]`` per round). Default ``True``.
    exact_grad_norm: also the norm of the exact gradient of the objective
      (``metrics["grad_norm"]``; small problems). Default ``False``.
    metrics_fn: ``params -> dict of scalars/arrays``, evaluated on the server model and
      added to the metrics under its keys; with ``metrics_data``,
      ``(params, metrics_data) -> dict``. Traced inside the compiled rounds. Default ``None``.
    eval_every: an int ``>= 1``: evaluate (objective and ``metrics_fn``) after every
      ``eval_every``-th round, after round 1 and after the run's last round (:meth:`Simulator.run <fedco.runtime.Simulator.run>`'s
      ``final_round``); other rounds skip the work (``lax.cond``) and hold NaN, and
      ``metrics["evaluated"]`` marks the evaluated rounds. Default 1.
    mesh: a ``jax.sharding.Mesh`` with a ``"clients"`` axis (see :func:`fedco.runtime.client_mesh`); each
      round's clients are laid along it (``vmap`` with ``spmd_axis_name`` plus sharding
      constraints). A round's client count that the axis does not divide is padded with
      masked clients that neither train nor count. ``None`` (default): one device. With a
      :class:`~fedco.data.blocks.ClientBlockData` (multi-process data from
      :func:`fedco.runtime.distributed.global_data`) the examples stay sharded where they are
      and every round has one slot per client block: each client trains on the device
      holding its data, and unsampled clients are masked instead of moved.
    participation: a number in ``(0, 1]``: the probability that each of a round's clients
      survives the round (client dropout); a dropped client neither trains nor counts in
      any average, and a round whose clients all drop leaves the server as it was. Default
      1 (no dropout).
    straggler_prob: a number in ``[0, 1)``: the probability that a surviving client is a
      straggler this round and does only a uniform number of local steps in
      ``{1, ..., I - 1}``; a straggler counts in the averages with the work it did. Default
      0.
    compression: ``{field: codec}`` (:mod:`fedco.compression`) for fields the plan sends
      (``"params"`` and its state fields): each client's upload of the field is its delta
      from the server's copy, encoded by the codec (state kept per client); the ledger
      counts the codec's bits. A codec with error-feedback memory only for fields sent as
      deltas. See :mod:`fedco.runtime.uplink`. Default ``None``.
    privacy: a :func:`fedco.privacy.gaussian` mechanism: every sent field clipped per
      client (it needs a clip bound for each) and Gaussian noise added where the server
      combines them (or :func:`fedco.privacy.dp_ftrl`: the model's changes clipped, the
      server replaced by DP-FTRL's, which adds tree-aggregated noise; needs
      ``sampling="epochs"`` when ``m < K``); :meth:`Simulator.epsilon <fedco.runtime.Simulator.epsilon>` is the epsilon spent (``fedco.simulate`` calibrates a
      target epsilon to its rounds and reports it per round as ``epsilon``). Needs uniform
      client weighting and an algorithm whose server queries no client losses (not DRFA).
      Default ``None``.
    local_epochs: an int ``>= 1``: each client's round is ``local_epochs`` passes over its
      rows (Reddi et al.'s "one local epoch"): batches of ``batch_size`` (needed) are
      consecutive slices of a fresh shuffle of its rows per epoch (the last one holds the
      remainder), so a client of ``n_k`` rows takes ``local_epochs * ceil(n_k /
      batch_size)`` steps, at most the algorithm's ``local_steps`` (the cap: a cap that cuts
      clients short warns; :func:`fedco.runtime.epoch_steps` gives the cap every client
      needs); ``metrics["local_steps"]`` reports each client's steps. The batches serve as
      inner and outer batch (``outer_batch_size`` must be ``batch_size``). ``None``
      (default): ``local_steps`` steps of batches drawn with replacement.
    client_chunk: an int in ``[1, clients_per_round]``: a round's clients run this many at
      a time, sorted by their step counts, each for its own number of steps (a
      ``lax.while_loop``; decision 101): no work on clients that finished, at the price of
      a sequential loop. Results equal the default's up to float round-off. For plans
      without ``every_step`` fields, on one device (no ``mesh``). ``None`` (default): every
      client ``vmap``-ed over the ``local_steps`` loop, finished clients masked.
    aggregation: a :mod:`fedco.byzantine` rule (``coordinate_median()``,
      ``trimmed_mean(beta)``, ``krum(f)``, ``multi_krum(f, m)``, ``centered_clipping(tau)``,
      ``mean()``): it replaces every weighted mean the round takes of what clients send, the
      model's and the plan's state fields' alike (an optax server then moves along the
      rule's center of the clients' changes; a ``ServerAggregator`` must declare
      ``combines``: AFL and DRFA do). Under ``privacy`` each client's upload then gets its
      own noise. ``None`` (default): weighted means.
    byzantine: a :func:`fedco.byzantine.attack`: a fixed fraction of the clients send
      sign-flipped, scaled or random uploads in place of the fields it names, inside the
      compiled round. ``None`` (default): every client is honest.
    delays: a :class:`fedco.runtime.Delays`: simulated durations of the clients' local work
      (per-client speeds, per-dispatch jitter, stragglers; deterministic per seed); each
      round reports ``metrics["time"]``, the simulated clock after it (a synchronous round
      lasts as long as its slowest surviving client). ``None`` (default): no clock.
    asynchronous: a :class:`fedco.runtime.Buffered`: buffered asynchronous aggregation
      (FedBuff): ``concurrency`` clients train at once from the model of their dispatch, and
      each round is a server step applying the ``clients_per_round`` earliest reports,
      weighted by staleness (:mod:`fedco.runtime.asynchrony`; ``metrics["staleness"]``).
      Needs ``delays`` (``Delays()`` when ``None``), an algorithm that sends only the model
      (FedAvg, FedProx, the adaptive servers, Ditto, FedPer, ...), clients in memory and
      uniform sampling. ``None`` (default): synchronous rounds.
    metrics_data: a pytree of arrays ``metrics_fn`` reads (held-out sets, say), passed into
      the compiled rounds as an argument: runs that differ only in it compile to one
      program (and a persistent compilation cache serves the others), where arrays a
      ``metrics_fn`` closes over are constants of each run's own program. Default ``None``.


  Examples:
    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> import fedco
    >>> x = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 1.0]], np.float32)
    >>> data = fedco.FederatedData.from_clients([{"x": x + k} for k in range(4)])
    >>> problem = fedco.problems.plain(lambda w, e: jnp.sum((w - e["x"]) ** 2))
    >>> options = fedco.runtime.SimOptions(batch_size=None, clients_per_round=2, eval_every=2)
    >>> result = fedco.simulate(problem, fedco.fedavg(0.1, 1), data, jnp.zeros(2), rounds=3,
    ...                         options=options)
    >>> result.metrics["evaluated"].tolist()  # after round 1, every 2nd and the last
    [True, True, True]
    >>> fedco.runtime.SimOptions.of(options, {"eval_every": 3}).eval_every
    3
  """

  clients_per_round: Optional[int] = None
  batch_size: Optional[int] = DEFAULT_BATCH_SIZE
  outer_batch_size: Optional[int] = -1
  paired_batches: bool = False
  evaluate: bool = True
  exact_grad_norm: bool = False
  metrics_fn: Optional[Callable[..., Dict[str, Any]]] = None
  eval_every: int = 1
  mesh: Optional[jax.sharding.Mesh] = None
  participation: float = 1.0
  straggler_prob: float = 0.0
  compression: Optional[Mapping[str, Any]] = None
  privacy: Any = None
  local_epochs: Optional[int] = None
  client_chunk: Optional[int] = None
  aggregation: Any = None
  byzantine: Any = None
  sampling: str = "uniform"
  metrics_data: Optional[PyTree] = None
  delays: Any = None
  asynchronous: Any = None

  @classmethod
  def of(
    cls,
    options: Optional["SimOptions"] = None,
    settings: Union[Mapping[str, Any], Iterable[Tuple[str, Any]]] = (),
  ):
    """``options`` (default: all defaults) with ``settings`` (field -> value) replaced.

    Raises:
      ValueError: ``options`` is not a ``SimOptions``, or a setting is no field of it (the
        message lists the fields).
    """
    if options is not None and not isinstance(options, cls):
      raise ValueError(f"options must be a fedco.runtime.SimOptions, got {type(options).__name__}")
    settings = dict(settings)
    fields = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(settings) - set(fields))
    if unknown:
      raise ValueError(
        f"unknown simulator setting{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
        f"the settings are {', '.join(fields)} (fedco.runtime.SimOptions)"
      )
    return dataclasses.replace(options or cls(), **settings)

  def over(self, rounds: int) -> "SimOptions":
    """These options with a ``privacy`` given a target epsilon spent over ``rounds`` (as
    :func:`fedco.simulate` and :func:`fedco.sweep` do; other options unchanged)."""
    from fedco import privacy as privacy_lib  # pylint: disable=g-import-not-at-top

    if isinstance(self.privacy, (privacy_lib.ClientDP, privacy_lib.TreeDP)):
      return dataclasses.replace(self, privacy=self.privacy.over(rounds))
    return self


__all__ = ["DEFAULT_BATCH_SIZE", "SimOptions"]
