"""``simulate``: the host loop around a :class:`~fedco.runtime.Simulator`.

Chunks of rounds run as single jitted calls; between chunks the host fetches the metrics,
checks them, streams them to the metric writers (:mod:`fedco.runtime.host`), checkpoints,
updates the progress bar and honours a deferred Ctrl-C.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import sys
import time
from typing import Any, Dict, List, Optional

import jax
import numpy as np

from fedco import _validate
from fedco import privacy as privacy_lib
from fedco.algorithms.base import Algorithm
from fedco.data.federated import FederatedData
from fedco.data.store import ClientStore
from fedco.problems.base import Problem
from fedco.runtime import fingerprint, host, paging, streaming
from fedco.runtime.checks import NonFiniteError, _check_finite, _check_rows_finite, _data_note
from fedco.runtime.distributed import fetch
from fedco.runtime.simulator import SimState, Simulator

PyTree = Any


@dataclasses.dataclass
class SimulationResult:
  """What :func:`simulate` returns: the final model, the per-round metrics and the ledger.

  Attributes:
    params: the server model after the last round.
    random_params: the server model of a uniformly random round (reservoir sampling), the
      iterate the FedDRO/DS-FedDRO theorems return.
    state: the final :class:`SimState` (resume with ``Simulator.run``).
    metrics: per-round host arrays (NumPy), ``[rounds, ...]``: ``objective``,
      ``client_losses`` ``[R, K]``, ``grad_norm`` (if asked), user metrics, ``evaluated``
      (which rounds were evaluated; the others hold NaN), ``clients`` (sampled ids
      ``[R, m]``), with faults ``survivors``, with faults or ``local_epochs``
      ``local_steps`` ``[R, m]`` (each sampled client's steps) and, under
      ``privacy`` with noise, ``epsilon`` (spent by the end of each round).
    ledger: communication per client per round and in total, in floats and bytes (a dict,
      :meth:`fedco.runtime.Ledger.as_dict` with the run's fault record).
    seconds: wall time of the rounds (compilation included).
    host_metrics: the rows the :class:`~fedco.runtime.host.RoundAction` s returned,
      ``{"round": r, **metric_labels, name: value}``, in round order; a resumed run's
      earlier rows come back from its checkpoint.

  Examples:
    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> import fedco
    >>> x = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 1.0]], np.float32)
    >>> data = fedco.FederatedData.from_clients([{"x": x + k} for k in range(4)])
    >>> problem = fedco.problems.plain(lambda w, e: jnp.sum((w - e["x"]) ** 2))
    >>> result = fedco.simulate(
    ...   problem, fedco.fedavg(0.1, 1), data, jnp.zeros(2), rounds=2, batch_size=None,
    ...   clients_per_round=2,
    ... )
    >>> result.params.shape, int(result.state.round), result.seconds > 0
    ((2,), 2, True)
    >>> sorted(result.metrics), result.metrics["clients"].shape
    (['client_losses', 'clients', 'evaluated', 'objective'], (2, 2))
    >>> result.ledger["up_per_client_per_round"], result.ledger["total_up"]
    ({'params': 2}, 8)
  """

  params: PyTree
  random_params: PyTree
  state: SimState
  metrics: Dict[str, np.ndarray]
  ledger: Dict[str, Any]
  seconds: float
  host_metrics: List[Dict[str, Any]] = dataclasses.field(default_factory=list)


def simulate(
  problem: Problem,
  algorithm: Algorithm,
  data: FederatedData,
  params: PyTree,
  *,
  rounds: int,
  seed=0,
  chunk_rounds: Optional[int] = None,
  progress: Optional[bool] = None,
  check_finite: bool = True,
  checkpoint_dir=None,
  checkpoint_every: Optional[int] = None,
  keep_checkpoints: int = 3,
  checkpoint_mismatch: str = "error",
  progress_metric: str = "objective",
  metric_writers=(),
  actions=(),
  metric_labels: Optional[Dict[str, Any]] = None,
  **simulator_kwargs,
) -> SimulationResult:
  r"""Run ``rounds`` rounds of ``algorithm`` on ``problem`` and collect the metrics on the host.

  The main entry point. A :class:`Simulator` compiles the rounds; they run in chunks of
  ``chunk_rounds`` (default: all of them, at most 100), each chunk one jitted ``lax.scan``,
  and between chunks the host fetches the metrics, checks them, streams them to the metric
  writers, runs the actions, checkpoints and updates the progress bar. Every round samples
  ``m`` clients, runs ``local_steps`` of the algorithm on each and applies its
  communication plan and server transform; evaluated rounds record the exact objective
  (:math:`F(x)` or :math:`\Phi(x)`, SPEC 0) and every client's loss. One seed gives one
  result: a client's batches depend on its id, not on which clients were sampled with it or
  on the device layout.

  Ctrl-C is deferred to the end of the running chunk: the chunk's rows are written, a
  checkpoint is saved (when checkpointing) and :class:`~fedco.runtime.host.Interrupted`
  (a ``KeyboardInterrupt``) says up to which round. It is never dropped: a Ctrl-C during
  the last chunk still raises ``Interrupted`` (the finished result is its ``result``), one
  during a chunk that diverges raises it instead of the ``NonFiniteError`` (chained as its
  cause), and under an enclosing :func:`~fedco.runtime.host.interrupt_guard` one that came
  before the call stops it before round 1. A second Ctrl-C ends the process at once.

  Args:
    problem: the :class:`~fedco.problems.Problem`, of the algorithm's kind (see
      :class:`Simulator`).
    algorithm: the :class:`~fedco.algorithms.Algorithm` (``fedco.feddro(...)``, ...).
    data: the :class:`~fedco.data.FederatedData`, or a :class:`~fedco.data.ClientStore`
      (clients on disk, streamed: each chunk reads only the clients it samples; results
      equal the in-memory run's; it refuses ``evaluate=True``, ``exact_grad_norm``, a mesh,
      loss-querying servers (DRFA, AFL, q-FedAvg) and per-example state, one line each).
    params: the initial model ``x_bar_0``, a pytree of float32 / float64 arrays.
    rounds: number of rounds, an int ``>= 1``.
    seed: an int or a ``jax.random.PRNGKey``: client sampling, batches, faults and the
      random iterate. Default 0.
    chunk_rounds: rounds per jitted call, an int ``>= 1`` (default ``min(rounds, 100)``);
      chunks also end at checkpoints and at the actions' rounds.
    progress: print a ``tqdm`` progress line with rounds per second (leaving out the first
      chunk, compilation) and ``progress_metric``: ``True`` always, ``False`` never, ``None``
      (default, automatic) only where stderr is a terminal, once the run has taken 5 s
      without finishing: a long run in a shell shows its progress, while short runs, tests,
      notebooks and output sent to a file get no bar.
    check_finite: stop with :class:`NonFiniteError` (a ``FloatingPointError``) naming the
      first evaluated round whose metrics, the server model, or an action's row stop being
      finite; it carries the metrics and action rows collected so far. With checkpointing,
      the last good state (the start of the failing chunk) is saved first. Default ``True``.
    checkpoint_dir: a directory (str or path-like) to save the whole simulation state and
      the metrics so far in (see :mod:`fedco.checkpoint`); if it already holds a checkpoint
      of this run (same fingerprint: :mod:`fedco.runtime.fingerprint`), the run resumes from
      the newest intact one, says "resumed from round N" on stderr, and ends bit-identical
      to an uninterrupted run (a streamed run with client state on disk keeps it in
      ``<checkpoint_dir>/client_state``, journaled per checkpoint, and falls back to an
      older checkpoint as an in-memory run does: :class:`~fedco.runtime.StateStore`; without
      ``checkpoint_dir`` it keeps it in a temporary ``fedco-client-state-*`` folder, removed
      at the end, and a later run removes those of killed runs). The directory is locked
      for the run (a second run gets a one-line ``ValueError`` naming the holder; in a
      multi-process run, process 0 holds it). ``None`` (default): no checkpoints.
    checkpoint_every: rounds between checkpoints, an int ``>= 1`` (default: every chunk).
    keep_checkpoints: how many checkpoints to keep, an int ``>= 1``. Default 3.
    checkpoint_mismatch: what a ``checkpoint_dir`` holding *another* run's checkpoints
      does: ``"error"`` (default; ``fedco.checkpoint.RunMismatchError``, naming what
      differs) or ``"restart"`` (delete that directory's checkpoints and start afresh).
    progress_metric: the scalar metric the progress line shows (``"objective"``, default, or
      one of ``metrics_fn``'s or of the actions' rows).
    metric_writers: :class:`fedco.runtime.host.RowWriter` s (``JsonlWriter``,
      ``CsvWriter``, ``TensorBoardWriter``) that receive every chunk's evaluated rows as
      soon as the chunk is done (a diverging chunk's up to the divergence); a resumed run
      first drops its rows from them and writes its restored rows again. They are closed at
      the end. Default: none.
    actions: :class:`fedco.runtime.host.RoundAction` s, run on the host with the whole
      state at their rounds (chunks end there); their rows are written, checkpointed and
      returned in ``host_metrics``; ``progress_metric`` may name one of their numbers.
      Default: none.
    metric_labels: a dict of fields added to every written row (default
      ``{"algorithm": algorithm.name}``); its ``"method"`` (else ``"algorithm"``) and
      ``"seed"`` name the run on the progress line.
    **simulator_kwargs: forwarded to :class:`Simulator`, which documents each:
      ``clients_per_round`` (int in ``[1, K]``), ``batch_size`` (int ``>= 1`` or ``None``;
      default 32), ``outer_batch_size``, ``paired_batches``, ``evaluate``,
      ``exact_grad_norm``, ``metrics_fn``, ``metrics_data``, ``eval_every`` (int ``>= 1``),
      ``mesh``, ``participation`` (in ``(0, 1]``), ``straggler_prob`` (in ``[0, 1)``),
      ``compression``, ``privacy`` (a :func:`fedco.privacy.gaussian` whose target
      epsilon is calibrated to ``rounds`` here), ``local_epochs`` (int ``>= 1``: each
      client's epochs over its rows, capped at ``local_steps``) and ``client_chunk`` (int
      in ``[1, clients_per_round]``: clients run that many at a time, each its own steps).

  Returns:
    A :class:`SimulationResult`: final and random-iterate ``params``, the final ``state``,
    per-round host ``metrics`` ``[rounds, ...]``, the ``ledger`` dict, ``seconds`` and the
    actions' ``host_metrics``.

  Raises:
    ValueError: an argument outside what is allowed above (one line naming it), params that
      do not fit the problem and data, a ``checkpoint_dir`` locked by another process or
      holding a round past ``rounds``, or (``fedco.checkpoint.RunMismatchError``) holding
      another run's checkpoints with ``checkpoint_mismatch="error"``.
    NonFiniteError: with ``check_finite``, when the run diverges.
    Interrupted: after a Ctrl-C, at the end of the running chunk.

  Examples:
    FedDRO on the log form of client-level KL-DRO,
    :math:`\gamma \log \frac1K \sum_k \exp(f_k(x) / \gamma)`, over 4 clients of 4
    examples each (the per-example loss is a squared distance):

    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> import fedco
    >>> x = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 1.0]], np.float32)
    >>> data = fedco.FederatedData.from_clients([{"x": x + k} for k in range(4)]).with_owner()
    >>> loss = lambda w, e: jnp.sum((w - e["x"]) ** 2)  # l(w; e)
    >>> problem = fedco.problems.client_kl_dro_log(loss, gamma=1.0, num_clients=4)
    >>> result = fedco.simulate(
    ...   problem, fedco.feddro(0.05, 2), data, jnp.zeros(2), rounds=3, batch_size=None
    ... )
    >>> evaluated = result.metrics["objective"][result.metrics["evaluated"]]
    >>> [round(float(v), 2) for v in evaluated]  # the objective after rounds 1, 2, 3
    [19.8, 13.59, 9.88]
    >>> result.metrics["client_losses"].shape  # [rounds, K]
    (3, 4)
    >>> result.ledger["up_per_client_per_round"]  # y after each of the 2 local steps
    {'params': 2, 'y': 8}
  """
  rounds = _validate.positive_int("rounds", rounds)
  chunk = (
    min(rounds, 100)
    if chunk_rounds is None
    else _validate.positive_int("chunk_rounds", chunk_rounds)
  )
  _validate.one_of("checkpoint_mismatch", checkpoint_mismatch, ("error", "restart"))
  if not isinstance(progress_metric, str) or not progress_metric:
    raise ValueError(f"progress_metric must be a metric's name (a string), got {progress_metric!r}")
  actions = tuple(actions)
  for action in actions:  # before anything is opened or locked
    if not isinstance(action, host.RoundAction):
      raise ValueError(f"actions must be fedco.runtime.host.RoundAction s, got {action!r}")
  private = simulator_kwargs.get("privacy")
  if isinstance(private, privacy_lib.ClientDP):
    simulator_kwargs["privacy"] = private.over(rounds)
  store = data if isinstance(data, ClientStore) else None
  if store is not None:  # streamed clients: built on a template, each chunk read in turn
    data = streaming.template(store)
  sim = Simulator(problem, algorithm, data, **simulator_kwargs)
  link = sim.config.uplink
  spends = link is not None and link.private and link.noise_multiplier > 0
  chunks = None
  if store is not None:
    averaged, store = streaming.checked(sim, params, store)  # and every read's rows checked
    sim.data_description = {
      "store": store.digest,
      "clients": store.num_clients,
      "examples": store.num_examples,
    }
    # every round's clients, from the initial key (resumes included)
    key = paging.state_key(sim.seed_key(seed))
    sampled = streaming.schedule(key, sim.num_clients, sim.clients_per_round, rounds)
    chunks = streaming.Chunks(store, sampled, chunk)
  state = sim.init(params, seed, pages=None if chunks is None else chunks.pages)
  if chunks is not None:  # trackers of every client's inner value: one pass for their means
    state = streaming.with_initial_means(sim, store, state, averaged, seed)
    chunks.own = streaming.OwnStart.of(sim, state.server["params"], seed)
  # Persistent client state on disk (streamed runs): every client's initial row, taken now
  # (a restored state's pages hold sampled clients' rows).
  fresh = paging.fresh(state) if paging.is_paged(state) else None
  states, states_dir, states_temporary = None, None, False
  collected, done, ckpt, host_metrics, lock, run_id = [], 0, None, [], None, None
  if checkpoint_dir is not None:
    from fedco import checkpoint as checkpoint_lib  # orbax loads only when asked for
    from fedco.io import DirectoryLock  # pylint: disable=g-import-not-at-top

    every = (
      chunk
      if checkpoint_every is None
      else _validate.positive_int("checkpoint_every", checkpoint_every)
    )
    lock = DirectoryLock(checkpoint_dir, what="checkpoint_dir")
    if jax.process_index() == 0:  # a multi-process run shares the directory: one holder
      lock.acquire()
    try:
      # pages: one row (their count P follows rounds and chunk_rounds; the rows are on disk)
      state = paging.compact(state)
      description = fingerprint.describe_run(sim, fetch(state.server["params"]), seed, state)
      run_id = {"fingerprint": fingerprint.fingerprint(description), "description": description}
      ckpt = checkpoint_lib.Checkpointer(checkpoint_dir, keep=keep_checkpoints)
      if ckpt.latest_round() is not None:
        try:
          done, state, history, host_metrics = ckpt.restore(state, with_host_rows=True, run=run_id)
        except checkpoint_lib.RunMismatchError:
          if checkpoint_mismatch == "error":
            raise
          ckpt.delete_all()
          history = None
        if done > rounds:
          raise ValueError(
            f"{checkpoint_dir} holds round {done}, past rounds={rounds}; use "
            "another checkpoint_dir or more rounds"
          )
        if done:
          print(f"resumed from round {done} ({checkpoint_dir})", file=sys.stderr, flush=True)
        collected = [history] if history else []
    except BaseException:
      if ckpt is not None:
        ckpt.close()
      lock.release()
      raise

  def save(round_, saved_state, metrics):
    """A checkpoint of ``round_``; the client state on disk is journaled before it."""
    if states is not None:
      states.journal(round_)
    ckpt.save(round_, paging.compact(saved_state), metrics, host_metrics, run=run_id)
    if states is not None:
      states.apply(round_)
      states.keep_journals(ckpt.all_rounds())  # one journal per checkpoint still kept

  writers = tuple(metric_writers)
  labels = {"algorithm": algorithm.name} if metric_labels is None else dict(metric_labels)
  # The writers get this run's rows afresh: a resumed run's restored rows are written again
  # (its files may have been replaced since, e.g. by an experiment's rerun), then new ones.
  restored = (host.rows(collected[0], 0, labels) if collected else []) + list(host_metrics)
  for writer in writers:
    writer.rewind(0, labels)
    if restored and writer.can_rewind:  # a writer that cannot drop rows keeps its old ones
      writer.write(restored)
  name = str(labels.get("method", labels.get("algorithm", algorithm.name)))
  if "seed" in labels:  # the name every output of an experiment uses, and the seed
    name += f" seed {labels['seed']}"
  bar = host.ProgressBar(rounds, label=name, enabled=progress, initial=done)

  def act(due):
    """Run the due actions on ``state`` at round ``done``; write and check their rows."""
    rows = [row for row in (_act(a, state, done, labels) for a in actions if due(a)) if row]
    host_metrics.extend(rows)
    finite = [row for row in rows if host.finite_row(row)]  # a diverged row is not written
    for writer in writers if finite else ():
      writer.write(finite)
    if check_finite:
      try:
        _check_rows_finite(rows, host_metrics)
      except NonFiniteError as err:  # the metrics are stacked only when they are needed
        err.metrics = _stack(collected) if collected else {}
        raise
    return rows

  start = time.perf_counter()

  def chunk_size(done):
    """The rounds of the chunk starting after round ``done``."""
    size = min(chunk, rounds - done)
    if ckpt is not None:
      size = min(size, every - done % every)
    for action in actions:
      size = min(size, action.rounds_to_next(done))
    return size

  def interrupted(when):
    return host.Interrupted.of_run(name, when, done, ckpt is not None)

  try:
    if fresh is not None:
      if ckpt is None:
        states_dir, states_temporary = paging.temporary_folder(), True
      else:
        states_dir = os.path.join(checkpoint_dir, "client_state")
      states = paging.StateStore(
        states_dir,
        fresh,
        sim.num_clients,
        run="" if run_id is None else run_id["fingerprint"],
        create=done == 0,
        durable=not states_temporary,
      )
      states.recover(done)
    with host.interrupt_guard() as stop:
      if stop.requested:  # Ctrl-C came before this run (a guard around a loop of runs)
        raise interrupted(f"before round {done + 1} of {rounds}")
      if done == 0:
        act(lambda a: a.at_start)
      while done < rounds:
        size = chunk_size(done)
        last_good = state
        chunk_data = None if chunks is None else chunks.get(done, size)
        if states is not None:  # this chunk's clients' state, from the disk
          ids = chunks.ids(done, size)
          state = last_good = paging.with_pages(state, ids, chunks.rows(states, ids, chunk_data))
        if chunks is not None and done + size < rounds:
          chunks.prefetch(done + size, chunk_size(done + size))
        state, metrics = sim.run(state, size, final_round=rounds, data=chunk_data)
        metrics = fetch(metrics)  # jax.device_get, or a gather of multi-process arrays
        if spends:  # the privacy spent by the end of each round
          metrics["epsilon"] = link.epsilon(np.arange(done + 1, done + size + 1))
        collected.append(metrics)
        chunk_rows = host.rows(metrics, done, labels)
        if check_finite:  # a diverging chunk's rows up to the divergence: the curve to it
          chunk_rows = list(itertools.takewhile(host.finite_row, chunk_rows))
        for writer in writers:
          writer.write(chunk_rows)
        if check_finite:
          try:
            _check_finite(metrics, state, done)
          except NonFiniteError as err:
            note = _data_note(sim.data, store and store.data_note(err.round))
            err.args = (f"{err.args[0]} {note}",) + err.args[1:]
            if ckpt is not None:  # the last good state, round 0 included
              save(done, last_good, _stack(collected[:-1]) if collected[:-1] else {})
            err.metrics, err.host_metrics = _stack(collected), list(host_metrics)
            if stop.requested:  # the user asked to stop: that, not the divergence, ends it
              raise interrupted(
                f"in rounds {done + 1}-{done + size} of {rounds}, which diverged ({err.args[0]})"
              ) from err
            raise
        done += size
        if states is not None:  # the chunk's client state back to the disk
          states.write(*paging.pages_of(state))
          if ckpt is None:
            states.apply(done)
        rows = act(lambda a, done=done: a.due(done, rounds))
        if ckpt is not None and (done % every == 0 or done == rounds or stop.requested):
          save(done, state, _stack(collected))
        shown = None
        if progress_metric in metrics and np.any(metrics["evaluated"]):
          values = np.asarray(metrics[progress_metric])[np.asarray(metrics["evaluated"])]
          shown = float(values[-1]) if values.ndim == 1 else None
        elif rows and np.ndim(rows[-1].get(progress_metric, ())) == 0:
          shown = float(rows[-1][progress_metric])
        bar.update(done, shown, progress_metric)
        if stop.requested and done < rounds:
          raise interrupted(f"after round {done} of {rounds}")
      if stop.requested:  # during the last chunk: the run is complete, and still stops
        err = interrupted(f"at its end (round {rounds} of {rounds}, complete)")
        err.result = _result(
          sim, state, collected, rounds, time.perf_counter() - start, host_metrics
        )
        raise err
  finally:
    try:
      bar.close()
      if chunks is not None:
        chunks.close()
    finally:
      try:  # the client state's last write ends before the lock goes, and may fail
        if states is not None:
          states.close()
      finally:
        if states_temporary:
          paging.remove_temporary(states_dir)
        host.close_all(writers)
        if ckpt is not None:
          ckpt.close()
        if lock is not None:
          lock.release()
  return _result(sim, state, collected, rounds, time.perf_counter() - start, host_metrics)


def _result(sim, state, collected, rounds, seconds, host_metrics):
  return SimulationResult(
    state.server["params"],
    state.random_params,
    state,
    _stack(collected),
    _ledger(sim, state, collected, rounds),
    seconds,
    host_metrics,
  )


def _act(action, state, done, labels):
  """The action's row at round ``done`` (``None`` when it returns nothing)."""
  out = action(state, done)
  return None if out is None else {"round": done, **labels, **out}


def _ledger(sim, state, collected, rounds):
  """The run's ledger; with faults, totals count only what surviving clients sent."""
  return sim.ledger(state).run_totals(rounds, _stack(collected) if collected else {})


def _stack(chunks):
  return {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}
