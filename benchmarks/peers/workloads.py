"""The workloads every peer program runs, with NumPy only (any virtual environment imports it).

* ``logistic``: the E1 logistic workload: 10 clients of 500 synthetic 784-feature examples,
  10 classes, every client in every round, 5 local steps of SGD with batch 32 at learning
  rate 0.01, FedAvg (clients weighted by examples; all equal here). The model is
  ``logits = x @ w.T + b`` with ``w [10, 784]`` (output-major, PyTorch's ``nn.Linear``) and
  ``b [10]``, both starting at zero.
* ``cross_device``: shaped like pfl-research's CIFAR10 benchmark: 1,000 clients of 50
  synthetic CIFAR-shaped images (32x32x3, uint8, 10 random labels), 50 clients sampled per
  round, one local epoch of batch 10 (5 steps) at learning rate 0.1, FedAvg; the model is E2's
  CNN4 (four blocks of conv 3x3 with 32 filters and no bias, GroupNorm with 8 groups, ReLU,
  2x2 max-pool; then a dense layer to 10), each framework's own initialisation.
* ``check``: the cross-check: the logistic data, whole-data local steps (no sampling: every
  framework computes the same numbers), 5 local steps at learning rate 0.1, 3 rounds; the
  final ``w`` and ``b`` must agree to float32 round-off.
* ``feddro``: the compositional method: FedDRO (paper 004, ``fedco.feddro``, ``beta`` 0.5)
  on the logistic data's client-level KL-DRO log form ``gamma log(1/K sum_k exp(f_k/gamma))``
  (``gamma`` 1): the inner estimate ``y`` (one loss per client, ``K`` floats) is averaged
  after every local step, the model after every round.
* ``shakespeare`` (issue 45): TFF's Shakespeare (``../shared/data/shakespeare_tff``, 715
  roles, 37,784 train sequences of 80 characters, preprocessed as FedJAX's
  ``preprocess_client`` does), McMahan et al.'s character LSTM (embedding 8, two LSTM layers
  of 256, dense to the 90 tokens; each framework's own), FedAvg weighted by examples, 10
  clients a round (fedco samples them; its schedule, replayed, goes to the other sides
  as a file: ``read_schedule``), client batch 4,
  client and server learning rate 1, Reddi et al.'s **one local epoch**: a client of ``n``
  sequences takes ``ceil(n / 4)`` steps (1 to 251; median 5), its last batch the remainder.
* ``shakespeare_steps``: the same, but every client takes 10 steps of 4 sequences.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Dict, List

import numpy as np


@dataclasses.dataclass(frozen=True)
class Workload:
  name: str
  num_clients: int
  per_client: int
  clients_per_round: int
  local_steps: int
  batch_size: int  # 0: each client's whole data
  learning_rate: float
  rounds: int  # the default number of timed rounds
  local_epochs: int = 0  # > 0: each client's steps are this many passes over its data


WORKLOADS = {
  "logistic": Workload("logistic", 10, 500, 10, 5, 32, 0.01, 100),
  "cross_device": Workload("cross_device", 1000, 50, 50, 5, 10, 0.1, 10),
  "check": Workload("check", 10, 500, 10, 5, 0, 0.1, 3),
  "feddro": Workload("feddro", 10, 500, 10, 5, 32, 0.01, 100),
  # per_client 0: the clients' own sizes; local_steps 0: the epoch decides (the driver's cap)
  "shakespeare": Workload("shakespeare", 715, 0, 10, 0, 4, 1.0, 5, local_epochs=1),
  "shakespeare_steps": Workload("shakespeare_steps", 715, 0, 10, 10, 4, 1.0, 5),
}
SHAKESPEARE_SEQUENCE = 80
SHAKESPEARE_TRAIN_SEQUENCES = 37_784  # FedJAX's preprocess_client on TFF's train file
FEATURES, CLASSES, IMAGE = 784, 10, (32, 32, 3)
FEDDRO_BETA, FEDDRO_GAMMA = 0.5, 1.0


def data(workload: str, seed: int = 0) -> Dict[str, np.ndarray]:
  """``{"x", "y"}`` of all clients; client ``k`` holds rows ``k * per_client`` onwards."""
  w = WORKLOADS[workload]
  rng = np.random.default_rng(seed)
  n = w.num_clients * w.per_client
  if workload == "cross_device":
    x = rng.integers(0, 256, size=(n,) + IMAGE, dtype=np.uint8)
    return {"x": x, "y": rng.integers(0, CLASSES, size=n).astype(np.int64)}
  x = rng.normal(size=(n, FEATURES)).astype(np.float32)
  truth = rng.normal(size=(CLASSES, FEATURES)).astype(np.float32)
  logits = x @ truth.T / np.sqrt(FEATURES) + rng.normal(size=(n, CLASSES)).astype(np.float32)
  return {"x": x, "y": logits.argmax(1).astype(np.int64)}


def shakespeare_dir() -> str:
  """The shared TFF Shakespeare folder (``FEDCO_SHAKESPEARE_DIR`` overrides it)."""
  here = os.path.dirname(os.path.abspath(__file__))
  default = os.path.join(here, "..", "..", "..", "shared", "data", "shakespeare_tff")
  return os.path.normpath(os.environ.get("FEDCO_SHAKESPEARE_DIR", default))


def read_schedule(path: str, rounds: int, clients_per_round: int) -> List[List[str]]:
  """The rounds' client ids (role names) from a JSON file ``{"clients": [[id, ...], ...]}``
  (written by ``fedco_shakespeare.py --schedule_out``): the first ``rounds`` rounds."""
  with open(path) as f:
    clients = json.load(f)["clients"]
  if len(clients) < rounds or any(len(c) != clients_per_round for c in clients):
    raise ValueError(
      f"{path}: needs {rounds} rounds of {clients_per_round} client ids, got "
      f"{[len(c) for c in clients]}"
    )
  return [list(c) for c in clients[:rounds]]


def client_rows(workload: str, client: int) -> slice:
  w = WORKLOADS[workload]
  return slice(client * w.per_client, (client + 1) * w.per_client)


def images_as_float(x: np.ndarray) -> np.ndarray:
  """uint8 images to float32 in [0, 1] (per batch, as a data loader would)."""
  return x.astype(np.float32) / 255.0


def code_lines(path: str, start: str = "FEDDRO_LINES", end: str = "# end FedDRO") -> int:
  """Code lines (no blanks, comments or docstrings) of a program's section between the
  markers: how many lines expressing a method took in a framework."""
  with open(path) as f:
    lines = f.read().split(start)[1].split(end)[0].splitlines()[1:]
  count, in_doc = 0, False
  for line in (l.strip() for l in lines):
    if in_doc or line.startswith('"""'):
      in_doc = (line.count('"""') == 1) != in_doc  # a docstring opens or closes here
      continue
    count += bool(line) and not line.startswith("#")
  return count


def report(
  peer: str, version: str, workload: str, round_seconds: List[float], setup_seconds: float, **extra
) -> Dict:
  """The JSON every peer program prints as its last line (the driver parses it)."""
  w = WORKLOADS[workload]
  return {
    "peer": peer,
    "version": version,
    "workload": workload,
    "rounds": len(round_seconds),
    "setup_seconds": setup_seconds,
    "round_seconds": [float(s) for s in round_seconds],
    "client_updates_per_round": w.clients_per_round,
    **extra,
  }
