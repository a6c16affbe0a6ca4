r"""fedco on an accelerator: the peer workloads on a GPU, against a PyTorch per-client loop on it.

    python -m benchmarks.accelerator --out=benchmarks/results/accelerator.json

Run on a machine with a GPU (JAX and PyTorch both built for it); on a CPU-only machine it
runs too (both sides on the CPU) but says so in ``device``. Workloads (``peers/workloads.py``):

* ``cross_device``: 1,000 clients of 50 CIFAR-shaped images, 50 sampled per round, one local
  epoch of batch 10 (5 steps) at learning rate 0.1, FedAvg, E2's CNN4.
  - ``fedco``: ``peers/jax_bench.simulator`` (the peer comparison's fedco side), ``run(state,
    rounds)`` timed as one call after a compiling call, once per ``conv_impl``: ``matmul``,
    the im2col products ``"auto"`` picks on a CPU or GPU (decision 87), and ``xla``,
    ``lax.conv_general_dilated`` (cuDNN on a GPU).
  - ``torch``: what pfl-research and Flower run per client, without their framework: every
    round 50 clients drawn with NumPy, each ``copy.deepcopy(server)``, a fresh
    ``torch.optim.SGD(lr=0.1)``, its 50 images permuted and cut into 5 batches of 10
    (``zero_grad``, ``cross_entropy``, ``backward``, ``step``), then the server loads the
    mean of the clients' ``state_dict``s. The images live on the device as uint8 and are
    scaled per batch, as fedco's loss does. Timed after one warm-up round,
    ``torch.cuda.synchronize()`` before each clock read. A framework adds its own costs on
    top of this loop, so it is a lower bound of their time per round.
* ``cross_device_resnet20``: the same clients and rounds with E5's ``ResNet20`` (GroupNorm,
  width 16, 272,474 parameters): fedco only, once per ``conv_impl``, to see whether the
  convolution implementation that wins on CNN4 also wins on a deeper, wider network.
* ``cross_device_precision`` (issue 49): the cross-device CNN4 round with its local steps
  in float32 and in bfloat16 (:func:`fedco.problems.mixed_precision`; parameters, uploads
  and averaging stay float32), ``conv_impl="auto"``: seconds per round (alternating), the
  ratio, and XLA's cost analysis of each compiled round (bytes accessed, flops). On a CPU:
  ``--workloads=cross_device_precision``.
* ``logistic``: 10 clients of 500 examples, every client, 5 steps of batch 32, 784 -> 10:
  fedco's rounds per second (the peer table's first row).
* ``shakespeare`` and ``shakespeare_steps`` (issue 45; FedJAX's comparison on the CPU is
  ``peers/run.py``): TFF's Shakespeare (``../shared/data/shakespeare_tff``), McMahan et al.'s
  character LSTM, FedAvg, 10 clients a round, batch 4, one local epoch (each client
  ``ceil(n_k / 4)`` steps, 1 to 251) or 10 steps: fedco only (``peers/fedco_shakespeare``),
  once per ``client_chunk`` (``--shakespeare_chunks``: 1, 10 and 0 = ``None``, every client
  vmapped over the largest client's steps), each compiled ahead of time and then timed,
  alternating. ``--shakespeare_clients=20`` keeps only the first 20 roles (a check on a CPU
  in a minute or two).

The JSON holds each side's seconds per round (median of ``--repeats`` timed calls, alternating
sides), client updates per second and the ratios fedco / torch.
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import sys
import time

from absl import app, flags

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers"))

import jax  # noqa: E402
import numpy as np  # noqa: E402

import fedco  # noqa: E402
from benchmarks import _common as C  # noqa: E402
from benchmarks.peers import fedco_shakespeare, jax_bench, workloads  # noqa: E402

flags.DEFINE_string("out", None, "Where to write the JSON.", required=True)
flags.DEFINE_integer("rounds", 20, "Rounds per timed call (cross_device).")
flags.DEFINE_integer("resnet_rounds", 5, "Rounds per timed call (cross_device_resnet20).")
flags.DEFINE_integer("repeats", 3, "Timed calls per side, alternating.")
flags.DEFINE_list(
  "workloads",
  ["cross_device", "cross_device_resnet20", "logistic", "shakespeare", "shakespeare_steps"],
  "Which workloads to run.",
)
flags.DEFINE_integer("shakespeare_rounds", 5, "Rounds per timed call (Shakespeare).")
flags.DEFINE_list("shakespeare_chunks", ["1", "10", "0"], "client_chunk values (0: None).")
flags.DEFINE_integer(
  "shakespeare_clients", None, "Keep only the first this many roles (None: all 715)."
)
FLAGS = flags.FLAGS


def device_info():
  """The machine (``benchmarks._common.machine_info``), its accelerator and PyTorch's."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    torch = None
  info = {**C.machine_info(torch), "fedco": fedco.__version__}
  info["device"] = jax.devices()[0].device_kind
  if torch is not None:
    info["torch_device"] = (
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu (no CUDA)"
    )
  return info


class FedcoSide:
  """One ``fedco.Simulator`` of ``workload``; :meth:`time` runs ``rounds`` rounds as one call."""

  def __init__(self, workload, rounds, conv_impl="auto", network="cnn4", compute_dtype="float32"):
    self.sim, params = jax_bench.simulator(workload, conv_impl, network, compute_dtype)
    self.state, self.rounds = self.sim.init(params, 0), rounds
    start = time.perf_counter()
    jax.block_until_ready(self.sim.run(self.state, rounds)[0])
    self.compile_seconds = time.perf_counter() - start

  def time(self) -> float:
    start = time.perf_counter()
    jax.block_until_ready(self.sim.run(self.state, self.rounds)[0])
    return (time.perf_counter() - start) / self.rounds

  def cost(self):
    """XLA's cost analysis of the compiled program of ``rounds`` rounds, per round: bytes
    accessed and flops (the memory floor's yardstick)."""
    args = (self.state, self.sim.data, self.sim.metrics_data, np.int32(-1))
    compiled = self.sim._run.lower(*args, rounds=self.rounds).compile()  # pylint: disable=protected-access
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
    return {
      key: float(analysis[name]) / self.rounds
      for key, name in (("bytes_accessed", "bytes accessed"), ("flops", "flops"))
      if name in analysis
    }


class ShakespeareSide:
  """fedco on a Shakespeare workload with one ``client_chunk``, compiled ahead of time."""

  def __init__(self, workload, rounds, client_chunk, max_clients=None):
    self.sim, params, _ = fedco_shakespeare.simulator(
      workload, client_chunk, max_clients=max_clients
    )
    self.state, self.rounds = self.sim.init(params, 0), rounds
    self.args = (self.state, self.sim.data, self.sim.metrics_data, np.int32(-1))
    start = time.perf_counter()
    self.compiled = self.sim._run.lower(*self.args, rounds=rounds).compile()  # pylint: disable=protected-access
    self.compile_seconds = time.perf_counter() - start
    self.steps = None

  def time(self) -> float:
    start = time.perf_counter()
    final, metrics = self.compiled(*self.args)
    jax.block_until_ready(final)
    seconds = (time.perf_counter() - start) / self.rounds
    if "local_steps" in metrics:
      self.steps = int(np.sum(metrics["local_steps"]))
    else:
      self.steps = self.rounds * self.sim.clients_per_round * self.sim.plan.local_steps
    return seconds


def shakespeare(workload):
  """fedco's seconds per round on a Shakespeare workload, per ``client_chunk``."""
  chunks = [int(c) for c in FLAGS.shakespeare_chunks]  # 0: every client to the cap, masked
  sides = {
    f"fedco_chunk{c or 'None'}": ShakespeareSide(
      workload, FLAGS.shakespeare_rounds, c or None, FLAGS.shakespeare_clients
    )
    for c in chunks
  }
  median, every = timed(sides, FLAGS.repeats)
  return {
    "seconds_per_round": median,
    "all_seconds_per_round": every,
    "rounds_per_second": {k: 1.0 / s for k, s in median.items()},
    "local_steps_per_second": {
      k: sides[k].steps / (s * FLAGS.shakespeare_rounds) for k, s in median.items()
    },
    "compile_seconds": {k: side.compile_seconds for k, side in sides.items()},
    "rounds": FLAGS.shakespeare_rounds,
    "clients": FLAGS.shakespeare_clients or workloads.WORKLOADS[workload].num_clients,
  }


class TorchSide:
  """The cross-device workload as a PyTorch per-client loop on the GPU (or the CPU)."""

  def __init__(self, rounds):
    import torch  # pylint: disable=g-import-not-at-top

    from benchmarks.peers.torch_cnn4 import TorchCNN4  # pylint: disable=g-import-not-at-top

    self.torch, self.rounds = torch, rounds
    self.dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    self.w = workloads.WORKLOADS["cross_device"]
    arrays = workloads.data("cross_device")
    self.x = torch.from_numpy(np.ascontiguousarray(arrays["x"].transpose(0, 3, 1, 2))).to(self.dev)
    self.y = torch.from_numpy(arrays["y"]).to(self.dev)
    torch.manual_seed(0)
    self.server = TorchCNN4().to(self.dev)
    self.rng = np.random.default_rng(0)
    self.round()  # warm-up: cuDNN's algorithm choice, allocator

  def round(self):
    torch, w = self.torch, self.w
    states = []
    for c in self.rng.choice(w.num_clients, w.clients_per_round, replace=False):
      model = copy.deepcopy(self.server)
      opt = torch.optim.SGD(model.parameters(), lr=w.learning_rate)
      rows = torch.from_numpy(c * w.per_client + self.rng.permutation(w.per_client)).to(self.dev)
      for batch in rows.split(w.batch_size):
        opt.zero_grad()
        x = self.x[batch].float() / 255.0
        torch.nn.functional.cross_entropy(model(x), self.y[batch]).backward()
        opt.step()
      states.append(model.state_dict())
    with torch.no_grad():
      self.server.load_state_dict(
        {k: torch.stack([s[k] for s in states]).mean(0) for k in states[0]}
      )

  def _sync(self):
    if self.dev.type == "cuda":
      self.torch.cuda.synchronize()

  def time(self) -> float:
    self._sync()
    start = time.perf_counter()
    for _ in range(self.rounds):
      self.round()
    self._sync()
    return (time.perf_counter() - start) / self.rounds


def timed(sides, repeats):
  """Median seconds per round of each side, the sides' calls alternating."""
  seconds = {name: [] for name in sides}
  for _ in range(repeats):
    for name, side in sides.items():
      seconds[name].append(side.time())
  return {name: statistics.median(s) for name, s in seconds.items()}, seconds


def main(argv):
  del argv
  out = {"device": device_info(), "rounds": FLAGS.rounds, "repeats": FLAGS.repeats}
  known = (
    "cross_device",
    "cross_device_resnet20",
    "cross_device_precision",
    "logistic",
    "shakespeare",
    "shakespeare_steps",
  )
  unknown = [w for w in FLAGS.workloads if w not in known]
  if unknown:
    raise app.UsageError(f"--workloads: unknown {unknown}; allowed: {', '.join(known)}")
  for workload in ("shakespeare", "shakespeare_steps"):
    if workload in FLAGS.workloads:
      out[workload] = shakespeare(workload)
      print(workload, json.dumps(out[workload]), flush=True)
  if "cross_device" in FLAGS.workloads:
    cross_device(out)
  if "cross_device_resnet20" in FLAGS.workloads:
    resnet20(out)
  if "cross_device_precision" in FLAGS.workloads:
    precision(out)
  if "logistic" in FLAGS.workloads:
    logistic = FedcoSide("logistic", workloads.WORKLOADS["logistic"].rounds)
    median, _ = timed({"fedco": logistic}, FLAGS.repeats)
    out["logistic"] = {"rounds_per_second": 1.0 / median["fedco"]}
  with open(FLAGS.out, "w") as f:
    json.dump(out, f, indent=2)
  print(json.dumps(out, indent=2))


def cross_device(out):
  w = workloads.WORKLOADS["cross_device"]
  sides = {
    f"fedco_{impl}": FedcoSide("cross_device", FLAGS.rounds, impl) for impl in ("matmul", "xla")
  }
  compile_seconds = {name: side.compile_seconds for name, side in sides.items()}
  try:
    sides["torch"] = TorchSide(FLAGS.rounds)
  except ImportError as err:
    out["torch_missing"] = str(err)
  median, every = timed(sides, FLAGS.repeats)
  out["cross_device"] = {
    "seconds_per_round": median,
    "all_seconds_per_round": every,
    "client_updates_per_second": {k: w.clients_per_round / s for k, s in median.items()},
    "compile_and_first_call_seconds": compile_seconds,
  }
  if "torch" in median:
    out["cross_device"]["speedup_over_torch"] = {
      k: median["torch"] / s for k, s in median.items() if k != "torch"
    }


def precision(out):
  """The cross-device CNN4 round in float32 and bfloat16: time, ratio and XLA's costs."""
  sides = {
    dtype: FedcoSide("cross_device", FLAGS.rounds, compute_dtype=dtype)
    for dtype in ("float32", "bfloat16")
  }
  median, every = timed(sides, FLAGS.repeats)
  out["cross_device_precision"] = {
    "seconds_per_round": median,
    "all_seconds_per_round": every,
    "bfloat16_over_float32_time": median["bfloat16"] / median["float32"],
    "cost_per_round": {dtype: side.cost() for dtype, side in sides.items()},
    "compile_and_first_call_seconds": {k: side.compile_seconds for k, side in sides.items()},
  }
  costs = out["cross_device_precision"]["cost_per_round"]
  if all("bytes_accessed" in c for c in costs.values()):
    out["cross_device_precision"]["bfloat16_over_float32_bytes"] = (
      costs["bfloat16"]["bytes_accessed"] / costs["float32"]["bytes_accessed"]
    )
  print("cross_device_precision", json.dumps(out["cross_device_precision"]), flush=True)


def resnet20(out):
  w = workloads.WORKLOADS["cross_device"]
  resnet = {
    f"fedco_{impl}": FedcoSide("cross_device", FLAGS.resnet_rounds, impl, "resnet20")
    for impl in ("matmul", "xla")
  }
  median, _ = timed(resnet, FLAGS.repeats)
  out["cross_device_resnet20"] = {
    "seconds_per_round": median,
    "client_updates_per_second": {k: w.clients_per_round / s for k, s in median.items()},
    "compile_and_first_call_seconds": {k: side.compile_seconds for k, side in resnet.items()},
  }


if __name__ == "__main__":
  app.run(main)
