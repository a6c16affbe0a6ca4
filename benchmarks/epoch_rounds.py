r"""Rounds of one local epoch per client: padded, masked, sequential and sorted chunks.

    python -m benchmarks.epoch_rounds [--rounds=2] [--modes=chunk1,chunk2,padded]
        [--out=benchmarks/results/epoch_rounds.json]

Issue 45's setting (Reddi et al.): FedAvg on Shakespeare with ``fedco.models.ShakespeareLSTM``
and the loss masked on padding, 10 clients a round, batch 4, one local epoch, so a client of
``n_k`` sequences takes ``ceil(n_k / 4)`` steps (1 to 251 on TFF's Shakespeare, read from
``../shared/data/shakespeare_tff`` (beside the repository) when present; otherwise synthetic clients with a
similar spread of step counts). Every mode runs the same rounds (the sampling depends on the
seed only), one round per call of a program compiled ahead of time, the modes alternated
round by round; rounds per second is the median over the rounds:

* ``padded``: today's round, every client ``vmap``-ed over a ``lax.scan`` of the cap
  ``local_steps = epoch_steps(data, 4)`` (the largest client's steps), finished clients
  masked (``client_chunk=None``). A round runs that many steps whatever it samples, so its
  time is the per-step time of the vmapped scan times the cap: measured on a scan of
  ``--padded_probe`` steps and scaled to the cap (reported as ``estimated``), unless
  ``--padded_probe=0`` runs it whole.
* ``chunk10``: the round's 10 clients as one chunk, ``vmap``-ed over a ``while_loop`` that
  runs to the round's longest client, masked. Left out of ``--modes``, it is estimated as
  the padded probe's per-step time times the round's longest client's steps (a smoke run,
  ``results/epoch_rounds_smoke.json``, measured both: 7.2 s a step in the while loop
  against 7.4 s in the scan, on a machine loaded 13 deep).
* ``chunk1``: the clients one after another, each exactly its own steps.
* ``chunk2`` / ``chunk5``: sorted by step count, 2 or 5 at a time.

``client_steps_executed`` counts the client-steps each mode computes (useful and masked) for
the rounds run; ``client_steps_useful`` the steps the clients take. Decision 101.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

import jax
import numpy as np

import fedco
from benchmarks import _common

DATA = fedco.data.tff.DEFAULT_DATA_DIR  # ../shared/data/shakespeare_tff beside the repository
CLIENTS, BATCH, SEED = 10, 4, 0


def _loss(model):
  def loss(params, example):
    return fedco.data.tff.shakespeare_loss(model.apply(params, example["x"]), example["y"])

  return loss


def _data(seed: int = 0, max_clients=None):
  """TFF's Shakespeare train split, or synthetic clients with its step spread."""
  if os.path.isdir(DATA):
    return fedco.data.load_shakespeare_tff(DATA, max_clients=max_clients).train, "shakespeare_tff"
  rng = np.random.default_rng(seed)
  counts = np.minimum(np.ceil(rng.lognormal(2.7, 1.3, max_clients or 715)), 1003).astype(int)
  vocab = fedco.models.SHAKESPEARE_VOCAB_SIZE
  clients = [
    {
      "x": rng.integers(1, vocab, (n, 80)).astype(np.int32),
      "y": rng.integers(1, vocab, (n, 80)).astype(np.int32),
    }
    for n in counts
  ]
  return fedco.FederatedData.from_clients(clients), "synthetic"


class Mode:
  """One way of running the rounds: its simulator, compiled one-round program and state."""

  def __init__(self, name, data, model, params, cap, chunk):
    self.name, self.chunk, self.cap = name, chunk, cap
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")  # the padded probe's cap cuts epochs: its point
      self.sim = fedco.Simulator(
        fedco.plain(_loss(model)),
        fedco.fedavg(1.0, cap, weighting="samples"),
        data,
        batch_size=BATCH,
        clients_per_round=CLIENTS,
        evaluate=False,
        local_epochs=1,
        client_chunk=chunk,
      )
    self.state = self.sim.init(params, SEED)
    start = time.perf_counter()
    args = (self.state, self.sim.data, self.sim.metrics_data, np.int32(-1))
    self.compiled = self.sim._run.lower(*args, rounds=1).compile()  # pylint: disable=protected-access
    self.compile_seconds = time.perf_counter() - start
    self.seconds, self.steps = [], []

  def round(self):
    start = time.perf_counter()
    self.state, metrics = self.compiled(
      self.state, self.sim.data, self.sim.metrics_data, np.int32(-1)
    )
    jax.block_until_ready(self.state)
    self.seconds.append(time.perf_counter() - start)
    self.steps.append(np.asarray(metrics["local_steps"][0]))
    return np.asarray(metrics["clients"][0])


def executed(steps: np.ndarray, chunk, cap: int) -> int:
  """Client-steps a round computes: ``chunk=None`` every client the cap; else the clients
  sorted by steps, each chunk its longest client's steps times its size."""
  if chunk is None:
    return int(steps.size * cap)
  s = np.sort(steps)
  return int(sum(len(s[i : i + chunk]) * s[i : i + chunk].max() for i in range(0, s.size, chunk)))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--modes", default="chunk1,chunk2,padded")
  parser.add_argument("--padded_probe", type=int, default=2, help="0: run the padded cap whole")
  parser.add_argument("--max_clients", type=int, default=None, help="a smoke run's clients")
  parser.add_argument("--out", default="benchmarks/results/epoch_rounds.json")
  args = parser.parse_args()
  info = _common.machine_info()
  data, source = _data(max_clients=args.max_clients)
  cap = fedco.runtime.epoch_steps(data, BATCH)
  model = fedco.models.ShakespeareLSTM()
  params = model.init(jax.random.PRNGKey(SEED), np.zeros(80, np.int32))
  modes = []
  for name in args.modes.split(","):
    if name == "padded":
      length = cap if args.padded_probe <= 0 else min(args.padded_probe, cap)
      modes.append(Mode(name, data, model, params, length, None))
    else:
      modes.append(Mode(name, data, model, params, cap, int(name.removeprefix("chunk"))))
    print(f"{name}: compiled in {modes[-1].compile_seconds:.1f} s", flush=True)
  loads, sampled = [], []
  for r in range(args.rounds):
    loads.append(_common.load_average())
    ids = [mode.round() for mode in modes]  # alternated: each mode's round r in turn
    assert all(np.array_equal(i, ids[0]) for i in ids), "the modes sampled different clients"
    sampled.append(ids[0].tolist())
    print(f"round {r}: " + ", ".join(f"{m.name} {m.seconds[-1]:.2f} s" for m in modes), flush=True)
  results = {}
  useful = None
  for mode in modes:
    steps = np.stack(mode.steps)
    if mode.name != "padded":
      useful = steps if useful is None else useful
      assert np.array_equal(steps, useful), "the modes' clients took different steps"
    median = statistics.median(mode.seconds)
    entry = {
      "client_chunk": mode.chunk,
      "compile_seconds": mode.compile_seconds,
      "round_seconds": mode.seconds,
      "median_round_seconds": median,
    }
    if mode.name == "padded" and mode.cap < cap:
      per_step = median / mode.cap
      entry.update(probe_steps=mode.cap, per_step_seconds=per_step, estimated=True)
      median = per_step * cap
      entry["median_round_seconds"] = median
    entry["rounds_per_second"] = 1.0 / median
    results[mode.name] = entry
  for mode in modes:
    results[mode.name]["client_steps_executed"] = sum(executed(s, mode.chunk, cap) for s in useful)
  probe = results.get("padded", {}).get("per_step_seconds")
  if probe is not None and "chunk10" not in results:  # the round's longest client's steps
    rounds = [probe * int(s.max()) for s in useful]
    results["chunk10"] = {
      "client_chunk": CLIENTS,
      "estimated": True,
      "round_seconds": rounds,
      "median_round_seconds": statistics.median(rounds),
      "rounds_per_second": 1.0 / statistics.median(rounds),
      "client_steps_executed": sum(executed(s, CLIENTS, cap) for s in useful),
    }
  fastest = max(results.values(), key=lambda e: e["rounds_per_second"])["rounds_per_second"]
  for entry in results.values():
    entry["speed_vs_fastest"] = entry["rounds_per_second"] / fastest
  out = {
    "benchmark": "epoch_rounds",
    "timestamp": _common.timestamp(),
    "machine": info,
    "load_average_per_round": loads,
    "load_average_end": _common.load_average(),
    "data": source,
    "setting": {
      "model": "ShakespeareLSTM",
      "clients_per_round": CLIENTS,
      "batch_size": BATCH,
      "local_epochs": 1,
      "cap_local_steps": cap,
      "rounds": args.rounds,
      "seed": SEED,
      "max_clients": args.max_clients,
    },
    "sampled_clients": sampled,
    "client_steps": useful.tolist(),
    "client_steps_useful": int(useful.sum()),
    "modes": results,
  }
  _common.write_json(args.out, out)
  print({k: round(v["rounds_per_second"], 4) for k, v in results.items()})


if __name__ == "__main__":
  main()
