r"""fedco's side of the Shakespeare peer workloads (issue 45): FedAvg on TFF's Shakespeare.

    python benchmarks/peers/fedco_shakespeare.py --workload=shakespeare --rounds=5 \
        --client_chunk=1 [--schedule_out=clients.json]

Same contract as the other peer programs (``workloads.py``): the last stdout line is the JSON
``workloads.report``. The run is ``fedco.Simulator(fedco.plain(loss), fedco.fedavg(1.0,
steps), fedco.data.load_shakespeare_tff().train, batch_size=4, clients_per_round=10,
evaluate=False, ...)`` with ``fedco.models.ShakespeareLSTM`` and the loss
``fedco.models.masked_cross_entropy`` (padding left out):

* ``shakespeare``: ``local_epochs=1`` (each client ``ceil(n_k / 4)`` steps over a shuffle of
  its rows; the cap ``local_steps`` is the largest client's, ``fedco.runtime.epoch_steps``)
  and ``client_chunk`` clients at a time, each for its own steps (``--client_chunk=0``:
  ``None``, every client ``vmap``-ed over the cap, finished ones masked).
* ``shakespeare_steps``: 10 local steps of batches drawn with replacement, every client.

The program is compiled ahead of time (``jit(...).lower(...).compile()``, timed apart as
``compile_seconds``) and then runs the rounds once, timed as one call and divided evenly over
its rounds. ``round_clients`` are the role names the rounds sampled; ``--schedule_out``
writes them (``{"clients": [[...], ...]}``) for the other sides (``--schedule`` of
``fedjax_bench.py``) before anything is timed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

START = time.perf_counter()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import workloads  # noqa: E402

SEED = 0


def loss_fn(model):
  """One sequence's loss: its mean token cross-entropy, padding left out."""
  import fedco  # pylint: disable=g-import-not-at-top

  def loss(params, example):
    return fedco.data.tff.shakespeare_loss(model.apply(params, example["x"]), example["y"])

  return loss


def simulator(workload: str, client_chunk, data_dir=None, max_clients=None):
  """``(fedco.Simulator, initial params, role names)`` of a Shakespeare workload."""
  import fedco  # pylint: disable=g-import-not-at-top

  w = workloads.WORKLOADS[workload]
  fed = fedco.data.load_shakespeare_tff(
    data_dir or workloads.shakespeare_dir(), max_clients=max_clients
  )
  train = fed.train
  model = fedco.models.ShakespeareLSTM()
  params = model.init(jax.random.PRNGKey(SEED), np.zeros(workloads.SHAKESPEARE_SEQUENCE, np.int32))
  if w.local_epochs:
    steps = fedco.runtime.epoch_steps(train, w.batch_size, w.local_epochs)
  else:
    steps = w.local_steps
  sim = fedco.Simulator(
    fedco.plain(loss_fn(model)),
    fedco.fedavg(w.learning_rate, steps, weighting="samples"),  # server: the plain mean
    train,
    batch_size=w.batch_size,
    clients_per_round=min(w.clients_per_round, train.num_clients),
    evaluate=False,
    local_epochs=w.local_epochs or None,
    client_chunk=client_chunk,
  )
  return sim, params, list(fed.info["users"])


def write_schedule(path, clients, train, users):
  """``path`` (JSON ``{"clients": [[role, ...], ...]}``) and beside it ``path + ".npz"``: each
  scheduled role's ``x`` and ``y`` (``"<role>/x"``) as fedco trains on them."""
  names = sorted({c for row in clients for c in row})
  index = {u: k for k, u in enumerate(users)}
  rows_of = np.asarray(train.flat_rows)
  arrays = {}
  for name in names:
    k = index[name]
    rows = rows_of[train.offsets[k] : train.offsets[k] + train.counts[k]]
    for key in ("x", "y"):
      arrays[f"{name}/{key}"] = np.asarray(train.examples[key])[rows]
  np.savez(path + ".npz", **arrays)
  with open(path, "w") as f:
    json.dump({"clients": clients}, f)


def run(workload, rounds, client_chunk, schedule_out=None, data_dir=None, max_clients=None):
  import fedco  # pylint: disable=g-import-not-at-top

  sim, params, users = simulator(workload, client_chunk, data_dir, max_clients)
  state = sim.init(params, SEED)
  ids = fedco.runtime.streaming.schedule(
    state.key, sim.config.num_clients, sim.clients_per_round, rounds
  )
  clients = [[users[int(i)] for i in row] for row in ids]
  if schedule_out:  # the rounds' clients, and their sequences for the other sides
    write_schedule(schedule_out, clients, sim.data, users)
  # Ahead-of-time: the program for these rounds, compiled without running it (Simulator.run
  # calls this jitted function; its `rounds` is static).
  start = time.perf_counter()
  final_round = np.int32(-1)
  compiled = sim._run.lower(  # pylint: disable=protected-access
    state, sim.data, sim.metrics_data, final_round, rounds=rounds
  ).compile()
  compile_seconds = time.perf_counter() - start
  setup = time.perf_counter() - START
  start = time.perf_counter()
  final, metrics = compiled(state, sim.data, sim.metrics_data, final_round)
  jax.block_until_ready(final)
  seconds = time.perf_counter() - start
  sampled = np.asarray(metrics["clients"])
  if not np.array_equal(sampled, ids):
    raise RuntimeError(f"the replayed schedule {ids.tolist()} is not what ran: {sampled.tolist()}")
  steps = np.asarray(metrics["local_steps"]) if "local_steps" in metrics else None
  extra = {
    "compile_seconds": compile_seconds,
    "client_chunk": client_chunk,
    "round_clients": clients,
    "client_steps": (
      steps.tolist() if steps is not None else [[sim.plan.local_steps] * len(r) for r in ids]
    ),
    "final_params_norm": float(
      np.sqrt(sum(np.sum(np.square(a)) for a in jax.tree.leaves(final.server["params"])))
    ),
  }
  return workloads.report(
    "fedco", fedco.__version__, workload, [seconds / rounds] * rounds, setup, **extra
  )


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workload", choices=("shakespeare", "shakespeare_steps"), required=True)
  parser.add_argument("--rounds", type=int, default=None)
  parser.add_argument("--client_chunk", type=int, default=1, help="0: None (vmapped clients)")
  parser.add_argument("--schedule_out", default=None, help="write the rounds' client ids here")
  parser.add_argument("--max_clients", type=int, default=None, help="only the first clients")
  args = parser.parse_args()
  rounds = args.rounds or workloads.WORKLOADS[args.workload].rounds
  out = run(
    args.workload,
    rounds,
    args.client_chunk or None,
    args.schedule_out,
    max_clients=args.max_clients,
  )
  print(json.dumps(out))


if __name__ == "__main__":
  main()
