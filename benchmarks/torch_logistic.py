r"""Rounds per second on the E1 logistic workload: fedco, a PyTorch per-client loop, and one
centralized jitted step.

Workload: 10 clients (all in every round), ``tau = 5`` local steps per round, batch 32 per
client per step, multinomial logistic regression 784 -> 10 (``w [10, 784]``, output-major as
``nn.Linear`` stores it; ``b [10]``), synthetic MNIST-shaped data (features uniform in [0, 1],
random labels, 600 per client; nothing is downloaded). Algorithms (hyperparameters in
``benchmarks/_common.py``):

* ``fedavg``: FedAvg on the cross-entropy (lr 0.05);
* ``comfedl``: ComFedL on client-level KL-DRO, exp form, ``gamma = 0.2`` (lr 5e-9: the step
  is about ``5e5 grad l``, a larger rate reaches NaN within a round);
* ``local_scgdm``: Local-SCGDM on the same problem (``eta = 1``, ``beta = 5e-9``,
  ``alpha = 0.8``, ``gamma = 0.7``; ``u`` and ``m`` averaged with the model every round);
* ``feddro``: FedDRO on sample-level KL-DRO ``log mean exp(l / 1)`` as a global-inner
  problem (lr 0.01, ``beta = 0.5``; ``y_bar`` averaged after every step).

Three implementations (four timed sides with ``torch_1t``), timed in one process with their
repeats alternating (medians reported):

1. ``fedco``: ``fedco.Simulator(..., batch_size=32, evaluate=False)``; each repeat is one
   ``run(state, --rounds)`` call (one jitted ``lax.scan``).
2. ``torch``: a PyTorch loop written the way the papers' code is. One ``nn.Module`` copy per
   client with its own ``torch.optim.SGD``; every round each client loads the server
   weights; for every step a host batch is drawn with NumPy indices and wrapped with
   ``torch.from_numpy`` (a cheap stand-in for a ``DataLoader``; the JSON records what a real
   ``DataLoader`` costs per batch); the trackers (``u``, ``m``, ``y_bar``) are tensors;
   rounds, clients and steps are Python loops (FedDRO: steps outside, clients inside, since
   ``y_bar`` is averaged every step). The compositional steps use
   ``torch.autograd.grad(g_value, params, grad_outputs=v)`` with ``v = grad f(y)``, which is
   fedco's ``J_g^T grad f(y)``. The server averages the client models (and Local-SCGDM's
   ``u``, ``m``) after each round.
3. ``central``: the same per-step arithmetic on ONE model with the pooled batch ``K * b =
   320``, as one jitted ``lax.scan`` of ``tau`` steps per round-equivalent (``K tau b``
   examples). For FedAvg this is plain minibatch SGD; for the others it is the algorithm's
   own ``update`` (``fedco.oracle_args`` on the pooled batch), i.e. the algorithm run with
   one client. Batches are drawn on device (``randint`` + gather), as fedco does.

Ratios reported: ``fedco rounds/s / torch rounds/s`` (target >= 30) and ``fedco seconds per
round / central seconds per round-equivalent`` (target <= 1.5).

Torch threads: the ``torch`` side uses ``torch.set_num_threads(os.cpu_count())`` (2 here;
also torch's default). A second side, ``torch_1t``, runs the same loop with one thread:
on a shared 2-core machine the two OpenMP threads oversubscribe the cores whenever other
jobs run, and the loop became 7x to 65x slower than with one thread in this session's loaded
runs, so the 30x target is judged against the faster torch side.

Correctness: before timing, each algorithm runs ONE round on both fedco and torch from the
same parameters on identical batches (each client holds 32 examples and both sides use a
client's whole data as every batch: fedco's ``batch_size=None``), and the JSON records the
largest absolute difference of the server parameters, of the parameter update, and of the
trackers.

Run::

    python -m benchmarks.torch_logistic --out=benchmarks/results/torch_logistic.json
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict

import jax
import numpy as np
import torch
import torch.nn.functional as F
from absl import app, flags

import fedco
from benchmarks import _common as C

FLAGS = flags.FLAGS
C.define_timing_flags("torch_logistic", rounds=50, torch_rounds=2, repeats=5)
flags.DEFINE_list(
  "algorithms", list(C.ALGORITHM_NAMES), "Comma list from fedavg, comfedl, local_scgdm, feddro."
)
flags.DEFINE_integer("clients", 10, "Clients (all participate every round).")
flags.DEFINE_integer("local_steps", 5, "Local steps per round (tau).")
flags.DEFINE_integer("batch_size", 32, "Examples per client per step (b).")
flags.DEFINE_integer("examples_per_client", 600, "Synthetic examples per client.")
flags.DEFINE_integer(
  "check_examples",
  32,
  "Examples per client in the one-round correctness check (whole-data batches on both sides).",
)
flags.DEFINE_integer("seed", 0, "Seed for data, parameters and batches.")
flags.DEFINE_integer(
  "in_dim",
  784,
  "Input features (784 is the workload; a small value such as 32 shows the "
  "dispatch-bound regime, where per-step overhead dominates).",
)

TARGET_VS_TORCH = 30.0
TARGET_VS_CENTRAL = 1.5
COMPILES = C.CompileCounter()


# ---- (1) fedco ----------------------------------------------------------------------------

# ---- (2) the PyTorch per-client loop --------------------------------------------------------


class TorchLogistic(torch.nn.Module):
  """``logits = F.linear(x, w, b) = x w^T + b``: ``nn.Linear``'s layout (``w [10, in]``),
  which is also the benchmark's fedco layout."""

  def __init__(self, params):
    super().__init__()
    self.w = torch.nn.Parameter(torch.tensor(np.asarray(params["w"])))
    self.b = torch.nn.Parameter(torch.tensor(np.asarray(params["b"])))

  def forward(self, x):
    return F.linear(x, self.w, self.b)


class HostLoader:
  """Per-step host batches: NumPy indices drawn with replacement, then ``torch.from_numpy``
  (what a ``DataLoader`` with a replacement sampler yields, minus its per-item collation)."""

  def __init__(self, host_examples, rows, batch_size, seed):
    self.x = host_examples["x"]
    self.y = host_examples["y"].astype(np.int64)  # torch's cross_entropy wants int64 labels
    self.rows, self.batch_size = rows, batch_size
    self.rng = np.random.default_rng(seed)

  def draw(self, client):
    rows = self.rows[client]
    idx = rows[self.rng.integers(0, rows.size, self.batch_size)]
    return torch.from_numpy(self.x[idx]), torch.from_numpy(self.y[idx])


class WholeDataLoader(HostLoader):
  """Every batch is the client's whole data (fedco's ``batch_size=None``): the check."""

  def draw(self, client):
    idx = self.rows[client]
    return torch.from_numpy(self.x[idx]), torch.from_numpy(self.y[idx])


class TorchFederated:
  """One algorithm's federated loop in PyTorch, written per client as papers' code is."""

  def __init__(self, name, params, loader, num_clients, local_steps):
    self.name, self.loader = name, loader
    self.k, self.tau = num_clients, local_steps
    self.h = C.HYPER[name]
    lr = (
      self.h["beta"] * self.h["learning_rate"] if name == "local_scgdm" else self.h["learning_rate"]
    )
    self.server = TorchLogistic(params)
    self.models = [TorchLogistic(params) for _ in range(num_clients)]
    self.opts = [torch.optim.SGD(m.parameters(), lr=lr) for m in self.models]
    self.rounds_done = 0
    if name in ("comfedl", "local_scgdm", "feddro"):
      # init sync: y_bar_0 = mean over clients of one mini-batch g_k(x_0)
      with torch.no_grad():
        y0 = torch.stack(
          [self.inner(self.server, *loader.draw(c)) for c in range(num_clients)]
        ).mean(0)
      if name == "feddro":
        self.y_bar = y0
      if name == "local_scgdm":
        self.count = 0
        self.u = [y0.clone() for _ in range(num_clients)]
        self.m = [
          [torch.zeros_like(p) for p in self.server.parameters()] for _ in range(num_clients)
        ]

  # the problem
  def inner(self, model, x, y):
    if self.name == "feddro":  # g(x; B) = mean_i exp(l_i / lam)
      return torch.exp(F.cross_entropy(model(x), y, reduction="none") / self.h["lam"]).mean()
    return F.cross_entropy(model(x), y)  # g_k(x; B) = client mean loss

  def outer(self, y):
    if self.name == "feddro":
      return self.h["lam"] * torch.log(y)
    return torch.exp(y / self.h["gamma"])

  def outer_grad(self, y):
    leaf = y.detach().clone().requires_grad_(True)
    return torch.autograd.grad(self.outer(leaf), leaf)[0]

  def compositional_grad(self, model, x, y, tracked=None):
    """``(g(x; B), J_g^T grad f(y))`` with ``y`` the tracked value (default: the sample)."""
    params = list(model.parameters())
    g = self.inner(model, x, y)
    v = self.outer_grad(g if tracked is None else tracked)
    return g.detach(), torch.autograd.grad(g, params, grad_outputs=v)

  # one round
  def _load_server(self):
    with torch.no_grad():
      for model in self.models:
        for p, s in zip(model.parameters(), self.server.parameters()):
          p.copy_(s)

  def _average_models(self):
    with torch.no_grad():
      for i, s in enumerate(self.server.parameters()):
        s.copy_(torch.stack([list(m.parameters())[i] for m in self.models]).mean(0))

  def round(self):
    self._load_server()
    getattr(self, "_round_" + self.name)()
    self._average_models()
    self.rounds_done += 1

  def _round_fedavg(self):
    for c in range(self.k):
      model, opt = self.models[c], self.opts[c]
      for _ in range(self.tau):
        x, y = self.loader.draw(c)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

  def _round_comfedl(self):
    for c in range(self.k):
      model, opt = self.models[c], self.opts[c]
      for _ in range(self.tau):
        x, y = self.loader.draw(c)
        _, z = self.compositional_grad(model, x, y)  # fresh y = g_k(x; B)
        for p, zi in zip(model.parameters(), z):
          p.grad = zi
        opt.step()

  def _round_local_scgdm(self):
    g_rate = self.h["gamma_tracker"] * self.h["learning_rate"]
    a_rate = self.h["alpha"] * self.h["learning_rate"]
    count0 = self.count
    for c in range(self.k):
      model, opt = self.models[c], self.opts[c]
      for t in range(self.tau):
        first = count0 + t == 0
        x, y = self.loader.draw(c)
        params = list(model.parameters())
        g = self.inner(model, x, y)
        sample = g.detach()
        self.u[c] = sample if first else (1 - g_rate) * self.u[c] + g_rate * sample
        z = torch.autograd.grad(g, params, grad_outputs=self.outer_grad(self.u[c]))
        self.m[c] = (
          list(z) if first else [(1 - a_rate) * mi + a_rate * zi for mi, zi in zip(self.m[c], z)]
        )
        for p, mi in zip(params, self.m[c]):
          p.grad = mi
        opt.step()  # x = x - beta eta m
    self.count = count0 + self.tau
    with torch.no_grad():  # u and m are averaged with the model every round
      u = torch.stack(self.u).mean(0)
      m = [torch.stack([mc[i] for mc in self.m]).mean(0) for i in range(len(self.m[0]))]
    self.u = [u.clone() for _ in range(self.k)]
    self.m = [[mi.clone() for mi in m] for _ in range(self.k)]

  def _round_feddro(self):
    beta = self.h["beta"]
    for _ in range(self.tau):  # y_bar is averaged after every step: steps outside
      ys = []
      for c in range(self.k):
        model, opt = self.models[c], self.opts[c]
        x, y = self.loader.draw(c)  # zeta
        x2, y2 = self.loader.draw(c)  # zeta'
        _, z = self.compositional_grad(model, x, y, tracked=self.y_bar)
        with torch.no_grad():
          g_old = self.inner(model, x2, y2)
        for p, zi in zip(model.parameters(), z):
          p.grad = zi
        opt.step()
        with torch.no_grad():
          g_new = self.inner(model, x2, y2)
        ys.append((1 - beta) * (self.y_bar - g_old) + g_new)  # hybrid (STORM) tracker
      self.y_bar = torch.stack(ys).mean(0)

  def params(self):
    return {"w": self.server.w.detach().numpy().copy(), "b": self.server.b.detach().numpy().copy()}


class TorchSide:
  """Times ``rounds`` rounds of a :class:`TorchFederated` with ``threads`` intra-op threads
  (set before every repeat: the setting is process-wide and the sides alternate)."""

  def __init__(self, fed: TorchFederated, rounds: int, threads: int):
    self.fed, self.rounds, self.threads = fed, rounds, threads

  def run(self):
    torch.set_num_threads(self.threads)
    for _ in range(self.rounds):
      self.fed.round()


# ---- (3) one centralized jitted step ---------------------------------------------------------

CentralSide = C.CentralSide


# ---- correctness: one round on identical batches --------------------------------------------


def check_one_round(
  name, params, *, clients, per_client, local_steps, seed, in_dim=784
) -> Dict[str, Any]:
  """fedco (``batch_size=None``) against the torch loop (whole-data batches): one round."""
  problem, algorithm = C.make_problem_and_algorithm(name, local_steps)
  host, rows = C.make_data(clients, per_client, seed + 7, in_dim)
  data = fedco.FederatedData.from_index_lists(host, rows)
  sim = fedco.Simulator(problem, algorithm, data, batch_size=None, evaluate=False)
  state, _ = sim.run(sim.init(params, seed), 1)
  fed_params = jax.device_get(state.server["params"])
  tfed = TorchFederated(name, params, WholeDataLoader(host, rows, None, seed), clients, local_steps)
  tfed.round()
  t_params = tfed.params()
  p0 = jax.device_get(params)
  delta_f = jax.tree.map(lambda a, b: np.asarray(a, np.float64) - b, fed_params, p0)
  delta_t = jax.tree.map(lambda a, b: np.asarray(a, np.float64) - b, t_params, p0)
  out = {
    "examples_per_client": per_client,
    "rounds": 1,
    "max_abs_diff_params": C.max_abs_diff(fed_params, t_params),
    "max_abs_params": C.max_abs(fed_params),
    "max_abs_diff_update": C.max_abs_diff(delta_f, delta_t),
    "max_abs_update": C.max_abs(delta_f),
  }
  out["relative_diff_update"] = out["max_abs_diff_update"] / max(out["max_abs_update"], 1e-30)
  if name == "feddro":
    out["max_abs_diff_tracker_y_bar"] = C.max_abs_diff(state.shared["y"], tfed.y_bar.numpy())
    out["tracker_y_bar"] = float(state.shared["y"])
  if name == "local_scgdm":
    out["max_abs_diff_tracker_u"] = C.max_abs_diff(state.server["u"], tfed.u[0].numpy())
    m_t = {"w": tfed.m[0][0].numpy(), "b": tfed.m[0][1].numpy()}
    out["max_abs_diff_tracker_m"] = C.max_abs_diff(state.server["m"], m_t)
    out["max_abs_tracker_m"] = C.max_abs(state.server["m"])
    out["relative_diff_tracker_m"] = out["max_abs_diff_tracker_m"] / out["max_abs_tracker_m"]
  return out


# ---- what a real DataLoader costs per batch -----------------------------------------------


def dataloader_cost(host, rows, batch_size, seed, batches=300) -> Dict[str, float]:
  """Microseconds per batch: the loop's NumPy draw vs ``torch.utils.data.DataLoader``."""
  loader = HostLoader(host, rows, batch_size, seed)
  t0 = time.perf_counter()
  for _ in range(batches):
    loader.draw(0)
  numpy_us = 1e6 * (time.perf_counter() - t0) / batches
  idx = rows[0]
  ds = torch.utils.data.TensorDataset(
    torch.from_numpy(host["x"][idx]), torch.from_numpy(host["y"][idx].astype(np.int64))
  )
  sampler = torch.utils.data.RandomSampler(ds, replacement=True, num_samples=batch_size * batches)
  dl = torch.utils.data.DataLoader(ds, batch_size=batch_size, sampler=sampler)
  t0 = time.perf_counter()
  for _ in dl:
    pass
  dl_us = 1e6 * (time.perf_counter() - t0) / batches
  return {"numpy_index_draw_us": numpy_us, "torch_dataloader_us": dl_us}


# ---- main -------------------------------------------------------------------------------------


def markdown_tables(results, checks) -> str:
  lines = [
    "| algorithm | fedco rounds/s | torch rounds/s (2 thr / 1 thr) | central round-eq/s "
    f"| fedco / faster torch | >= {TARGET_VS_TORCH:g}x | fedco time / central time "
    f"| <= {TARGET_VS_CENTRAL:g}x |",
    "|---|---:|---:|---:|---:|:---:|---:|:---:|",
  ]
  for name, r in results.items():
    t1 = f"{r['torch_1t']['rounds_per_s']:.2f}" if "torch_1t" in r else "-"
    lines.append(
      f"| {name} | {r['fedco']['rounds_per_s']:.1f} | {r['torch']['rounds_per_s']:.2f} / {t1} "
      f"| {r['central']['rounds_per_s']:.1f} | {r['fedco_over_torch_best']:.1f}x "
      f"| {'yes' if r['meets_torch_target'] else 'no'} | {r['fedco_time_over_central']:.2f}x "
      f"| {'yes' if r['meets_central_target'] else 'no'} |"
    )
  lines += [
    "",
    "| algorithm | max abs diff params | max abs update | rel. diff of update | tracker diff |",
    "|---|---:|---:|---:|---:|",
  ]
  for name, c in checks.items():
    if "max_abs_diff_tracker_y_bar" in c:
      tracker = f"y_bar {c['max_abs_diff_tracker_y_bar']:.1e} (of {c['tracker_y_bar']:.3g})"
    elif "max_abs_diff_tracker_m" in c:
      tracker = (
        f"u {c['max_abs_diff_tracker_u']:.1e}; m {c['max_abs_diff_tracker_m']:.1e} "
        f"(rel. {c['relative_diff_tracker_m']:.1e})"
      )
    else:
      tracker = "-"
    lines.append(
      f"| {name} | {c['max_abs_diff_params']:.2e} | {c['max_abs_update']:.2e} "
      f"| {c['relative_diff_update']:.2e} | {tracker} |"
    )
  return "\n".join(lines)


def main(argv):
  del argv
  for name in FLAGS.algorithms:
    if name not in C.ALGORITHM_NAMES:
      raise app.UsageError(f"unknown algorithm {name!r}; choose from {C.ALGORITHM_NAMES}")
  for flag in (
    "rounds",
    "torch_rounds",
    "repeats",
    "clients",
    "local_steps",
    "batch_size",
    "examples_per_client",
    "check_examples",
  ):
    if getattr(FLAGS, flag) < 1:
      raise app.UsageError(f"--{flag} must be >= 1, got {getattr(FLAGS, flag)}")
  torch.set_num_threads(os.cpu_count())
  torch.manual_seed(FLAGS.seed)
  machine = C.machine_info(torch)
  print(
    f"machine: {machine['platform']} | {machine['cpu_model']} x{machine['cpu_count']} | "
    f"jax {machine['jax']} torch {machine['torch']} ({machine['torch_num_threads']} "
    f"threads) | load {machine['load_average_start']}",
    flush=True,
  )
  k, tau, b = FLAGS.clients, FLAGS.local_steps, FLAGS.batch_size
  host, rows = C.make_data(k, FLAGS.examples_per_client, FLAGS.seed, FLAGS.in_dim)
  params = C.init_params(FLAGS.seed, FLAGS.in_dim)

  checks = {}
  for name in FLAGS.algorithms:
    checks[name] = check_one_round(
      name,
      params,
      clients=k,
      per_client=FLAGS.check_examples,
      local_steps=tau,
      seed=FLAGS.seed,
      in_dim=FLAGS.in_dim,
    )
    print(
      f"check {name}: max |params diff| {checks[name]['max_abs_diff_params']:.2e}, "
      f"relative update diff {checks[name]['relative_diff_update']:.2e}",
      flush=True,
    )

  results = {}
  for name in FLAGS.algorithms:
    problem, algorithm = C.make_problem_and_algorithm(name, tau)
    fed = C.FedcoSide(
      problem, algorithm, host, rows, params, batch_size=b, rounds=FLAGS.rounds, seed=FLAGS.seed
    )
    tfed = TorchFederated(name, params, HostLoader(host, rows, b, FLAGS.seed + 1), k, tau)
    torch_sides = {"torch": (tfed, TorchSide(tfed, FLAGS.torch_rounds, os.cpu_count()))}
    if FLAGS.torch_one_thread:
      tfed1 = TorchFederated(name, params, HostLoader(host, rows, b, FLAGS.seed + 1), k, tau)
      torch_sides["torch_1t"] = (tfed1, TorchSide(tfed1, FLAGS.torch_rounds, 1))
    central = CentralSide(
      name,
      problem,
      algorithm,
      host,
      params,
      batch=k * b,
      local_steps=tau,
      rounds=FLAGS.rounds,
      seed=FLAGS.seed,
    )
    load_before = C.load_average()
    runs = {
      "fedco": fed.run,
      **{label: side.run for label, (_, side) in torch_sides.items()},
      "central": central.run,
    }
    timed = C.alternate(runs, FLAGS.repeats, COMPILES)
    torch.set_num_threads(os.cpu_count())
    sides = {
      "fedco": (FLAGS.rounds, fed.params()),
      **{label: (FLAGS.torch_rounds, tf.params()) for label, (tf, _) in torch_sides.items()},
      "central": (FLAGS.rounds, central.params()),
    }
    rec = {"problem": problem.name, "algorithm": algorithm.name, "load_average": load_before}
    C.record_sides(
      rec, timed, sides, torch_sides, "final_mean_loss", lambda p: C.mean_loss(p, host)
    )
    rec["fedco"]["rounds_run"] = int(fed.state.round)
    rec["meets_torch_target"] = rec["fedco_over_torch_best"] >= TARGET_VS_TORCH
    rec["meets_central_target"] = rec["fedco_time_over_central"] <= TARGET_VS_CENTRAL
    results[name] = rec
    print(
      f"{name}: fedco {rec['fedco']['rounds_per_s']:.1f} r/s, torch "
      + ", ".join(f"{label} {rec[label]['rounds_per_s']:.2f}" for label in torch_sides)
      + f" r/s, central {rec['central']['rounds_per_s']:.1f}"
      f" r/s | fedco/best torch {rec['fedco_over_torch_best']:.1f}x, fedco/central time "
      f"{rec['fedco_time_over_central']:.2f}x",
      flush=True,
    )

  out = {
    "benchmark": "torch_logistic",
    "timestamp": C.timestamp(),
    "config": {
      "clients": k,
      "clients_per_round": k,
      "local_steps": tau,
      "batch_size": b,
      "central_batch_size": k * b,
      "examples_per_client": FLAGS.examples_per_client,
      "model": {"w": [C.NUM_CLASSES, FLAGS.in_dim], "b": [C.NUM_CLASSES]},
      "hyperparameters": {n: C.HYPER[n] for n in FLAGS.algorithms},
      "fedco_rounds_per_repeat": FLAGS.rounds,
      "central_rounds_per_repeat": FLAGS.rounds,
      "torch_rounds_per_repeat": FLAGS.torch_rounds,
      "repeats": FLAGS.repeats,
      "statistic": "median over repeats; fedco, torch and central repeats alternate",
      "evaluate": False,
      "seed": FLAGS.seed,
      "torch_threads": {
        "torch": "torch.set_num_threads(os.cpu_count())",
        "torch_1t": "torch.set_num_threads(1)" if FLAGS.torch_one_thread else None,
      },
      "targets": {
        "fedco_over_torch_at_least": TARGET_VS_TORCH,
        "fedco_time_over_central_at_most": TARGET_VS_CENTRAL,
      },
    },
    "machine": machine,
    "load_average_end": C.load_average(),
    "host_batch_cost": dataloader_cost(host, rows, b, FLAGS.seed),
    "check_one_round": checks,
    "results": results,
  }
  C.write_json(FLAGS.out, out)
  print()
  print(markdown_tables(results, checks))
  print(f"\nwrote {FLAGS.out}")


if __name__ == "__main__":
  app.run(main)
