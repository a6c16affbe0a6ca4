r"""FedJAX's side of the Shakespeare peer workloads (issue 45), in FedJAX's own virtual
environment (``benchmarks/peers/requirements-fedjax.txt``).

    /path/to/fedjax-venv/bin/python benchmarks/peers/fedjax_bench.py --workload=shakespeare \
        --rounds=5 --schedule=clients.json

Same contract as the other peer programs (``workloads.py``): the last stdout line is the JSON
``workloads.report``. Everything is FedJAX's own, as its Shakespeare examples use it:

* data: ``fedjax.InMemoryFederatedData`` of the scheduled clients' sequences exactly as fedco
  trains on them (``--schedule``'s ``.npz``, written by ``fedco_shakespeare.py``): the same
  examples, so the same steps. FedJAX's own ``fedjax.datasets.shakespeare.preprocess_client``
  (``federated_data(sequences=None)``, on TFF's HDF5 read with h5py) is *not* TFF's
  preprocessing that fedco's ``load_shakespeare_tff`` follows: it joins a client's snippets
  before cutting rows of 80 (30,249 train sequences, 7,857 one-epoch steps at batch 4)
  where TFF pads each snippet on its own (37,784 sequences, 9,617 steps), and it numbers
  the characters differently (BOS 1, EOS 2); so the timed runs use fedco's sequences;
* model: ``fedjax.models.shakespeare.create_lstm_model()`` (haiku: embedding 8, two LSTMs
  of 256, dense to 90), its ``train_loss``, gradients by ``fedjax.model_grad``;
* algorithm: ``fedjax.algorithms.fed_avg.federated_averaging`` with client and server
  ``fedjax.optimizers.sgd`` at the workload's rate (1), clients weighted by their examples;
  ``client_batch_hparams``: ``ShuffleRepeatBatchHParams(batch_size=4, num_epochs=1)`` for
  ``shakespeare`` (each client ``ceil(n / 4)`` batches, the last one the remainder) and
  ``num_epochs=None, num_steps=10`` for ``shakespeare_steps``.

The rounds' clients are the ids fedco sampled (``--schedule``, from ``fedco_shakespeare.py
--schedule_out``). FedJAX runs a client as a Python loop of ``jax.jit``-ed steps, one
dispatch per batch, and compiles a step once per distinct batch shape (4, and the remainders
3, 2, 1). So the rounds run twice from the same initial model: a warm-up pass (the compiles
happen where they would in a long run: ``warmup_round_seconds``, and XLA's own compile time
from ``jax.monitoring``, ``compile_seconds``), then the timed pass (``round_seconds``).
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import sys
import time

START = time.perf_counter()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import workloads  # noqa: E402

# XLA compile time, summed from JAX's own duration events (whatever their exact names in the
# pinned jax: every event about backend compilation).
COMPILE_EVENTS: collections.Counter = collections.Counter()


def _listen(event: str, seconds: float, **_) -> None:
  if "compile" in event and "cache" not in event:
    COMPILE_EVENTS[event] += seconds


jax.monitoring.register_event_duration_secs_listener(_listen)


def read_tff_shakespeare(path: str, max_clients=None):
  """``{role: {"snippets": object array of bytes}}`` from TFF's HDF5 file, in file order."""
  import h5py  # pylint: disable=g-import-not-at-top

  out = {}
  with h5py.File(path, "r") as f:
    for role in f["examples"]:
      if max_clients is not None and len(out) == max_clients:
        break
      snippets = f["examples"][role]["snippets"][()]
      out[role] = {"snippets": np.array(list(snippets), dtype=object)}
  return out


def federated_data(max_clients=None, data_dir=None, sequences=None):
  """FedJAX's in-memory clients: ``sequences`` (an ``.npz`` of ``"<role>/x"``, ``"<role>/y"``
  from ``fedco_shakespeare.py``: the sequences fedco trains on) or, with ``None``, TFF's
  HDF5 file preprocessed by FedJAX's own ``preprocess_client``."""
  import fedjax  # pylint: disable=g-import-not-at-top

  if sequences is not None:
    with np.load(sequences) as f:
      clients = {}
      for name in f.files:
        role, key = name.rsplit("/", 1)
        clients.setdefault(role, {})[key] = f[name]
    return fedjax.InMemoryFederatedData(clients)

  raw = read_tff_shakespeare(
    os.path.join(data_dir or workloads.shakespeare_dir(), "shakespeare_train.h5"), max_clients
  )
  preprocess = functools.partial(
    fedjax.datasets.shakespeare.preprocess_client,
    sequence_length=workloads.SHAKESPEARE_SEQUENCE,
  )
  return fedjax.InMemoryFederatedData(raw).preprocess_client(preprocess)


def batch_hparams(workload: str):
  import fedjax  # pylint: disable=g-import-not-at-top

  w = workloads.WORKLOADS[workload]
  if w.local_epochs:
    return fedjax.ShuffleRepeatBatchHParams(batch_size=w.batch_size, num_epochs=w.local_epochs)
  return fedjax.ShuffleRepeatBatchHParams(
    batch_size=w.batch_size, num_epochs=None, num_steps=w.local_steps
  )


def algorithm(workload: str):
  """``(model, FedAvg)``: FedJAX's Shakespeare LSTM and its federated averaging."""
  import fedjax  # pylint: disable=g-import-not-at-top

  w = workloads.WORKLOADS[workload]
  model = fedjax.models.shakespeare.create_lstm_model()
  fed_avg = fedjax.algorithms.fed_avg.federated_averaging(
    grad_fn=fedjax.model_grad(model),
    client_optimizer=fedjax.optimizers.sgd(learning_rate=w.learning_rate),
    server_optimizer=fedjax.optimizers.sgd(learning_rate=w.learning_rate),
    client_batch_hparams=batch_hparams(workload),
  )
  return model, fed_avg


def client_steps(data, workload: str, ids):
  """Each client's local steps (batches) under the workload's batching."""
  hparams = batch_hparams(workload)
  return [
    sum(1 for _ in dataset.shuffle_repeat_batch(hparams)) for _, dataset in data.get_clients(ids)
  ]


def run_rounds(fed_avg, params, data, schedule, seed=0):
  """``(final server state, seconds of each round)``: FedAvg over the schedule's rounds."""
  state = fed_avg.init(params)
  key = jax.random.PRNGKey(seed)
  seconds = []
  for ids in schedule:
    start = time.perf_counter()
    key, sub = jax.random.split(key)
    rngs = jax.random.split(sub, len(ids))
    clients = [(cid, ds, rng) for (cid, ds), rng in zip(data.get_clients(ids), rngs)]
    state, _ = fed_avg.apply(state, clients)
    jax.block_until_ready(state.params)
    seconds.append(time.perf_counter() - start)
  return state, seconds


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workload", choices=("shakespeare", "shakespeare_steps"), required=True)
  parser.add_argument("--rounds", type=int, default=None)
  parser.add_argument("--schedule", required=True, help="the rounds' client ids (JSON)")
  args = parser.parse_args()
  w = workloads.WORKLOADS[args.workload]
  rounds = args.rounds or w.rounds
  schedule = workloads.read_schedule(args.schedule, rounds, w.clients_per_round)
  from importlib import metadata  # pylint: disable=g-import-not-at-top

  sequences = args.schedule + ".npz"  # fedco's sequences of the scheduled clients
  if not os.path.exists(sequences):
    raise FileNotFoundError(f"{sequences}: fedco_shakespeare.py --schedule_out writes it")
  data = federated_data(sequences=sequences)
  unknown = sorted({c for ids in schedule for c in ids} - set(data.client_ids()))
  if unknown:
    raise ValueError(f"--schedule={args.schedule}: unknown client ids {unknown[:3]}")
  model, fed_avg = algorithm(args.workload)
  params = model.init(jax.random.PRNGKey(0))
  data_seconds = time.perf_counter() - START
  _, warmup = run_rounds(fed_avg, params, data, schedule)
  compile_seconds = sum(COMPILE_EVENTS.values())
  setup = time.perf_counter() - START
  COMPILE_EVENTS.clear()
  final, seconds = run_rounds(fed_avg, params, data, schedule)
  norm = float(np.sqrt(sum(np.sum(np.square(a)) for a in jax.tree_util.tree_leaves(final.params))))
  report = workloads.report(
    "fedjax",
    metadata.version("fedjax"),
    args.workload,
    seconds,
    setup,
    data_seconds=data_seconds,
    warmup_round_seconds=warmup,
    compile_seconds=compile_seconds,
    compile_events=dict(COMPILE_EVENTS) or None,  # none: the timed pass compiled nothing
    duplicate_run_seconds=sum(seconds),  # a one-pass program would not run these
    jax_version=jax.__version__,
    round_clients=schedule,
    client_steps=[client_steps(data, args.workload, ids) for ids in schedule],
    train_sequences=sum(len(ds) for _, ds in data.get_clients(data.client_ids())),
    num_clients=data.num_clients(),
    final_params_norm=norm,
  )
  print(json.dumps(report))


if __name__ == "__main__":
  main()
