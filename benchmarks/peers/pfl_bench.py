r"""pfl-research's side of the peer comparison (issue 17): the workloads of ``workloads.py`` on
Apple's pfl simulator, with PyTorch clients.

    /path/to/pfl-venv/bin/python benchmarks/peers/pfl_bench.py --workload=logistic
    /path/to/pfl-venv/bin/python benchmarks/peers/pfl_bench.py --workload=check

Same contract as the other peer programs: the last stdout line is the JSON
``workloads.report`` (``round_seconds`` timed on the server, ``setup_seconds`` from the
program's start until the first round starts). Pinned packages:
``benchmarks/peers/requirements-pfl.txt``.

How it is written, following pfl's documentation and its CIFAR10 PyTorch benchmark
(``benchmarks/image_classification/pytorch/train.py`` in apple/pfl-research):

* data: a ``pfl.data.FederatedDataset(make_dataset_fn, user_sampler)``; ``make_dataset_fn(k)``
  returns client ``k``'s rows (``workloads.client_rows``) as a
  ``pfl.data.pytorch.PyTorchTensorDataset`` of in-memory torch tensors (images NCHW uint8,
  turned into floats per batch in the model's ``loss``); the user sampler is pfl's
  ``minimize_reuse`` over a seeded permutation of the client ids, so a cohort holds distinct
  clients (all 10 in every round for logistic/check/feddro; 50 of 1,000, each client once
  per 20 rounds, for cross_device). pfl's ``Dataset.iter`` slices batches in order and never
  shuffles, so ``make_dataset_fn`` permutes the client's rows (a seeded NumPy generator)
  each time it is sampled, as a shuffling data loader would (not for ``check``);
* model: a ``torch.nn.Module`` with the ``loss`` and ``metrics`` methods pfl asks for, in a
  ``pfl.model.pytorch.PyTorchModel`` with ``local_optimizer_create=torch.optim.SGD`` and a
  central ``torch.optim.SGD(lr=1.0)`` (server step = the averaged model difference: FedAvg);
* algorithm: ``pfl.algorithm.FederatedAveraging`` with ``NNAlgorithmParams`` (cohort size,
  ``central_num_iterations`` = rounds, no validation cohort) and ``NNTrainHyperParams``
  (logistic: ``local_num_steps=5``, batch 32; cross_device: ``local_num_epochs=1``, batch 10
  on 50 images = 5 steps; check: ``local_num_epochs=5``, ``local_batch_size=None`` = the
  whole client data per step), run on a ``pfl.aggregate.SimulatedBackend`` with the
  ``WeightByDatapoints`` postprocessor (FedAvg weighted by examples);
* timing: a ``pfl.callback.base.TrainingProcessCallback`` stamps ``time.perf_counter()`` in
  ``on_train_begin`` and after every central iteration (pfl's own ``StopwatchCallback``
  measures the same laps with ``time.time()``, rounded to 10 ms). ``algorithm.run`` is
  called with ``send_metrics_to_platform=False`` (pfl's generic platform otherwise writes
  every iteration's metrics to stdout).

pfl's ``FederatedNNAlgorithm`` evaluates every client before and after its local training
in central iterations where ``iteration % evaluation_frequency == 0``, which always
includes iteration 0: round 1 of every workload carries that extra evaluation (two forward
passes per client); later rounds do not (``evaluation_frequency`` is set past the last
round).

FedDRO (``--workload=feddro``): a ``FederatedNNAlgorithm`` subclass; see the ``FedDRO``
section. One pfl central iteration per local step (the inner estimate ``y``, ``K`` floats,
is averaged after every step), plus one iteration before round 1 for ``y_bar_0``
(counted in ``setup_seconds``); each client keeps its local model between the steps of a
round in pfl's ``InMemoryUserStateStorage`` (the user-state mechanism pfl's SCAFFOLD uses);
``round_seconds`` are FedDRO rounds (``local_steps`` pfl iterations each).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import sys
import time

START = time.perf_counter()
HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
  sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import pfl  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch_cnn4  # noqa: E402
import workloads  # noqa: E402
from pfl.aggregate.simulate import SimulatedBackend  # noqa: E402
from pfl.aggregate.weighting import WeightByDatapoints, WeightByUser  # noqa: E402
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams  # noqa: E402
from pfl.algorithm.base import FederatedNNAlgorithm  # noqa: E402
from pfl.callback.base import TrainingProcessCallback  # noqa: E402
from pfl.common_types import Population  # noqa: E402
from pfl.context import CentralContext  # noqa: E402
from pfl.data.federated_dataset import FederatedDataset  # noqa: E402
from pfl.data.pytorch import PyTorchTensorDataset  # noqa: E402
from pfl.data.sampling import get_user_sampler  # noqa: E402
from pfl.data.user_state import InMemoryUserStateStorage  # noqa: E402
from pfl.hyperparam import NNTrainHyperParams  # noqa: E402
from pfl.metrics import Metrics, Weighted  # noqa: E402
from pfl.model.pytorch import PyTorchModel  # noqa: E402
from pfl.stats import MappedVectorStatistics  # noqa: E402

SEED = 0


# ---- models: the logistic model and E2's CNN4 (as benchmarks/torch_conv.py's TorchCNN4) ----


class _PflModule(torch.nn.Module):
  """The ``loss`` and ``metrics`` methods ``PyTorchModel`` requires (``model.loss(*batch)``)."""

  def inputs(self, x):
    return x

  def loss(self, x, y):
    return F.cross_entropy(self(self.inputs(x)), y)

  @torch.no_grad()
  def metrics(self, x, y):
    return {
      "loss": Weighted(F.cross_entropy(self(self.inputs(x)), y, reduction="sum").item(), len(y))
    }


class Logistic(_PflModule):
  """``logits = x @ w.T + b``, ``w [10, 784]``, ``b [10]``, both zero."""

  def __init__(self):
    super().__init__()
    self.linear = torch.nn.Linear(workloads.FEATURES, workloads.CLASSES)
    with torch.no_grad():
      self.linear.weight.zero_()
      self.linear.bias.zero_()

  def forward(self, x):
    return self.linear(x)


class TorchCNN4(_PflModule, torch_cnn4.TorchCNN4):
  """E2's CNN4 (``torch_cnn4.TorchCNN4``) with pfl's ``loss`` and ``metrics``."""

  def inputs(self, x):  # uint8 NCHW -> float32 in [0, 1], per batch (workloads.images_as_float)
    return x.to(torch.float32) / 255.0


def make_model(workload: str) -> _PflModule:
  return TorchCNN4() if workload == "cross_device" else Logistic()


# ---- data: a pfl FederatedDataset, client k = rows workloads.client_rows(workload, k) ------


def federated_dataset(workload: str, shuffle: bool) -> FederatedDataset:
  w = workloads.WORKLOADS[workload]
  arrays = workloads.data(workload, SEED)
  x = torch.from_numpy(arrays["x"])
  if workload == "cross_device":
    x = x.permute(0, 3, 1, 2).contiguous()  # NHWC -> NCHW, still uint8
  y = torch.from_numpy(arrays["y"])
  clients = [
    (x[workloads.client_rows(workload, k)], y[workloads.client_rows(workload, k)])
    for k in range(w.num_clients)
  ]
  rng = np.random.default_rng([SEED, 1])

  def make_dataset_fn(k):
    xk, yk = clients[k]
    if shuffle:  # pfl's Dataset.iter never shuffles: permute the rows as a loader would
      order = torch.from_numpy(rng.permutation(len(yk)))
      xk, yk = xk[order], yk[order]
    return PyTorchTensorDataset((xk, yk), user_id=k)

  user_ids = [int(k) for k in np.random.default_rng([SEED, 2]).permutation(w.num_clients)]
  return FederatedDataset(make_dataset_fn, get_user_sampler("minimize_reuse", user_ids))


# ---- timing --------------------------------------------------------------------------------


class RoundClock(TrainingProcessCallback):
  """``perf_counter`` at ``on_train_begin`` and after every central iteration."""

  def __init__(self):
    self.stamps = []

  def on_train_begin(self, *, model):
    self.stamps = [time.perf_counter()]
    return Metrics()

  def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
    self.stamps.append(time.perf_counter())
    return False, Metrics()


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
# In pfl: central iteration 0 gathers g_k(x_0); iteration i >= 1 is local step
# (i - 1) % local_steps of round (i - 1) // local_steps. The server state y_bar lives on the
# algorithm object (as pfl's SCAFFOLD keeps its server control variate), each client's x_k in
# an InMemoryUserStateStorage between steps; the model difference x_k - x_bar is sent and
# averaged at a round's last step only.
# FEDDRO_LINES: the lines from here to "end FedDRO" (code only) are what FedDRO takes.


@dataclasses.dataclass(frozen=True)
class FedDROParams(NNAlgorithmParams):
  """``NNAlgorithmParams`` (``central_num_iterations`` = FedDRO rounds) plus FedDRO's own."""

  num_clients: int
  local_steps: int
  beta: float
  gamma: float


class FedDRO(FederatedNNAlgorithm):
  """Client part ``train_one_user``, server part ``process_aggregated_statistics``; the
  rate and batch size come from ``NNTrainHyperParams`` (``local_learning_rate``,
  ``local_batch_size``)."""

  def __init__(self):
    super().__init__()
    self.storage, self.y_bar = InMemoryUserStateStorage(), None

  def get_next_central_contexts(
    self, model, iteration, algorithm_params, model_train_params, model_eval_params=None
  ):
    p = algorithm_params
    if iteration == 1 + p.central_num_iterations * p.local_steps:
      return None, model, Metrics()
    return (
      (
        CentralContext(
          current_central_iteration=iteration,
          do_evaluation=False,
          cohort_size=p.num_clients,
          population=Population.TRAIN,
          model_train_params=model_train_params.static_clone(),
          model_eval_params=None,
          algorithm_params=p.static_clone(),
          seed=self._get_seed(),
        ),
      ),
      model,
      Metrics(),
    )

  @staticmethod
  def _batch(data, k, iteration, draw, size):
    rows = np.random.default_rng([SEED, k, iteration, draw]).integers(0, len(data), size)
    idx = torch.from_numpy(rows)
    return data.raw_data[0][idx], data.raw_data[1][idx]

  @staticmethod
  def _loss(net, xb, yb):  # g_k(x; batch) is the K-vector K * this e_k
    with torch.no_grad():
      return F.cross_entropy(net(xb), yb)

  def train_one_user(self, initial_model_state, model, user_dataset, central_context):
    p, hp = central_context.algorithm_params, central_context.model_train_params
    i, k, net = central_context.current_central_iteration, user_dataset.user_id, model.pytorch_model
    K, b = p.num_clients, hp.local_batch_size
    y = torch.zeros(K)
    if i == 0:  # y_bar_0: g_k(x_0; one batch)
      y[k] = K * self._loss(net, *self._batch(user_dataset, k, i, 0, b))
      return MappedVectorStatistics({"y": y}), Metrics()
    step = (i - 1) % p.local_steps
    if step > 0:  # continue from this client's own x_k (the model holds x_bar)
      model.set_parameters(self.storage.load_state(k, "x"))
    x_zeta, y_zeta = self._batch(user_dataset, k, i, 1, b)
    x_next, y_next = self._batch(user_dataset, k, i, 2, b)
    g_old = K * self._loss(net, x_next, y_next)
    weight = torch.softmax(self.y_bar / p.gamma, 0)[k]  # grad f(y_bar)_k
    optimizer = model.new_local_optimizer(learning_rate=hp.local_learning_rate)
    optimizer.zero_grad()
    (K * weight * F.cross_entropy(net(x_zeta), y_zeta)).backward()
    optimizer.step()
    y += (1 - p.beta) * self.y_bar
    y[k] += K * self._loss(net, x_next, y_next) - (1 - p.beta) * g_old
    stats = MappedVectorStatistics({"y": y})
    if step < p.local_steps - 1:
      self.storage.save_state(model.get_parameters(), k, "x")
    else:  # last step of the round: send x_k - x_bar
      for name, diff in model.get_model_difference(initial_model_state, clone=True).items():
        stats["model/" + name] = diff
    return stats, Metrics()

  def process_aggregated_statistics(self, central_context, aggregate_metrics, model, statistics):
    statistics.average()  # uniform over the cohort (WeightByUser): mean_k
    self.y_bar = statistics["y"].clone()
    i, steps = (
      central_context.current_central_iteration,
      central_context.algorithm_params.local_steps,
    )
    if i == 0 or (i - 1) % steps < steps - 1:
      return model, Metrics()
    update = MappedVectorStatistics(
      {n[len("model/") :]: v for n, v in statistics.items() if n.startswith("model/")}
    )
    return model.apply_model_update(update)  # x_bar + mean_k (x_k - x_bar)


# end FedDRO


def feddro_lines() -> int:
  """Code lines (no blanks, comments or docstrings) of the FedDRO section above."""
  return workloads.code_lines(os.path.abspath(__file__))


# ---- main ----------------------------------------------------------------------------------


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workload", choices=sorted(workloads.WORKLOADS), required=True)
  parser.add_argument("--rounds", type=int, default=None)
  parser.add_argument(
    "--threads",
    type=int,
    default=os.cpu_count(),
    help="torch.set_num_threads (pfl leaves it to the user)",
  )
  args = parser.parse_args()
  workload, w = args.workload, workloads.WORKLOADS[args.workload]
  rounds = args.rounds or w.rounds
  if rounds < 1:
    raise ValueError(f"--rounds must be >= 1, got {rounds}")
  torch.set_num_threads(args.threads)
  torch.manual_seed(SEED)
  np.random.seed(SEED)  # pfl draws its central and sampling seeds from NumPy's global state

  data = federated_dataset(workload, shuffle=workload in ("logistic", "cross_device"))
  net = make_model(workload)
  model = PyTorchModel(
    model=net,
    local_optimizer_create=torch.optim.SGD,
    central_optimizer=torch.optim.SGD(net.parameters(), lr=1.0),
  )
  clock = RoundClock()
  if workload == "check":
    data_note = (
      "check: whole-data local steps (local_batch_size=None, local_num_epochs=5), "
      "no shuffling, FedAvg weighted by examples (WeightByDatapoints)"
    )
  else:
    data_note = (
      "user sampler: pfl's minimize_reuse over a seeded permutation of the client "
      "ids (distinct clients in a cohort); client rows permuted each time a "
      "client is sampled (pfl's Dataset.iter never shuffles)"
    )
  notes = [
    (
      f"pfl {pfl.__version__} SimulatedBackend (one process, clients trained in "
      f"turn); torch {torch.__version__}, {torch.get_num_threads()} threads"
    ),
    (
      "rounds timed on the server: a TrainingProcessCallback's perf_counter at "
      "on_train_begin and after every central iteration"
    ),
    data_note,
    (
      "round 1 also carries pfl's local evaluation of every client before and after "
      "training at central iteration 0 (FedAvg workloads); torch's lazy import of "
      "torch._dynamo (about 1 s, at the first optimizer) is in setup_seconds, where the "
      "central optimizer is built"
    ),
  ]
  extra = {"notes": notes, "torch_threads": torch.get_num_threads()}
  if workload == "feddro":
    algorithm = FedDRO()
    algorithm_params = FedDROParams(
      central_num_iterations=rounds,
      evaluation_frequency=rounds + 1,
      train_cohort_size=w.num_clients,
      val_cohort_size=None,
      num_clients=w.num_clients,
      local_steps=w.local_steps,
      beta=workloads.FEDDRO_BETA,
      gamma=workloads.FEDDRO_GAMMA,
    )
    postprocessors = [WeightByUser()]
    train_params = NNTrainHyperParams(
      local_learning_rate=w.learning_rate,
      local_num_epochs=None,
      local_batch_size=w.batch_size,
      local_num_steps=w.local_steps,
    )
  else:
    algorithm = FederatedAveraging()
    postprocessors = [WeightByDatapoints()]
    if workload == "check":  # each step on the client's whole data
      steps = {"local_num_epochs": w.local_steps, "local_batch_size": None}
    elif workload == "cross_device":  # one epoch of batch 10 on 50 images: 5 steps
      steps = {"local_num_epochs": 1, "local_batch_size": w.batch_size}
      assert w.per_client // w.batch_size == w.local_steps
    else:
      steps = {
        "local_num_epochs": None,
        "local_batch_size": w.batch_size,
        "local_num_steps": w.local_steps,
      }
    train_params = NNTrainHyperParams(local_learning_rate=w.learning_rate, **steps)
    algorithm_params = NNAlgorithmParams(
      central_num_iterations=rounds,
      evaluation_frequency=rounds + 1,
      train_cohort_size=w.clients_per_round,
      val_cohort_size=None,
    )
  backend = SimulatedBackend(training_data=data, val_data=data, postprocessors=postprocessors)
  algorithm.run(
    algorithm_params=algorithm_params,
    backend=backend,
    model=model,
    model_train_params=train_params,
    callbacks=[clock],
    send_metrics_to_platform=False,
  )

  stamps = clock.stamps
  if workload == "feddro":  # stamps[1] ends the y_bar_0 iteration; then local_steps per round
    first_round_start = stamps[1]
    ends = stamps[1 :: w.local_steps]
    extra["feddro_lines"] = feddro_lines()
    extra["pfl_iterations_per_round"] = w.local_steps
    notes.append(
      "FedDRO: a FederatedNNAlgorithm subclass (get_next_central_contexts, train_one_user, "
      "process_aggregated_statistics) and an NNAlgorithmParams subclass (K, local steps, "
      "beta, gamma); rate and batch from NNTrainHyperParams; one pfl central iteration "
      "per local step (y_bar, K floats, averaged by the server after every step) plus one "
      "before round 1 for "
      "y_bar_0 (in setup_seconds); y_bar kept on the algorithm object (as pfl's SCAFFOLD "
      "keeps its server state) and read by the simulated clients; each client's x_k kept "
      "in an InMemoryUserStateStorage between steps; x_k - x_bar sent and averaged at a "
      f"round's last step; {extra['feddro_lines']} code lines"
    )
  else:
    first_round_start = stamps[0]
    ends = stamps
  round_seconds = [b - a for a, b in itertools.pairwise(ends)]
  if len(round_seconds) != rounds:
    raise RuntimeError(f"timed {len(round_seconds)} rounds, expected {rounds}")
  if workload == "check":
    extra["final_params"] = {
      "w": net.linear.weight.detach().tolist(),
      "b": net.linear.bias.detach().tolist(),
    }
  if workload == "feddro":
    extra["final_y_bar"] = algorithm.y_bar.tolist()
  report = workloads.report(
    "pfl", pfl.__version__, workload, round_seconds, first_round_start - START, **extra
  )
  sys.stdout.flush()
  print(json.dumps(report), flush=True)


if __name__ == "__main__":
  main()
