r"""Rounds per second on the E3 sinusoid workload with second-order MAML: fedco, a PyTorch
per-client loop, and one centralized jitted step.

Workload (E3, ``experiments/sinusoid.py`` at its defaults): 5 clients (all in every round),
each holding 5 of the 25 sinusoid tasks ``y = A sin(x + b pi / 5)``; every local step a client
meta-trains on 3 of its tasks with 10 support and 10 query shots each; MLP 1-40-40-1 (ReLU);
MAML with one inner step of rate 0.001 and the exact Hessian (second order); ``p = 5`` local
steps per round; Local-BSGD = ComFedL-MAML (``fedco.comfedl(0.01)`` on
``fedco.problems.maml``). Data: ``fedco.data.sinusoid.federated`` (1000 pre-drawn episodes per
client; an episode holds all 5 of a client's task slots, ``task_weight = 1/3`` on the 3 tasks
of the meta-batch). As in E3 the runtime draws one episode for the inner (support) value and
an independent one for the outer (query sets and the meta-batch's tasks), ``batch_size=1``.

Three implementations (four timed sides with ``torch_1t``), timed in one process with their
repeats alternating (medians reported):

1. ``fedco``: ``fedco.Simulator(problem, comfedl, data, batch_size=1, evaluate=False)``; each
   repeat is one ``run(state, --rounds)`` call (one jitted ``lax.scan``), then
   ``jax.block_until_ready``. Note that fedco adapts all 5 task slots of the inner episode
   (the two slots outside the meta-batch get a zero cotangent), i.e. 5/3 the adaptations of
   the PyTorch loop (``fedco.problems.maml``, WORKSPACE decision 29).
2. ``torch``: the loop as the MAML papers' code writes it (MAML-Pytorch style functional
   forward with an explicit weight list). One model copy per client with its own
   ``torch.optim.SGD(lr=0.01)``; every round each client loads the server weights; for every
   local step the client draws two episode indices with NumPy (support episode, query
   episode, as fedco does), and for each of the 3 tasks of the meta-batch: support loss,
   ``torch.autograd.grad(..., create_graph=True)``, adapted weights ``w - a g``, query loss
   times the task weight 1/3, ``backward()`` (gradients accumulate over the tasks); then one
   ``opt.step()``. After the round the server averages the client models (``no_grad``).
   Rounds, clients, steps and tasks are Python loops.
3. ``central``: the same arithmetic without the federated machinery: ONE model, and each
   step takes one support episode and one query episode from every client (drawn on device,
   ``randint`` + gather, as fedco does) and does one SGD step on the gradient of the mean over
   clients of ``f(g(w; support); query)`` (``problem.inner_value`` / ``problem.outer_value``,
   the same per-slot adaptation and HVP as fedco); ``p`` steps per round-equivalent, one
   jitted ``lax.scan``.

Ratios: ``fedco rounds/s / torch rounds/s`` (target >= 30, judged against the faster torch
side) and ``fedco seconds per round / central seconds per round-equivalent`` (target <= 1.5).

Correctness, before timing (float32 on both sides, then float64):

* ``check_one_step``: one client's meta-gradient on a fixed pair of episodes (support episode
  0, query episode 1 of client 0) from the same initial weights: fedco's ``comfedl.update``
  (direction ``-step / lr``) against the PyTorch loop's accumulated ``.grad``; also the
  PyTorch first-order gradient, to show the size of the Hessian term the check resolves.
* ``check_one_round``: one full round (5 clients x 5 steps x 3 tasks, then averaging) with one
  episode per client (so every draw on both sides is that episode): the server parameters.
* ``float64``: both checks again in float64 (parameters, episodes, torch tensors; a
  subprocess with ``JAX_ENABLE_X64=1``). fedco forms its client averaging weights in float32
  (``1/5`` is 1.5e-8 off), so the float64 round is also compared with the torch clients
  averaged with that float32 weight.

Run::

    python -m benchmarks.torch_sinusoid --out=benchmarks/results/torch_sinusoid.json
"""

from __future__ import annotations

import os
from typing import Any, Dict, List

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
import torch.nn.functional as F
from absl import app, flags

import fedco
from benchmarks import _common as C
from fedco.data import sinusoid as sinusoid_data
from fedco.models.mlp import MLP, init_mlp
from fedco.problems.maml import MAML

FLAGS = flags.FLAGS
C.define_timing_flags("torch_sinusoid", rounds=20, torch_rounds=1, repeats=5, x64_check=True)
flags.DEFINE_integer("clients", 5, "Clients (must divide the 25 training tasks).")
flags.DEFINE_integer("local_steps", 5, "Local steps per round (p).")
flags.DEFINE_integer("tasks_per_step", 3, "Tasks per client per local step.")
flags.DEFINE_integer("shots", 10, "Support points per task.")
flags.DEFINE_integer("query_shots", 10, "Query points per task.")
flags.DEFINE_float("inner_lr", 0.001, "MAML inner learning rate (one inner step).")
flags.DEFINE_float("lr", 0.01, "Local-BSGD (ComFedL-MAML) meta learning rate.")
flags.DEFINE_integer("episodes_per_client", 1000, "Pre-drawn episodes per client.")
flags.DEFINE_integer("seed", 0, "Seed for tasks, episodes, parameters and draws.")


TARGET_VS_TORCH = 30.0
TARGET_VS_CENTRAL = 1.5
HIDDEN = (40, 40)
LAYERS = ("hidden_0", "hidden_1", "out")
COMPILES = C.CompileCounter()
FIELDS = ("support_x", "support_y", "query_x", "query_y", "task_weight")


def make_problem(inner_lr: float):
  model = MLP(hidden=HIDDEN, out=1)
  meta = MAML(model.apply, inner_lr, 1, False)
  return model, meta, meta.problem("sinusoid_maml")


def cast_data(data: fedco.FederatedData, dtype) -> fedco.FederatedData:
  """The episodes' float fields in ``dtype`` (float64 for the float64 checks)."""
  cast = lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a
  return data._replace(examples=jax.tree.map(cast, data.examples))


def client_episodes(data: fedco.FederatedData) -> List[Dict[str, np.ndarray]]:
  """Each client's episodes as host arrays ``[n_k, ...]`` (the rows fedco gathers from)."""
  ex = jax.device_get(data.examples)
  index, counts = np.asarray(data.index), np.asarray(data.counts)
  return [
    {f: np.ascontiguousarray(ex[f][index[k, : counts[k]]]) for f in FIELDS}
    for k in range(data.num_clients)
  ]


# ---- (1) fedco ----------------------------------------------------------------------------


class FedcoSide:
  def __init__(self, problem, algorithm, data, params, *, rounds, seed):
    self.sim = fedco.Simulator(problem, algorithm, data, batch_size=1, evaluate=False)
    self.state, self.rounds = self.sim.init(params, seed), rounds

  def run(self):
    self.state, metrics = self.sim.run(self.state, self.rounds)
    jax.block_until_ready((self.state, metrics))

  def params(self):
    return self.state.server["params"]


# ---- (2) the PyTorch per-client loop --------------------------------------------------------


def to_torch_weights(params) -> List[np.ndarray]:
  """flax ``{"params": {layer: {kernel [in, out], bias}}}`` -> ``[W0 [out, in], b0, ...]``."""
  p = jax.device_get(params)["params"]
  out = []
  for layer in LAYERS:
    out += [np.asarray(p[layer]["kernel"]).T.copy(), np.asarray(p[layer]["bias"]).copy()]
  return out


def from_torch_weights(weights) -> Dict[str, Any]:
  w = [t.detach().numpy() for t in weights]
  return {
    "params": {
      layer: {"kernel": w[2 * i].T, "bias": w[2 * i + 1]} for i, layer in enumerate(LAYERS)
    }
  }


class SineNet(torch.nn.Module):
  """MLP 1-40-40-1 with a functional forward (``vars`` = the adapted weights), the way the
  MAML reference implementations in PyTorch write it."""

  def __init__(self, weights: List[np.ndarray]):
    super().__init__()
    self.vars = torch.nn.ParameterList([torch.nn.Parameter(torch.tensor(w)) for w in weights])

  def forward(self, x, vars=None):  # pylint: disable=redefined-builtin
    v = list(self.vars) if vars is None else vars
    x = F.relu(F.linear(x, v[0], v[1]))
    x = F.relu(F.linear(x, v[2], v[3]))
    return F.linear(x, v[4], v[5])


def meta_step(
  model: SineNet,
  opt,
  support,
  query,
  inner_lr: float,
  *,
  first_order: bool = False,
  step: bool = True,
):
  """One local step of Local-BSGD on one support episode and one query episode: for each task
  of the meta-batch (``task_weight > 0`` in the query episode) adapt, score, ``backward``;
  then one SGD step. Returns nothing; ``.grad`` holds the meta-gradient."""
  opt.zero_grad()
  weights = query["task_weight"]
  for t in torch.nonzero(weights > 0).flatten().tolist():
    fast = list(model.vars)
    loss_s = F.mse_loss(model(support["support_x"][t], fast), support["support_y"][t])
    grads = torch.autograd.grad(loss_s, fast, create_graph=not first_order)
    fast = [w - inner_lr * g for w, g in zip(fast, grads)]
    loss_q = F.mse_loss(model(query["query_x"][t], fast), query["query_y"][t])
    (weights[t] * loss_q).backward()
  if step:
    opt.step()


class TorchMAML:
  """Local-BSGD on MAML: per-client model copies, Python loops, averaging after each round."""

  def __init__(
    self,
    params,
    episodes: List[Dict[str, np.ndarray]],
    local_steps: int,
    lr: float,
    inner_lr: float,
    seed: int,
  ):
    weights = to_torch_weights(params)
    self.server = SineNet(weights)
    self.models = [SineNet(weights) for _ in episodes]
    self.opts = [torch.optim.SGD(m.parameters(), lr=lr) for m in self.models]
    # what a Dataset holds: one tensor per field and client (converted once, untimed)
    self.episodes = [{f: torch.from_numpy(e[f]) for f in FIELDS} for e in episodes]
    self.tau, self.inner_lr = local_steps, inner_lr
    self.rng = np.random.default_rng(seed)
    self.rounds_done = 0

  def _draw(self, c):
    ep = self.episodes[c]
    n = ep["support_x"].shape[0]
    i, j = self.rng.integers(0, n, size=2)  # support episode, query episode (independent)
    return {f: ep[f][i] for f in FIELDS}, {f: ep[f][j] for f in FIELDS}

  def round(self):
    with torch.no_grad():
      for model in self.models:
        for p, s in zip(model.vars, self.server.vars):
          p.copy_(s)
    for c, (model, opt) in enumerate(zip(self.models, self.opts)):
      for _ in range(self.tau):
        support, query = self._draw(c)
        meta_step(model, opt, support, query, self.inner_lr)
    with torch.no_grad():
      for i, s in enumerate(self.server.vars):
        s.copy_(torch.stack([m.vars[i] for m in self.models]).mean(0))
    self.rounds_done += 1

  def params(self):
    return from_torch_weights(self.server.vars)


class TorchSide:
  def __init__(self, fed: TorchMAML, rounds: int, threads: int):
    self.fed, self.rounds, self.threads = fed, rounds, threads

  def run(self):
    torch.set_num_threads(self.threads)
    for _ in range(self.rounds):
      self.fed.round()


# ---- (3) one centralized jitted step ---------------------------------------------------------


class CentralSide:
  """ONE model; each step one support and one query episode per client, SGD on the mean over
  clients of ``f(g(w; support); query)``; ``local_steps`` steps per round-equivalent."""

  def __init__(self, problem, data: fedco.FederatedData, params, *, lr, local_steps, rounds, seed):
    examples, index, counts = data.examples, data.index, data.counts
    k = data.num_clients
    one = jnp.ones((1,), jnp.float32)

    def client_loss(w, support, query):
      add = lambda e: jax.tree.map(lambda a: a[None], e)
      y = problem.inner_value(w, add(support), one)
      return problem.outer_value(y, add(query), one)

    def draw(key):
      pos = jax.random.randint(key, (k,), 0, counts)
      rows = index[jnp.arange(k), pos]
      return jax.tree.map(lambda a: a[rows], examples)

    def step(carry, _):
      w, key = carry
      key, k1, k2 = jax.random.split(key, 3)
      support, query = draw(k1), draw(k2)
      loss = lambda w: jnp.mean(jax.vmap(client_loss, (None, 0, 0))(w, support, query))
      grad = jax.grad(loss)(w)
      return (optax.apply_updates(w, jax.tree.map(lambda g: -lr * g, grad)), key), None

    @jax.jit
    def run(w, key):
      return jax.lax.scan(step, (w, key), None, length=rounds * local_steps)[0]

    self._run = run
    self.carry = (jax.tree.map(jnp.asarray, params), jax.random.PRNGKey(seed + 2))

  def run(self):
    self.carry = jax.block_until_ready(self._run(*self.carry))

  def params(self):
    return self.carry[0]


# ---- correctness ------------------------------------------------------------------------------


def _rel(diff, scale):
  return diff / max(scale, 1e-30)


def check_one_step(problem, algorithm, params, episodes, inner_lr, lr) -> Dict[str, Any]:
  """Client 0's meta-gradient on support episode 0 and query episode 1, fedco vs torch."""
  ep = episodes[0]
  support = {f: ep[f][0] for f in FIELDS}
  query = {f: ep[f][1] for f in FIELDS}
  batch = lambda e: {f: jnp.asarray(e[f])[None] for f in FIELDS}
  _, kwargs = fedco.oracle_args(problem, batch(support), batch(query))
  step, _ = jax.jit(lambda p: algorithm.update(None, algorithm.init(p), p, **kwargs))(params)
  grad_fedco = jax.tree.map(lambda s: -np.asarray(s, np.float64) / lr, jax.device_get(step))

  tsup = {f: torch.from_numpy(support[f]) for f in FIELDS}
  tqry = {f: torch.from_numpy(query[f]) for f in FIELDS}
  grads = {}
  for label, fo in (("second_order", False), ("first_order", True)):
    model = SineNet(to_torch_weights(params))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    meta_step(model, opt, tsup, tqry, inner_lr, first_order=fo, step=False)
    grads[label] = from_torch_weights([p.grad for p in model.vars])
  a = jax.tree.leaves(grad_fedco)
  b = [np.asarray(x, np.float64) for x in jax.tree.leaves(grads["second_order"])]
  dtype = jax.tree.leaves(params)[0].dtype
  va, vb = np.concatenate([x.ravel() for x in a]), np.concatenate([x.ravel() for x in b])
  out = {
    "support_episode": 0,
    "query_episode": 1,
    "client": 0,
    "dtype": str(dtype),
    "tasks": [int(t) for t in np.flatnonzero(query["task_weight"] > 0)],
    "max_abs_grad": C.max_abs(grad_fedco),
    "max_abs_diff_grad": C.max_abs_diff(grad_fedco, grads["second_order"]),
    "cosine": float(va @ vb / (np.linalg.norm(va) * np.linalg.norm(vb))),
    "relative_l2_diff": float(np.linalg.norm(va - vb) / np.linalg.norm(va)),
    "hessian_term_max_abs": C.max_abs_diff(grads["second_order"], grads["first_order"]),
  }
  out["relative_diff_grad"] = _rel(out["max_abs_diff_grad"], out["max_abs_grad"])
  out["diff_over_hessian_term"] = _rel(out["max_abs_diff_grad"], out["hessian_term_max_abs"])
  return out


def check_one_round(
  problem,
  algorithm,
  params,
  *,
  clients,
  local_steps,
  tasks_per_step,
  shots,
  query_shots,
  inner_lr,
  lr,
  seed,
  dtype=np.float32,
) -> Dict[str, Any]:
  """One round with ONE episode per client (every draw is that episode on both sides)."""
  data, _ = sinusoid_data.federated(
    seed + 11,
    num_clients=clients,
    episodes_per_client=1,
    shots=shots,
    query_shots=query_shots,
    tasks_per_step=tasks_per_step,
  )
  data = cast_data(data, dtype)
  sim = fedco.Simulator(problem, algorithm, data, batch_size=1, evaluate=False)
  state, _ = sim.run(sim.init(params, seed), 1)
  fed_params = jax.device_get(state.server["params"])
  tfed = TorchMAML(params, client_episodes(data), local_steps, lr, inner_lr, seed)
  tfed.round()
  t_params = tfed.params()
  p0 = jax.device_get(params)
  delta_f = jax.tree.map(lambda a, b: np.asarray(a, np.float64) - b, fed_params, p0)
  delta_t = jax.tree.map(lambda a, b: np.asarray(a, np.float64) - b, t_params, p0)
  out = {
    "episodes_per_client": 1,
    "rounds": 1,
    "dtype": np.dtype(dtype).name,
    "max_abs_diff_params": C.max_abs_diff(fed_params, t_params),
    "max_abs_params": C.max_abs(fed_params),
    "max_abs_diff_update": C.max_abs_diff(delta_f, delta_t),
    "max_abs_update": C.max_abs(delta_f),
  }
  out["relative_diff_update"] = _rel(out["max_abs_diff_update"], out["max_abs_update"])
  if dtype == np.float64:
    # fedco forms the averaging weights in float32 (1/K rounded); the torch clients averaged
    # with that same weight isolate this from the rest of the round
    w32 = float(np.float32(1.0 / clients))
    avg = [sum(w32 * m.vars[i].detach() for m in tfed.models) for i in range(len(tfed.server.vars))]
    out["float32_weight_of_one_client"] = w32
    out["max_abs_diff_params_torch_averaged_with_that_weight"] = C.max_abs_diff(
      fed_params, from_torch_weights(avg)
    )
  return out


def run_checks(problem, algorithm, params, data, dtype) -> Dict[str, Any]:
  name = np.dtype(dtype).name
  params = jax.tree.map(lambda a: jnp.asarray(a, dtype), params)
  step = check_one_step(
    problem, algorithm, params, client_episodes(cast_data(data, dtype)), FLAGS.inner_lr, FLAGS.lr
  )
  print(
    f"check one step ({name}): max |grad diff| {step['max_abs_diff_grad']:.2e} of "
    f"{step['max_abs_grad']:.2e} (relative {step['relative_diff_grad']:.2e}), cosine "
    f"{step['cosine']:.10f}, Hessian term {step['hessian_term_max_abs']:.2e}",
    flush=True,
  )
  rnd = check_one_round(
    problem,
    algorithm,
    params,
    clients=FLAGS.clients,
    local_steps=FLAGS.local_steps,
    tasks_per_step=FLAGS.tasks_per_step,
    shots=FLAGS.shots,
    query_shots=FLAGS.query_shots,
    inner_lr=FLAGS.inner_lr,
    lr=FLAGS.lr,
    seed=FLAGS.seed,
    dtype=dtype,
  )
  print(
    f"check one round ({name}): max |params diff| {rnd['max_abs_diff_params']:.2e}, "
    f"relative update diff {rnd['relative_diff_update']:.2e}",
    flush=True,
  )
  return {"check_one_step": step, "check_one_round": rnd}


def float64_checks() -> Dict[str, Any]:
  """The checks in float64, in a subprocess (x64 must be set before jax starts)."""
  names = (
    "clients",
    "local_steps",
    "tasks_per_step",
    "shots",
    "query_shots",
    "inner_lr",
    "lr",
    "episodes_per_client",
    "seed",
  )
  return C.float64_checks("benchmarks.torch_sinusoid", names, FLAGS)


# ---- main -------------------------------------------------------------------------------------


def markdown_table(rec, checks) -> str:
  t1 = f"{rec['torch_1t']['rounds_per_s']:.2f}" if "torch_1t" in rec else "-"
  return "\n".join(
    [
      "| workload | fedco rounds/s | torch rounds/s (2 thr / 1 thr) | central round-eq/s "
      f"| fedco / faster torch | >= {TARGET_VS_TORCH:g}x | fedco time / central time "
      f"| <= {TARGET_VS_CENTRAL:g}x | load (1 min) |",
      "|---|---:|---:|---:|---:|:---:|---:|:---:|---:|",
      f"| sinusoid MAML (2nd order), Local-BSGD | {rec['fedco']['rounds_per_s']:.1f} "
      f"| {rec['torch']['rounds_per_s']:.2f} / {t1} | {rec['central']['rounds_per_s']:.1f} "
      f"| {rec['fedco_over_torch_best']:.1f}x | {'yes' if rec['meets_torch_target'] else 'no'} "
      f"| {rec['fedco_time_over_central']:.2f}x "
      f"| {'yes' if rec['meets_central_target'] else 'no'} "
      f"| {rec['load_average'][0]:.2f} |",
      "",
      "| check | dtype | max abs diff | scale | relative | other |",
      "|---|---|---:|---:|---:|---|",
    ]
    + _check_rows(checks)
  )


def _check_rows(checks):
  rows = []
  for label, c in checks.items():
    if "error" in c:
      rows.append(f"| {label} | failed: {c['error'][-200:]!r} | | | | |")
      continue
    step, rnd = c["check_one_step"], c["check_one_round"]
    rows.append(
      f"| one step: client 0 meta-gradient | {step['dtype']} | {step['max_abs_diff_grad']:.2e} "
      f"| {step['max_abs_grad']:.2e} | {step['relative_diff_grad']:.2e} "
      f"| cosine {step['cosine']:.10f}; Hessian term {step['hessian_term_max_abs']:.2e} "
      f"(diff / term {step['diff_over_hessian_term']:.1e}) |"
    )
    extra = ""
    if "float32_weight_of_one_client" in rnd:
      extra = (
        f"; {rnd['max_abs_diff_params_torch_averaged_with_that_weight']:.2e} against "
        "torch averaged with fedco's float32 weight 1/K"
      )
    rows.append(
      f"| one round: server update | {rnd['dtype']} | {rnd['max_abs_diff_update']:.2e} "
      f"| {rnd['max_abs_update']:.2e} | {rnd['relative_diff_update']:.2e} "
      f"| params diff {rnd['max_abs_diff_params']:.2e}{extra} |"
    )
  return rows


def main(argv):
  del argv
  for flag in (
    "rounds",
    "torch_rounds",
    "repeats",
    "clients",
    "local_steps",
    "tasks_per_step",
    "shots",
    "query_shots",
    "episodes_per_client",
  ):
    if getattr(FLAGS, flag) < 1:
      raise app.UsageError(f"--{flag} must be >= 1, got {getattr(FLAGS, flag)}")
  if 25 % FLAGS.clients:
    raise app.UsageError(f"--clients must divide the 25 training tasks, got {FLAGS.clients}")
  if FLAGS.tasks_per_step > 25 // FLAGS.clients:
    raise app.UsageError(f"--tasks_per_step must be at most {25 // FLAGS.clients}")
  for flag in ("inner_lr", "lr"):
    if not getattr(FLAGS, flag) > 0:
      raise app.UsageError(f"--{flag} must be > 0, got {getattr(FLAGS, flag)}")
  torch.set_num_threads(os.cpu_count())
  torch.manual_seed(FLAGS.seed)
  k, tau = FLAGS.clients, FLAGS.local_steps
  model, _, problem = make_problem(FLAGS.inner_lr)
  algorithm = fedco.comfedl(FLAGS.lr, tau)
  params = init_mlp(model, 1, FLAGS.seed)
  data, _ = sinusoid_data.federated(
    FLAGS.seed,
    num_clients=k,
    episodes_per_client=FLAGS.episodes_per_client,
    shots=FLAGS.shots,
    query_shots=FLAGS.query_shots,
    tasks_per_step=FLAGS.tasks_per_step,
  )
  episodes = client_episodes(data)

  if FLAGS.check_only:
    dtype = np.float64 if jax.config.jax_enable_x64 else np.float32
    C.write_json(FLAGS.out, run_checks(problem, algorithm, params, data, dtype))
    return
  machine = C.machine_info(torch)
  print(
    f"machine: {machine['platform']} | {machine['cpu_model']} x{machine['cpu_count']} | "
    f"jax {machine['jax']} torch {machine['torch']} ({machine['torch_num_threads']} "
    f"threads) | load {machine['load_average_start']}",
    flush=True,
  )
  checks = {"float32": run_checks(problem, algorithm, params, data, np.float32)}
  if FLAGS.x64_check:
    checks["float64"] = float64_checks()
    if "error" in checks["float64"]:
      print(f"float64 checks failed: {checks['float64']['error'][-500:]}", flush=True)

  fed = FedcoSide(problem, algorithm, data, params, rounds=FLAGS.rounds, seed=FLAGS.seed)
  torch_sides = {}
  tfed = TorchMAML(params, episodes, tau, FLAGS.lr, FLAGS.inner_lr, FLAGS.seed + 1)
  torch_sides["torch"] = (tfed, TorchSide(tfed, FLAGS.torch_rounds, os.cpu_count()))
  if FLAGS.torch_one_thread:
    tfed1 = TorchMAML(params, episodes, tau, FLAGS.lr, FLAGS.inner_lr, FLAGS.seed + 1)
    torch_sides["torch_1t"] = (tfed1, TorchSide(tfed1, FLAGS.torch_rounds, 1))
  central = CentralSide(
    problem, data, params, lr=FLAGS.lr, local_steps=tau, rounds=FLAGS.rounds, seed=FLAGS.seed
  )
  load_before = C.load_average()
  runs = {
    "fedco": fed.run,
    **{label: side.run for label, (_, side) in torch_sides.items()},
    "central": central.run,
  }
  timed = C.alternate(runs, FLAGS.repeats, COMPILES)
  torch.set_num_threads(os.cpu_count())

  # post-adaptation MSE on a held-out set of training-task episodes, as a sanity check
  _, meta, _ = make_problem(FLAGS.inner_lr)
  tasks = sinusoid_data.assign_tasks(k, FLAGS.seed)
  eval_ep = {
    f: jnp.asarray(v)
    for f, v in sinusoid_data.training_eval_episode(
      tasks, 12345, shots=FLAGS.shots, query_shots=FLAGS.query_shots
    ).items()
    if f in ("support_x", "support_y", "query_x", "query_y", "task_weight")
  }
  mse = jax.jit(lambda w: jnp.mean(meta.adapted_losses(w, eval_ep)))
  sides = {
    "fedco": (FLAGS.rounds, fed.params()),
    **{label: (FLAGS.torch_rounds, tf.params()) for label, (tf, _) in torch_sides.items()},
    "central": (FLAGS.rounds, central.params()),
  }
  rec = {
    "problem": problem.name,
    "algorithm": algorithm.name,
    "load_average": load_before,
    "initial_train_mse": float(mse(params)),
  }
  C.record_sides(rec, timed, sides, torch_sides, "final_train_mse", mse)
  rec["fedco"]["rounds_run"] = int(fed.state.round)
  rec["meets_torch_target"] = rec["fedco_over_torch_best"] >= TARGET_VS_TORCH
  rec["meets_central_target"] = rec["fedco_time_over_central"] <= TARGET_VS_CENTRAL
  print(
    f"fedco {rec['fedco']['rounds_per_s']:.1f} r/s, torch "
    + ", ".join(f"{label} {rec[label]['rounds_per_s']:.2f}" for label in torch_sides)
    + f" r/s, central {rec['central']['rounds_per_s']:.1f} r/s | fedco/best torch "
    f"{rec['fedco_over_torch_best']:.1f}x, fedco/central time "
    f"{rec['fedco_time_over_central']:.2f}x",
    flush=True,
  )

  out = {
    "benchmark": "torch_sinusoid",
    "timestamp": C.timestamp(),
    "config": {
      "clients": k,
      "clients_per_round": k,
      "local_steps": tau,
      "task_slots_per_client": 25 // k,
      "tasks_per_step": FLAGS.tasks_per_step,
      "shots": FLAGS.shots,
      "query_shots": FLAGS.query_shots,
      "episodes_per_client": FLAGS.episodes_per_client,
      "model": "MLP 1-40-40-1 (ReLU)",
      "maml": {"inner_lr": FLAGS.inner_lr, "inner_steps": 1, "second_order": True},
      "algorithm": f"Local-BSGD = fedco.comfedl({FLAGS.lr}, {tau})",
      "fedco_batch_size": 1,
      "fedco_adapts_all_slots": True,
      "fedco_rounds_per_repeat": FLAGS.rounds,
      "central_rounds_per_repeat": FLAGS.rounds,
      "torch_rounds_per_repeat": FLAGS.torch_rounds,
      "repeats": FLAGS.repeats,
      "statistic": "median over repeats; fedco, torch(, torch_1t) and central repeats alternate",
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
    "checks": checks,
    "results": rec,
  }
  C.write_json(FLAGS.out, out)
  print()
  print(markdown_table(rec, checks))
  print(f"\nwrote {FLAGS.out}")


if __name__ == "__main__":
  app.run(main)
