"""The federated simulator: vmapped clients, scanned steps and rounds, one jit per chunk.

Entry points:

* :func:`simulate` (``fedco.simulate``) runs an algorithm on a problem over federated data
  for a number of rounds and returns a :class:`SimulationResult`: the final and the
  random-iterate model, per-round metrics on the host and the communication ledger.
* :class:`Simulator` is the same program in pieces: ``init(params, seed)`` builds the
  :class:`SimState`, ``run(state, rounds)`` advances it as one jitted ``lax.scan`` and
  returns the metrics, ``ledger(state)`` counts what the plan sends (a :class:`Ledger`).
* :func:`sweep` (``fedco.sweep``) runs a grid of hyperparameters times seeds as one vmapped
  program (:class:`SweepResult`), each seed optionally with its own data, initial model or
  ``metrics_data`` (:class:`PerSeed`); a diverging run is frozen while the others go on.

Each round samples ``clients_per_round`` of the ``K`` clients, runs the algorithm's local
steps on each (``vmap`` over clients, ``lax.scan`` over steps; batches drawn by
:func:`draw_batch` / :func:`draw` from a :class:`ClientView`, oracles bound by
:func:`oracle_args`), averages what its communication plan says and applies its server
transform. The runtime holds no algorithm math. Randomness is explicit: a client's batches
depend on its id and the seed only.

**Metrics.** Evaluated rounds (round 1, every ``eval_every``-th and the last) record the
exact ``objective`` over every client's whole data, ``client_losses`` ``[K]``, optionally
``grad_norm`` and a ``metrics_fn``'s values; ``evaluated`` marks them and ``clients`` holds
the sampled ids. A run that stops being finite raises :class:`NonFiniteError` naming the
round and the quantity. :class:`RoundAction` s run host code on the whole state every few
rounds and add their rows to ``SimulationResult.host_metrics``.

**Time and asynchrony.** ``delays=`` :class:`Delays` gives each client's work a simulated
duration and each round ``metrics["time"]``; ``asynchronous=`` :class:`Buffered` runs
FedBuff's buffered asynchronous aggregation instead of synchronous rounds (module
:mod:`~fedco.runtime.asynchrony`).

**Writers.** ``metric_writers=`` streams every chunk's evaluated rows as soon as the chunk
is done: :class:`JsonlWriter`, :class:`CsvWriter`, :class:`TensorBoardWriter`, or your own
:class:`RowWriter` (module :mod:`~fedco.runtime.host`).

**Checkpoints.** ``checkpoint_dir=`` saves the whole state and the metrics so far
(:mod:`fedco.checkpoint`); rerunning the same run resumes from the newest intact checkpoint
and ends bit-identical to an uninterrupted run, and another run's checkpoints are refused.
Ctrl-C is deferred to the end of the running chunk (:func:`interrupt_guard`,
:class:`Interrupted`), after the rows and a checkpoint are written.

**Meshes.** ``mesh=`` :func:`client_mesh` lays each round's clients (``simulate``) or whole
runs (``sweep``) along a ``("clients",)`` device mesh (:data:`CLIENTS`); results equal the
one-device run. :mod:`~fedco.runtime.distributed` runs one simulation over several
processes, each loading only its own clients.

A run in a few lines::

  result = fedco.simulate(problem, fedco.feddro(0.1, 5), data, params, rounds=200,
                          batch_size=32, metric_writers=[fedco.runtime.JsonlWriter(path)])
  result.metrics["objective"], result.ledger["total_up"]
"""

from fedco.runtime import distributed, host
from fedco.runtime.asynchrony import Buffered, Delays
from fedco.runtime.batching import ClientView, draw, draw_batch, epoch_steps, oracle_args
from fedco.runtime.host import (
  CsvWriter,
  Interrupted,
  JsonlWriter,
  RoundAction,
  RowWriter,
  TensorBoardWriter,
  interrupt_guard,
)
from fedco.runtime.ledger import Ledger
from fedco.runtime.loop import NonFiniteError, SimulationResult, simulate
from fedco.runtime.mesh import CLIENTS, client_mesh
from fedco.runtime.options import SimOptions
from fedco.runtime.paging import Pages, StateStore, unpaged
from fedco.runtime.rounds import SimState
from fedco.runtime.simulator import Simulator
from fedco.runtime.sweep import PerSeed, SweepResult, sweep

__all__ = [
  "Buffered",
  "CLIENTS",
  "Delays",
  "ClientView",
  "draw",
  "Ledger",
  "NonFiniteError",
  "SimState",
  "Pages",
  "StateStore",
  "unpaged",
  "SimOptions",
  "SimulationResult",
  "Simulator",
  "client_mesh",
  "distributed",
  "host",
  "CsvWriter",
  "Interrupted",
  "JsonlWriter",
  "RowWriter",
  "RoundAction",
  "TensorBoardWriter",
  "interrupt_guard",
  "draw_batch",
  "epoch_steps",
  "oracle_args",
  "simulate",
  "PerSeed",
  "SweepResult",
  "sweep",
]
