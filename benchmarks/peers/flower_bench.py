r"""Flower's side of the peer comparison (issue 17): the workloads of ``workloads.py`` on
Flower's Simulation Engine (Ray), with PyTorch clients.

    /path/to/flower-venv/bin/python benchmarks/peers/flower_bench.py --workload=logistic
    /path/to/flower-venv/bin/python benchmarks/peers/flower_bench.py --workload=check

Same contract as the other peer programs: the last stdout line is the JSON
``workloads.report`` (``round_seconds`` timed on the server, ``setup_seconds`` from the
program's start until the first round starts).

How it is written, following Flower 1.4x's documentation (Message API):

* a ``ClientApp`` whose ``@app.train()`` function loads the received ``ArrayRecord`` into a
  ``torch.nn`` model, runs the local SGD steps on the node's partition (``partition-id`` of
  its ``node_config``) through a ``torch.utils.data.DataLoader`` (shuffled, seeded per
  client and round: the first ``local_steps`` batches of an epoch; ``check``: the whole data,
  unshuffled) and replies with the model and a ``MetricRecord`` holding ``num-examples``;
* a ``ServerApp`` whose ``@app.main()`` runs a ``flwr.serverapp.strategy`` strategy's
  ``start(grid, initial_arrays, num_rounds, train_config)``; the logistic, cross-device and
  check workloads use Flower's ``FedAvg`` (``fraction_train`` 1.0 or 50/1000, federated
  evaluation off, averaging weighted by ``num-examples``);
* ``flwr.simulation.run_simulation(server_app, client_app, num_supernodes, backend_config)``:
  one virtual SuperNode per client; Ray is given the machine's CPUs (``init_args.num_cpus``)
  and every ClientApp ``--client_cpus`` of them (default 1, i.e. ``os.cpu_count()`` Ray
  actors training clients in parallel; Ray sets each actor's ``OMP_NUM_THREADS``, so torch
  uses that many threads there: the framework sets it). Flower 1.42 marks
  ``run_simulation`` deprecated in favour of ``flwr run`` on an app project; it is the same
  Simulation Engine, driven from Python (one process, as the contract asks).

Timing: a strategy mixin stamps the wall clock when ``configure_train`` of a round is called
and when that round's ``aggregate_evaluate`` returns (the last call of a round in
``Strategy.start``; federated evaluation is off, so it returns at once). Before the first
round the ServerApp sends a ``query`` message to one node per Ray actor and waits for the
replies, so Ray's start-up, the actors' imports and their copy of the data land in
``setup_seconds`` and not in round 1 (FedDRO's initial ``y_bar_0`` exchange does the same).
Each Ray actor builds the data once with ``workloads.data`` and keeps it.

FedDRO (``--workload=feddro``): a custom ``Strategy`` and ClientApp functions; see the
``FedDRO`` section. One Flower round per local step (the inner estimate ``y``, ``K`` floats,
is averaged by the server after every step); each client keeps its local model between the
steps of a round in its ``Context.state``; the model is sent down at the first step of a
round and averaged after its last. ``round_seconds`` are FedDRO rounds (``local_steps``
Flower rounds each).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

START = time.perf_counter()
HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
  sys.path.insert(0, HERE)
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # no network calls from the benchmark

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch_cnn4  # noqa: E402
import workloads  # noqa: E402
from flwr.app import (  # noqa: E402
  Array,
  ArrayRecord,
  ConfigRecord,
  Context,
  Message,
  MessageType,
  MetricRecord,
  RecordDict,
)
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from flwr.serverapp.strategy import FedAvg, Strategy  # noqa: E402

SEED = 0
RESULTS = {}  # filled by the ServerApp (a thread of this process)


# ---- models: the logistic model and E2's CNN4 (torch_cnn4.TorchCNN4) ----


def make_model(workload: str) -> torch.nn.Module:
  if workload == "cross_device":
    return torch_cnn4.TorchCNN4()  # torch's own initialisation (seeded on the server)
  model = torch.nn.Linear(workloads.FEATURES, workloads.CLASSES)  # w [10, 784], b [10]
  with torch.no_grad():
    model.weight.zero_()
    model.bias.zero_()
  return model


# ---- data: built once per process (each Ray actor), client k = partition k ----------------

_DATA = {}


def client_dataset(workload: str, k: int) -> torch.utils.data.TensorDataset:
  if workload not in _DATA:
    _DATA[workload] = workloads.data(workload)
  arrays = _DATA[workload]
  rows = workloads.client_rows(workload, k)
  x = torch.from_numpy(arrays["x"][rows])
  if workload == "cross_device":
    x = x.permute(0, 3, 1, 2)  # NHWC uint8 -> NCHW uint8; floats per batch, below
  return torch.utils.data.TensorDataset(x, torch.from_numpy(arrays["y"][rows]))


def as_input(workload: str, x: torch.Tensor) -> torch.Tensor:
  if workload == "cross_device":
    return torch.from_numpy(workloads.images_as_float(x.numpy()))
  return x


# ---- the ClientApp -------------------------------------------------------------------------

client_app = ClientApp()


@client_app.query()
def warm_up(msg: Message, context: Context) -> Message:
  """Loads the data into this actor (and, for FedDRO, returns ``g_k(x_0)``: see below)."""
  workload = msg.content["config"]["workload"]
  k = int(context.node_config["partition-id"])
  client_dataset(workload, k)
  content = RecordDict({"metrics": MetricRecord({"torch-threads": torch.get_num_threads()})})
  if workload == "feddro":
    content["y"] = ArrayRecord([feddro_inner_at_start(msg, k)])
  return Message(content, reply_to=msg)


@client_app.train()
def train(msg: Message, context: Context) -> Message:
  config = msg.content["config"]
  workload = config["workload"]
  if workload == "feddro":
    return feddro_client_step(msg, context)
  w = workloads.WORKLOADS[workload]
  k = int(context.node_config["partition-id"])
  data = client_dataset(workload, k)
  model = make_model(workload)
  model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
  model.train()
  if w.batch_size:  # shuffled mini-batches (seeded per client and round)
    gen = torch.Generator().manual_seed(SEED * 1_000_003 + 1000 * int(config["server-round"]) + k)
    loader = torch.utils.data.DataLoader(data, batch_size=w.batch_size, shuffle=True, generator=gen)
  else:  # check: the client's whole data every step, no shuffling
    loader = torch.utils.data.DataLoader(data, batch_size=len(data), shuffle=False)
  optimizer = torch.optim.SGD(model.parameters(), lr=w.learning_rate)
  steps = 0
  while steps < w.local_steps:
    for x, y in loader:
      optimizer.zero_grad()
      F.cross_entropy(model(as_input(workload, x)), y).backward()
      optimizer.step()
      steps += 1
      if steps == w.local_steps:
        break
  content = RecordDict(
    {
      "arrays": ArrayRecord(model.state_dict()),
      "metrics": MetricRecord(
        {"num-examples": len(data), "torch-threads": torch.get_num_threads()}
      ),
    }
  )
  return Message(content, reply_to=msg)


# ---- the ServerApp: strategies, round clock -------------------------------------------------


class RoundClock:
  """Mixin: stamps each round's start (``configure_train`` called) and end (``aggregate_
  evaluate`` returned: the last step of a round in ``Strategy.start``)."""

  def configure_train(self, server_round, arrays, config, grid):
    RESULTS.setdefault("round_starts", []).append(time.perf_counter())
    return super().configure_train(server_round, arrays, config, grid)

  def aggregate_evaluate(self, server_round, replies):
    out = super().aggregate_evaluate(server_round, replies)
    RESULTS.setdefault("round_ends", []).append(time.perf_counter())
    return out


class TimedFedAvg(RoundClock, FedAvg):
  pass


server_app = ServerApp()


def warm_up_actors(grid: Grid, config: ConfigRecord, nodes: int):
  """A ``query`` to ``nodes`` nodes; returns the replies (not part of any round)."""
  total = RESULTS["options"]["nodes"]
  while len(ids := sorted(grid.get_node_ids())) < total:  # the engine registers them
    time.sleep(0.01)
  ids = ids[:nodes]
  messages = [
    Message(RecordDict({"config": config}), dst_node_id=i, message_type=MessageType.QUERY)
    for i in ids
  ]
  replies = list(grid.send_and_receive(messages))
  errors = [m.error.reason for m in replies if m.has_error()]
  if errors or len(replies) != len(ids):
    raise RuntimeError(f"warm-up failed: {errors or 'missing replies'}")
  return replies


@server_app.main()
def server_main(grid: Grid, context: Context) -> None:
  opts = RESULTS["options"]
  workload, rounds = opts["workload"], opts["rounds"]
  w = workloads.WORKLOADS[workload]
  config = ConfigRecord({"workload": workload})
  torch.manual_seed(SEED)
  random.seed(SEED)  # Flower samples nodes with Python's random
  initial = ArrayRecord(make_model(workload).state_dict())
  if workload == "feddro":
    strategy = TimedFedDRO(w.num_clients, w.local_steps)
    replies = warm_up_actors(grid, config, w.num_clients)  # y_bar_0 = mean_k g_k(x_0)
    strategy.set_initial_y(replies)
    num_rounds = rounds * w.local_steps  # one Flower round per local step
  else:
    replies = warm_up_actors(grid, config, opts["actors"])
    strategy = TimedFedAvg(
      fraction_train=w.clients_per_round / w.num_clients,
      fraction_evaluate=0.0,
      min_train_nodes=w.clients_per_round,
      min_available_nodes=w.num_clients,
    )
    num_rounds = rounds
  RESULTS["torch_threads_in_actors"] = sorted(
    {int(m.content["metrics"]["torch-threads"]) for m in replies}
  )
  RESULTS["first_round_start"] = time.perf_counter()
  result = strategy.start(
    grid=grid, initial_arrays=initial, num_rounds=num_rounds, train_config=config
  )
  RESULTS["arrays"] = result.arrays


# ---- FedDRO ---------------------------------------------------------------------------------
# FedDRO (fedco.feddro, paper 004 Algorithm 2) on the client-level KL-DRO log form
# gamma log(1/K sum_k exp(f_k / gamma)) (fedco.problems.client_kl_dro_log): g_k(x; batch) is
# the K-vector K * mean_batch l(x) e_k, f(v) = gamma (logsumexp(v / gamma) - log K), so
# grad f(y) = softmax(y / gamma). Per local step and client, with the shared y_bar:
#   z = J_{g_k}(x_k; zeta)^T grad f(y_bar) = K softmax(y_bar / gamma)_k grad l(x_k; zeta)
#   x_k <- x_k - eta z
#   y_k = (1 - beta)(y_bar - g_k(x_k_old; zeta')) + g_k(x_k_new; zeta')
#   y_bar = mean_k y_k (server, every step);  x = mean_k x_k (server, every local_steps steps)
# y_bar_0 = mean_k g_k(x_0; one batch). Batches are drawn with replacement (as fedco draws).
# FEDDRO_LINES: the lines from here to "end FedDRO" (code only) are what FedDRO takes.


def _feddro_batch(k: int, server_round: int, draw: int):
  w = workloads.WORKLOADS["feddro"]
  data = client_dataset("feddro", k)
  rng = np.random.default_rng([SEED, k, server_round, draw])
  idx = torch.from_numpy(rng.integers(0, len(data), size=w.batch_size))
  return data.tensors[0][idx], data.tensors[1][idx]


def feddro_inner_at_start(msg: Message, k: int) -> np.ndarray:
  """``g_k(x_0; one batch)``: the K-vector with ``K * loss`` at entry ``k``."""
  num_clients = workloads.WORKLOADS["feddro"].num_clients
  model = make_model("feddro")  # x_0 = zeros, as the server's initial model
  x, y = _feddro_batch(k, 0, 0)
  g = np.zeros(num_clients, np.float32)
  with torch.no_grad():
    g[k] = num_clients * F.cross_entropy(model(x), y).item()
  return g


def feddro_client_step(msg: Message, context: Context) -> Message:
  w = workloads.WORKLOADS["feddro"]
  num_clients, beta, gamma = w.num_clients, workloads.FEDDRO_BETA, workloads.FEDDRO_GAMMA
  k = int(context.node_config["partition-id"])
  server_round, step = (
    int(msg.content["config"]["server-round"]),
    int(msg.content["config"]["step"]),
  )
  model = make_model("feddro")
  source = msg.content["arrays"] if step == 0 else context.state["x"]  # x_bar or own x_k
  model.load_state_dict(source.to_torch_state_dict())
  y_bar = msg.content["y"].to_numpy_ndarrays()[0]
  weight = torch.softmax(torch.from_numpy(y_bar) / gamma, 0)[k]  # grad f(y_bar)_k
  x_zeta, y_zeta = _feddro_batch(k, server_round, 1)
  x_next, y_next = _feddro_batch(k, server_round, 2)
  with torch.no_grad():
    loss_old = F.cross_entropy(model(x_next), y_next).item()
  model.zero_grad()
  (num_clients * weight * F.cross_entropy(model(x_zeta), y_zeta)).backward()
  with torch.no_grad():
    for p in model.parameters():
      p -= w.learning_rate * p.grad
    loss_new = F.cross_entropy(model(x_next), y_next).item()
  y_k = (1 - beta) * y_bar.astype(np.float32)
  y_k[k] += num_clients * loss_new - (1 - beta) * num_clients * loss_old
  arrays = ArrayRecord(model.state_dict())
  context.state["x"] = arrays
  content = RecordDict(
    {"y": ArrayRecord([y_k]), "metrics": MetricRecord({"num-examples": w.per_client})}
  )
  if step == w.local_steps - 1:
    content["arrays"] = arrays
  return Message(content, reply_to=msg)


class FedDROStrategy(Strategy):
  """One Flower round per FedDRO local step: sends ``y_bar`` (and at a round's first step
  the model) to every client, averages the replies' ``y`` (and at its last step the
  models, weighted by ``num-examples``)."""

  def __init__(self, num_clients: int, local_steps: int):
    self.num_clients, self.local_steps, self.y_bar = num_clients, local_steps, None

  def set_initial_y(self, replies):
    self.y_bar = np.mean([m.content["y"].to_numpy_ndarrays()[0] for m in replies], axis=0)

  def configure_train(self, server_round, arrays, config, grid):
    step = (server_round - 1) % self.local_steps
    nodes = sorted(grid.get_node_ids())
    if len(nodes) != self.num_clients:
      raise RuntimeError(f"FedDRO needs all {self.num_clients} nodes, found {len(nodes)}")
    content = RecordDict(
      {
        "y": ArrayRecord([self.y_bar.astype(np.float32)]),
        "config": ConfigRecord({**dict(config), "server-round": server_round, "step": step}),
      }
    )
    if step == 0:
      content["arrays"] = arrays
    return [Message(content, dst_node_id=i, message_type=MessageType.TRAIN) for i in nodes]

  def aggregate_train(self, server_round, replies):
    replies = list(replies)
    errors = [m.error.reason for m in replies if m.has_error()]
    if errors or len(replies) != self.num_clients:
      raise RuntimeError(f"FedDRO round {server_round}: {errors or 'missing replies'}")
    self.y_bar = np.mean([m.content["y"].to_numpy_ndarrays()[0] for m in replies], axis=0)
    if (server_round - 1) % self.local_steps != self.local_steps - 1:
      return None, None  # keeps the server model
    sizes = np.array([m.content["metrics"]["num-examples"] for m in replies], np.float64)
    models = [m.content["arrays"].to_numpy_ndarrays() for m in replies]
    names = list(replies[0].content["arrays"].keys())
    averaged = {
      name: sum(s / sizes.sum() * mdl[i] for s, mdl in zip(sizes, models))
      for i, name in enumerate(names)
    }
    return ArrayRecord({n: Array(np.asarray(a, np.float32)) for n, a in averaged.items()}), None

  def configure_evaluate(self, server_round, arrays, config, grid):
    return []

  def aggregate_evaluate(self, server_round, replies):
    return None

  def summary(self):
    pass


# end FedDRO


class TimedFedDRO(RoundClock, FedDROStrategy):
  pass


def feddro_lines() -> int:
  """Code lines (no blanks, comments or docstrings) of the FedDRO section above."""
  return workloads.code_lines(os.path.abspath(__file__))


# ---- main ----------------------------------------------------------------------------------


def main(start: float = START):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workload", choices=sorted(workloads.WORKLOADS), required=True)
  parser.add_argument("--rounds", type=int, default=None)
  parser.add_argument(
    "--client_cpus",
    type=float,
    default=1.0,
    help="Ray CPUs per ClientApp (actors = cpu_count / client_cpus)",
  )
  args = parser.parse_args()
  w = workloads.WORKLOADS[args.workload]
  rounds = args.rounds or w.rounds
  if rounds < 1:
    raise ValueError(f"--rounds must be >= 1, got {rounds}")
  cpus = os.cpu_count()
  if not 0 < args.client_cpus <= cpus:
    raise ValueError(f"--client_cpus must be in (0, {cpus}], got {args.client_cpus}")
  torch.set_num_threads(cpus)  # the server side; Ray sets the actors' threads
  actors = int(cpus // args.client_cpus)
  RESULTS.clear()
  RESULTS["options"] = {
    "workload": args.workload,
    "rounds": rounds,
    "actors": actors,
    "nodes": w.num_clients,
  }

  import flwr  # pylint: disable=g-import-not-at-top
  from flwr.simulation import run_simulation  # pylint: disable=g-import-not-at-top

  backend_config = {
    "init_args": {"num_cpus": cpus, "num_gpus": 0},
    "client_resources": {"num_cpus": args.client_cpus, "num_gpus": 0.0},
  }
  run_simulation(
    server_app=server_app,
    client_app=client_app,
    num_supernodes=w.num_clients,
    backend_config=backend_config,
  )
  import ray  # pylint: disable=g-import-not-at-top

  if ray.is_initialized():
    ray.shutdown()

  starts, ends = RESULTS["round_starts"], RESULTS["round_ends"]
  if args.workload == "feddro":  # a FedDRO round is local_steps Flower rounds
    starts, ends = starts[:: w.local_steps], ends[w.local_steps - 1 :: w.local_steps]
  round_seconds = [e - s for s, e in zip(starts, ends)]
  if len(round_seconds) != rounds:
    raise RuntimeError(f"timed {len(round_seconds)} rounds, expected {rounds}")
  notes = [
    f"flwr.simulation.run_simulation on Ray; {w.num_clients} virtual SuperNodes; Ray "
    f"num_cpus={cpus}, {args.client_cpus:g} CPU per ClientApp ({actors} actors); torch "
    f"threads in the actors {RESULTS['torch_threads_in_actors']} (set by Ray)",
    "rounds timed on the server: configure_train called -> aggregate_evaluate "
    "returned; a warm-up query before round 1 (Ray start-up, actor imports, data) is in "
    "setup_seconds",
  ]
  extra = {"notes": notes, "client_cpus": args.client_cpus, "ray_actors": actors}
  if args.workload == "feddro":
    extra["feddro_lines"] = feddro_lines()
    extra["flower_rounds_per_round"] = w.local_steps
    notes.append(
      "FedDRO: one Flower round per local step (y_bar, K floats, averaged by the server "
      "after every step), the local model kept in each node's Context.state between steps, "
      "sent down at a round's first step and averaged after its last; y_bar_0 from a query "
      "before round 1; a custom Strategy (configure_train/aggregate_train) and ClientApp "
      f"functions, {extra['feddro_lines']} code lines"
    )
  if args.workload == "check":
    state = RESULTS["arrays"].to_torch_state_dict()
    extra["final_params"] = {"w": state["weight"].tolist(), "b": state["bias"].tolist()}
  report = workloads.report(
    "flower",
    flwr.__version__,
    args.workload,
    round_seconds,
    RESULTS["first_round_start"] - start,
    **extra,
  )
  sys.stdout.flush()
  print(json.dumps(report), flush=True)


if __name__ == "__main__":
  # Run the module imported by name, so Ray's workers pickle the ClientApp's functions by
  # reference (``flower_bench`` is importable there: Flower passes sys.path to the workers)
  # and each actor keeps its data between messages.
  import flower_bench  # pylint: disable=g-import-not-at-top

  flower_bench.main(START)
