r"""Rounds per second on a convolutional FedAvg workload: fedco, a PyTorch per-client loop, and
one centralized jitted step.

Workload: the E2 network, ``fedco.models.CNN4`` (MAML's Conv-4: four blocks of conv 3x3 with
32 filters and no bias, GroupNorm with ``group_count(32) = 8`` groups, ReLU, 2x2 max-pool;
then ``Dense(10)``; 30,058 parameters at 32x32x3) on synthetic CIFAR-shaped data (images
uniform in [0, 1], shape 32x32x3, random labels, 500 per client; nothing is downloaded).
10 clients, all in every round, ``tau = 5`` local steps, batch 32 per client per step, plain
FedAvg on the cross-entropy (``fedco.fedavg(0.1)`` on ``fedco.plain(loss)``; E2's FedAvg
rate).

Timed sides (one process, repeats alternating, medians reported):

1. ``fedco``: ``fedco.Simulator(..., batch_size=32, evaluate=False)``; each repeat is one
   ``run(state, --rounds)`` call (one jitted ``lax.scan`` over rounds, each round a
   ``lax.scan`` over the ``tau`` local steps), then ``block_until_ready``. The model is
   applied per example and vmapped over the batch and over the clients (each client has its
   own weights).
2. ``torch`` / ``torch_1t``: the loop the way FedAvg reference code writes it: the same
   network in ``torch.nn`` (``Conv2d(bias=False)``, ``nn.GroupNorm(8, 32, eps=1e-5)``,
   ``ReLU``, ``MaxPool2d(2)``, ``Linear``; NCHW); every round each client gets
   ``copy.deepcopy(server)`` and a fresh ``torch.optim.SGD(lr=0.1)``; every step draws a
   host batch with NumPy indices (``torch.from_numpy``) and does ``zero_grad``,
   ``F.cross_entropy``, ``backward``, ``step``; after the round the server loads the mean of
   the clients' ``state_dict``s (``no_grad``). Rounds, clients and steps are Python loops.
   The images are stored NCHW on the host once (untimed), as a torch ``Dataset`` would.
   ``torch`` uses ``set_num_threads(os.cpu_count())``, ``torch_1t`` one thread.
3. ``central``: plain minibatch SGD on ONE model with the pooled batch ``K * b = 320``: one
   jitted step (on-device ``randint`` + gather, ``fedco.oracle_args`` + ``fedavg.update``),
   called ``tau`` times from Python per round-equivalent. (Not a ``lax.scan``: see 4.)
4. ``fedco_unrolled``: fedco's own arithmetic (per client ``draw_batch``,
   ``fedco.oracle_args``, ``fedavg.update``, vmapped over the clients' models, then the
   average) in a hand-written jitted round whose local-step ``lax.scan`` has
   ``unroll=True``; rounds are driven from Python (one call per round), so no ``while`` loop
   encloses the model. It is what fedco would run without loops around the model (unrolling
   only the local steps is not enough: an enclosing rounds ``scan``, even of length 1, keeps
   the convolutions on the slow path).

Why side 4 and the diagnostic exist: XLA:CPU runs the backward convolutions of a ``while``
loop body (every ``lax.scan``) with non-canonical dimension labels (``b01f_01oi->b01f``,
``f01b_i01o->01bf``) through a slow generic emitter, about 10x slower than the same step
outside a loop, where they are canonicalised to ``b01f_01io->b01f``
(https://github.com/jax-ml/jax/issues/12868, open). fedco's models therefore default to
``conv_impl="auto"``, which on the CPU computes convolutions as im2col matrix products and
the pool as a reshape-max (``fedco.models.layers``): no convolution op is left to hit that
path. ``--conv_impl=xla`` times the ``lax.conv_general_dilated`` model instead (about 30x
slower per round here). ``while_loop_diagnostic`` in the JSON measures, for both
implementations, one SGD step of the model on a batch of 32 as a single jitted call, inside a
rolled ``lax.scan`` and inside an unrolled one, and counts the dimension labels of the
compiled convolutions (none for ``matmul``).

Ratios: ``fedco rounds/s / faster torch rounds/s`` (target: fedco not slower, >= 1),
``fedco seconds per round / central seconds per round-equivalent``, and the same two for
``fedco_unrolled``.

Correctness, before timing (same initial weights converted from flax: conv
``HWIO -> OIHW``, the dense kernel's rows permuted from flax's ``(h, w, c)`` flatten order to
torch's ``(c, h, w)``):

* ``check_one_step``: one local step of client 0 on the same batch of 32: the gradient and
  the parameters after the step (``fedavg.update`` vs ``SGD.step``), float32.
* ``check_one_round``: one full round (10 clients x 5 steps, then averaging) with
  ``--check_examples`` images per client and every batch the client's whole data (fedco's
  ``batch_size=None``), float32. A near-tie in a max-pool window (or a ReLU input near 0)
  can go the other way after a 1-ulp difference on some client, and the two trajectories
  then part by far more than rounding, so the round is also checked in float64:
* ``float64``: both checks again with float64 parameters, data and ``model.double()`` (a
  subprocess with ``JAX_ENABLE_X64=1``). fedco forms its client averaging weights in float32
  (``1/10`` is 1.5e-8 off), so the float64 round is also compared with the torch clients
  averaged with that float32 weight.

Run::

    python -m benchmarks.torch_conv --out=benchmarks/results/torch_conv.json
"""

from __future__ import annotations

import collections
import copy
import os
import re
import time
from typing import Any, Dict

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
import torch.nn.functional as F
from absl import app, flags

import fedco
from benchmarks import _common as C
from benchmarks.peers.torch_cnn4 import TorchCNN4  # the network of the peers' programs too
from fedco.models import CNN4, cross_entropy, init_cnn
from fedco.models.cnn import group_count
from fedco.models.layers import resolve_impl
from fedco.runtime import ClientView, draw

FLAGS = flags.FLAGS
C.define_timing_flags("torch_conv", rounds=1, torch_rounds=1, repeats=3, x64_check=True)
flags.DEFINE_integer("clients", 10, "Clients (all participate every round).")
flags.DEFINE_integer("local_steps", 5, "Local steps per round (tau).")
flags.DEFINE_integer("batch_size", 32, "Images per client per step (b).")
flags.DEFINE_integer("examples_per_client", 500, "Synthetic images per client.")
flags.DEFINE_integer("image_size", 32, "Image height and width (>= 16).")
flags.DEFINE_integer("filters", 32, "CNN4 channels per convolution.")
flags.DEFINE_float("lr", 0.1, "FedAvg local SGD rate (E2's).")
flags.DEFINE_enum(
  "conv_impl",
  "auto",
  ["auto", "matmul", "xla"],
  "CNN4's conv_impl for the fedco, fedco_unrolled and central sides (auto: "
  "matmul, i.e. im2col, on the CPU). The while-loop diagnostic runs both.",
)
flags.DEFINE_integer(
  "check_examples", 16, "Images per client in the one-round check (whole-data batches)."
)
flags.DEFINE_integer("seed", 0, "Seed for data, parameters and batches.")

TARGET_VS_TORCH = 1.0
CANONICAL_CONV = "b01f_01io->b01f"  # what XLA:CPU's fast convolution path takes
NUM_CLASSES = 10
CHANNELS = 3
COMPILES = C.CompileCounter()


def make_data(clients, per_client, size, seed):
  rng = np.random.default_rng(seed)
  n = clients * per_client
  x = rng.random((n, size, size, CHANNELS), dtype=np.float32)
  y = rng.integers(0, NUM_CLASSES, size=n).astype(np.int32)
  rows = [np.arange(k * per_client, (k + 1) * per_client) for k in range(clients)]
  return {"x": x, "y": y}, rows


def make_problem(filters, lr, local_steps, conv_impl="auto"):
  model = CNN4(num_classes=NUM_CLASSES, filters=filters, norm="group", conv_impl=conv_impl)

  def loss(params, example):
    return cross_entropy(model.apply(params, example["x"]), example["y"])

  return model, loss, fedco.plain(loss, name="cross_entropy"), fedco.fedavg(lr, local_steps)


# ---- the PyTorch network and weight conversion -----------------------------------------------


def _conv_names(i):
  return 4 * i, 4 * i + 1  # Sequential index of block i's conv and GroupNorm


def to_torch_state(params, filters, size) -> Dict[str, torch.Tensor]:
  p = jax.device_get(params)["params"]
  state = {}
  for i in range(4):
    conv, norm = _conv_names(i)
    state[f"features.{conv}.weight"] = np.transpose(p[f"conv_{i}"]["kernel"], (3, 2, 0, 1))
    state[f"features.{norm}.weight"] = p[f"norm_{i}"]["scale"]
    state[f"features.{norm}.bias"] = p[f"norm_{i}"]["bias"]
  s = size // 16
  kernel = np.asarray(p["logits"]["kernel"])  # rows in flax's (h, w, c) order
  kernel = kernel.reshape(s, s, filters, -1).transpose(2, 0, 1, 3).reshape(filters * s * s, -1)
  state["logits.weight"] = kernel.T
  state["logits.bias"] = p["logits"]["bias"]
  return {k: torch.tensor(np.ascontiguousarray(v)) for k, v in state.items()}


def from_torch_state(state, filters, size) -> Dict[str, Any]:
  st = {k: v.detach().numpy() for k, v in state.items()}
  p = {}
  for i in range(4):
    conv, norm = _conv_names(i)
    p[f"conv_{i}"] = {"kernel": np.transpose(st[f"features.{conv}.weight"], (2, 3, 1, 0))}
    p[f"norm_{i}"] = {"scale": st[f"features.{norm}.weight"], "bias": st[f"features.{norm}.bias"]}
  s = size // 16
  kernel = st["logits.weight"].T.reshape(filters, s, s, -1).transpose(1, 2, 0, 3)
  p["logits"] = {"kernel": kernel.reshape(filters * s * s, -1), "bias": st["logits.bias"]}
  return {"params": p}


def torch_model(params, filters, size):
  """A ``TorchCNN4`` holding ``params`` (float32, or float64 when the params are)."""
  model = TorchCNN4(filters, NUM_CLASSES, CHANNELS, size, groups=group_count(filters))
  if jax.tree.leaves(params)[0].dtype == np.float64:
    model = model.double()
  model.load_state_dict(to_torch_state(params, filters, size))
  return model


# ---- (2) the PyTorch per-client loop --------------------------------------------------------


class HostLoader:
  """Per-client batches drawn with NumPy indices from NCHW host arrays (with replacement, as
  fedco draws); ``batch_size=None`` is the client's whole data."""

  def __init__(self, host, rows, batch_size, seed):
    self.x = torch.from_numpy(np.ascontiguousarray(host["x"].transpose(0, 3, 1, 2)))
    self.y = torch.from_numpy(host["y"].astype(np.int64))
    self.rows, self.batch_size = [np.asarray(r) for r in rows], batch_size
    self.rng = np.random.default_rng(seed)

  def draw(self, c):
    rows = self.rows[c]
    if self.batch_size is not None:
      rows = rows[self.rng.integers(0, len(rows), size=self.batch_size)]
    idx = torch.from_numpy(rows)
    return self.x[idx], self.y[idx]


class TorchFedAvg:
  def __init__(self, params, loader, clients, local_steps, lr, filters, size):
    self.server = torch_model(params, filters, size)
    self.loader, self.k, self.tau, self.lr = loader, clients, local_steps, lr
    self.filters, self.size = filters, size
    self.rounds_done = 0

  def local_update(self, c):
    model = copy.deepcopy(self.server)
    opt = torch.optim.SGD(model.parameters(), lr=self.lr)
    model.train()
    for _ in range(self.tau):
      x, y = self.loader.draw(c)
      opt.zero_grad()
      F.cross_entropy(model(x), y).backward()
      opt.step()
    return model.state_dict()

  def round(self):
    states = [self.local_update(c) for c in range(self.k)]
    self.last_client_states = states
    with torch.no_grad():
      avg = {name: torch.stack([s[name] for s in states]).mean(0) for name in states[0]}
    self.server.load_state_dict(avg)
    self.rounds_done += 1

  def params(self):
    return from_torch_state(self.server.state_dict(), self.filters, self.size)


class TorchSide:
  def __init__(self, fed: TorchFedAvg, rounds: int, threads: int):
    self.fed, self.rounds, self.threads = fed, rounds, threads

  def run(self):
    torch.set_num_threads(self.threads)
    for _ in range(self.rounds):
      self.fed.round()


# ---- (3) the centralized step, (4) fedco's arithmetic with the step loop unrolled -------------


class CentralStepSide:
  """ONE model, pooled batch ``batch``: one jitted step, ``local_steps`` calls per round-eq."""

  def __init__(self, problem, algorithm, host, params, *, batch, local_steps, seed):
    examples = jax.tree.map(jnp.asarray, host)
    n = int(examples["x"].shape[0])

    @jax.jit
    def step(params, st, key):
      key, k1 = jax.random.split(key)
      b = jax.tree.map(lambda a: a[jax.random.randint(k1, (batch,), 0, n)], examples)
      grad_h_fn, kwargs = fedco.oracle_args(problem, b, b)
      updates, st = algorithm.update(grad_h_fn(params), st, params, **kwargs)
      return optax.apply_updates(params, updates), st, key

    self._step, self.local_steps = step, local_steps
    self.carry = (params, algorithm.init(params), jax.random.PRNGKey(seed + 2))

  def run(self):
    for _ in range(self.local_steps):
      self.carry = self._step(*self.carry)
    jax.block_until_ready(self.carry)

  def params(self):
    return self.carry[0]


def client_round_program(problem, algorithm, data, *, batch_size, local_steps, unroll):
  """A jitted round of fedco's FedAvg arithmetic over all clients (vmapped client models),
  its local-step ``lax.scan`` rolled (``unroll=1``) or unrolled (``unroll=True``)."""
  ex, starts, counts, k = data.examples, data.offsets, data.counts, data.num_clients

  def client(p, st, key, start, count):
    b, w = draw(key, ClientView(ex, start, count, data.flat_rows), batch_size, data.max_count)
    grad_h_fn, kwargs = fedco.oracle_args(problem, b, b, None, (w, w, w))
    updates, st = algorithm.update(grad_h_fn(p), st, p, **kwargs)
    return optax.apply_updates(p, updates), st

  @jax.jit
  def run(params, key):
    key, kr = jax.random.split(key)
    models = jax.tree.map(lambda a: jnp.broadcast_to(a, (k,) + a.shape), params)
    states = jax.vmap(algorithm.init)(models)

    def step(carry, t):
      keys = jax.random.split(jax.random.fold_in(kr, t), k)
      return jax.vmap(client)(*carry, keys, starts, counts), None

    (models, _), _ = jax.lax.scan(step, (models, states), jnp.arange(local_steps), unroll=unroll)
    return jax.tree.map(lambda a: a.mean(0), models), key

  return run


class UnrolledSide:
  def __init__(self, problem, algorithm, data, params, *, batch_size, local_steps, rounds, seed):
    self._run = client_round_program(
      problem, algorithm, data, batch_size=batch_size, local_steps=local_steps, unroll=True
    )
    self.rounds, self.rounds_done = rounds, 0
    self.carry = (params, jax.random.PRNGKey(seed + 3))

  def run(self):
    for _ in range(self.rounds):
      self.carry = self._run(*self.carry)
      self.rounds_done += 1
    jax.block_until_ready(self.carry)

  def params(self):
    return self.carry[0]


def conv_labels(compiled_text: str) -> Dict[str, int]:
  return dict(collections.Counter(re.findall(r"dim_labels=([a-z0-9_>-]+)", compiled_text)))


def while_loop_diagnostic(loss, params, host, *, batch_size, local_steps, lr, seed):
  """One SGD step of the model on a batch of ``batch_size``: a single jitted call, the same
  step in a rolled ``lax.scan`` of ``local_steps``, and in an unrolled one (ms per step)."""
  ex = jax.tree.map(jnp.asarray, host)
  n = int(ex["x"].shape[0])

  def step(p, key):
    b = jax.tree.map(lambda a: a[jax.random.randint(key, (batch_size,), 0, n)], ex)
    g = jax.grad(lambda q: jnp.mean(jax.vmap(loss, (None, 0))(q, b)))(p)
    return jax.tree.map(lambda a, d: a - lr * d, p, g)

  def scanned(unroll):
    def run(p, key):
      body = lambda p, t: (step(p, jax.random.fold_in(key, t)), None)
      return jax.lax.scan(body, p, jnp.arange(local_steps), unroll=unroll)[0]

    return jax.jit(run)

  programs = {
    "single_jitted_step": (jax.jit(step), 1),
    "rolled_scan": (scanned(1), local_steps),
    "unrolled_scan": (scanned(True), local_steps),
  }
  key = jax.random.PRNGKey(seed + 4)
  out = {
    "batch_size": batch_size,
    "scan_length": local_steps,
    "issue": "https://github.com/jax-ml/jax/issues/12868",
    "canonical_conv_dim_labels": CANONICAL_CONV,
  }
  for name, (fn, steps) in programs.items():
    out[f"{name}_conv_dim_labels"] = conv_labels(fn.lower(params, key).compile().as_text())
    jax.block_until_ready(fn(params, key))  # compile and warm
    t0 = time.perf_counter()
    jax.block_until_ready(fn(params, key))
    out[f"{name}_ms_per_step"] = 1e3 * (time.perf_counter() - t0) / steps
  out["rolled_over_unrolled"] = out["rolled_scan_ms_per_step"] / out["unrolled_scan_ms_per_step"]
  return out


# ---- correctness ------------------------------------------------------------------------------


def _diffs(fed_params, t_params, p0):
  delta_f = jax.tree.map(lambda a, b: np.asarray(a, np.float64) - b, fed_params, p0)
  delta_t = jax.tree.map(lambda a, b: np.asarray(a, np.float64) - b, t_params, p0)
  out = {
    "max_abs_diff_params": C.max_abs_diff(fed_params, t_params),
    "max_abs_params": C.max_abs(fed_params),
    "max_abs_diff_update": C.max_abs_diff(delta_f, delta_t),
    "max_abs_update": C.max_abs(delta_f),
  }
  out["relative_diff_update"] = out["max_abs_diff_update"] / max(out["max_abs_update"], 1e-30)
  return out


def _cast(host, dtype):
  return {"x": host["x"].astype(dtype), "y": host["y"]}


def check_one_step(
  problem, algorithm, params, host, rows, *, batch_size, lr, filters, size, seed
) -> Dict[str, Any]:
  """Client 0's first local step on the same batch of ``batch_size`` images."""
  pick = np.random.default_rng(seed + 5).integers(0, len(rows[0]), size=batch_size)
  idx = np.asarray(rows[0])[pick]
  batch = {"x": jnp.asarray(host["x"][idx]), "y": jnp.asarray(host["y"][idx])}
  grad_h_fn, kwargs = fedco.oracle_args(problem, batch, batch)

  @jax.jit
  def one(p):
    grad = grad_h_fn(p)
    step, _ = algorithm.update(grad, algorithm.init(p), p, **kwargs)
    return grad, jax.tree.map(jnp.add, p, step)

  grad_f, new_f = jax.device_get(one(params))
  model = torch_model(params, filters, size)
  opt = torch.optim.SGD(model.parameters(), lr=lr)
  opt.zero_grad()
  x = torch.from_numpy(np.ascontiguousarray(host["x"][idx].transpose(0, 3, 1, 2)))
  F.cross_entropy(model(x), torch.from_numpy(host["y"][idx].astype(np.int64))).backward()
  grad_state = {name: p.grad.clone() for name, p in model.named_parameters()}
  opt.step()
  grad_t = from_torch_state(grad_state, filters, size)
  new_t = from_torch_state(model.state_dict(), filters, size)
  va = np.concatenate([np.ravel(a) for a in jax.tree.leaves(grad_f)]).astype(np.float64)
  vb = np.concatenate([np.ravel(a) for a in jax.tree.leaves(grad_t)]).astype(np.float64)
  out = {
    "batch_size": batch_size,
    "dtype": str(host["x"].dtype),
    "max_abs_grad": C.max_abs(grad_f),
    "max_abs_diff_grad": C.max_abs_diff(grad_f, grad_t),
    "relative_l2_diff_grad": float(np.linalg.norm(va - vb) / np.linalg.norm(va)),
    "cosine_grad": float(va @ vb / (np.linalg.norm(va) * np.linalg.norm(vb))),
    **_diffs(new_f, new_t, jax.device_get(params)),
  }
  out["relative_diff_grad"] = out["max_abs_diff_grad"] / max(out["max_abs_grad"], 1e-30)
  return out


def check_one_round(
  problem,
  algorithm,
  params,
  *,
  clients,
  per_client,
  local_steps,
  lr,
  filters,
  size,
  seed,
  dtype=np.float32,
) -> Dict[str, Any]:
  """One round, whole-data batches on both sides (fedco's ``batch_size=None``)."""
  host, rows = make_data(clients, per_client, size, seed + 7)
  host = _cast(host, dtype)
  data = fedco.FederatedData.from_index_lists(host, rows)
  sim = fedco.Simulator(problem, algorithm, data, batch_size=None, evaluate=False)
  state, _ = sim.run(sim.init(params, seed), 1)
  fed_params = jax.device_get(state.server["params"])
  tfed = TorchFedAvg(
    params, HostLoader(host, rows, None, seed), clients, local_steps, lr, filters, size
  )
  tfed.round()
  out = {
    "examples_per_client": per_client,
    "rounds": 1,
    "dtype": np.dtype(dtype).name,
    **_diffs(fed_params, tfed.params(), jax.device_get(params)),
  }
  if dtype == np.float64:
    # fedco forms the averaging weights in float32 (1/K rounded, 1.5e-8 off for K = 10); the
    # torch clients averaged with that same weight isolate this from the rest of the round
    w32 = float(np.float32(1.0 / clients))
    with torch.no_grad():
      avg = {
        name: sum(w32 * s[name] for s in tfed.last_client_states)
        for name in tfed.last_client_states[0]
      }
    out["float32_weight_of_one_client"] = w32
    out["max_abs_diff_params_torch_averaged_with_that_weight"] = C.max_abs_diff(
      fed_params, from_torch_state(avg, filters, size)
    )
  return out


def run_checks(problem, algorithm, params, host, rows, dtype) -> Dict[str, Any]:
  k, tau, b, size, filters = (
    FLAGS.clients,
    FLAGS.local_steps,
    FLAGS.batch_size,
    FLAGS.image_size,
    FLAGS.filters,
  )
  params = jax.tree.map(lambda a: jnp.asarray(a, dtype), params)
  step = check_one_step(
    problem,
    algorithm,
    params,
    _cast(host, dtype),
    rows,
    batch_size=b,
    lr=FLAGS.lr,
    filters=filters,
    size=size,
    seed=FLAGS.seed,
  )
  print(
    f"check one step ({np.dtype(dtype).name}): max |grad diff| "
    f"{step['max_abs_diff_grad']:.2e} of {step['max_abs_grad']:.2e} (relative "
    f"{step['relative_diff_grad']:.2e}), cosine {step['cosine_grad']:.10f}",
    flush=True,
  )
  rnd = check_one_round(
    problem,
    algorithm,
    params,
    clients=k,
    per_client=FLAGS.check_examples,
    local_steps=tau,
    lr=FLAGS.lr,
    filters=filters,
    size=size,
    seed=FLAGS.seed,
    dtype=dtype,
  )
  print(
    f"check one round ({np.dtype(dtype).name}): max |params diff| "
    f"{rnd['max_abs_diff_params']:.2e}, relative update diff "
    f"{rnd['relative_diff_update']:.2e}",
    flush=True,
  )
  return {"check_one_step": step, "check_one_round": rnd}


def float64_checks() -> Dict[str, Any]:
  """The checks in float64, in a subprocess (x64 must be set before jax starts)."""
  names = (
    "clients",
    "local_steps",
    "batch_size",
    "examples_per_client",
    "image_size",
    "filters",
    "lr",
    "conv_impl",
    "check_examples",
    "seed",
  )
  return C.float64_checks("benchmarks.torch_conv", names, FLAGS)


# ---- main -------------------------------------------------------------------------------------


def markdown_table(rec, checks, diag, b) -> str:
  t1 = f"{rec['torch_1t']['rounds_per_s']:.3f}" if "torch_1t" in rec else "-"
  lines = [
    "| workload | fedco rounds/s | torch rounds/s (2 thr / 1 thr) | central round-eq/s "
    "| fedco / faster torch | fedco not slower | fedco time / central time "
    "| fedco_unrolled rounds/s | unrolled / faster torch | unrolled time / central "
    "| load (1 min) |",
    "|---|---:|---:|---:|---:|:---:|---:|---:|---:|---:|---:|",
    f"| CNN4 FedAvg, 10 clients, tau 5, b {b} | {rec['fedco']['rounds_per_s']:.4f} "
    f"| {rec['torch']['rounds_per_s']:.3f} / {t1} | {rec['central']['rounds_per_s']:.3f} "
    f"| {rec['fedco_over_torch_best']:.3f}x | {'yes' if rec['meets_torch_target'] else 'no'} "
    f"| {rec['fedco_time_over_central']:.1f}x "
    f"| {rec['fedco_unrolled']['rounds_per_s']:.3f} "
    f"| {rec['fedco_unrolled_over_torch_best']:.2f}x "
    f"| {rec['fedco_unrolled_time_over_central']:.2f}x | {rec['load_average'][0]:.2f} |",
    "",
    *[
      f"conv_impl={impl}, one SGD step on a batch of {d['batch_size']}: single jitted call "
      f"{d['single_jitted_step_ms_per_step']:.0f} ms, in a rolled lax.scan "
      f"{d['rolled_scan_ms_per_step']:.0f} ms, unrolled "
      f"{d['unrolled_scan_ms_per_step']:.0f} ms per step "
      f"(rolled / unrolled {d['rolled_over_unrolled']:.1f}x).\n"
      for impl, d in diag.items()
    ],
    "| check | dtype | max abs diff | scale | relative | other |",
    "|---|---|---:|---:|---:|---|",
  ]
  for label, c in checks.items():
    if "error" in c:
      lines.append(f"| {label} | failed: {c['error'][-200:]!r} | | | | |")
      continue
    s, r = c["check_one_step"], c["check_one_round"]
    lines.append(
      f"| one step: client 0 gradient | {s['dtype']} | {s['max_abs_diff_grad']:.2e} "
      f"| {s['max_abs_grad']:.2e} | {s['relative_diff_grad']:.2e} "
      f"| cosine {s['cosine_grad']:.10f}; params after the step differ by "
      f"{s['max_abs_diff_params']:.2e} |"
    )
    lines.append(
      f"| one round: server update ({r['examples_per_client']} per client) "
      f"| {r['dtype']} | {r['max_abs_diff_update']:.2e} | {r['max_abs_update']:.2e} "
      f"| {r['relative_diff_update']:.2e} "
      f"| params diff {r['max_abs_diff_params']:.2e}"
      + (
        f"; {r['max_abs_diff_params_torch_averaged_with_that_weight']:.2e} against "
        f"torch averaged with fedco's float32 weight 1/K"
        if "float32_weight_of_one_client" in r
        else ""
      )
      + " |"
    )
  return "\n".join(lines)


def main(argv):
  del argv
  for flag in (
    "rounds",
    "torch_rounds",
    "repeats",
    "clients",
    "local_steps",
    "batch_size",
    "examples_per_client",
    "filters",
    "check_examples",
  ):
    if getattr(FLAGS, flag) < 1:
      raise app.UsageError(f"--{flag} must be >= 1, got {getattr(FLAGS, flag)}")
  if FLAGS.image_size < 16 or FLAGS.image_size % 16:
    raise app.UsageError(f"--image_size must be a multiple of 16, got {FLAGS.image_size}")
  if not FLAGS.lr > 0:
    raise app.UsageError(f"--lr must be > 0, got {FLAGS.lr}")
  torch.set_num_threads(os.cpu_count())
  torch.manual_seed(FLAGS.seed)
  k, tau, b, size, filters = (
    FLAGS.clients,
    FLAGS.local_steps,
    FLAGS.batch_size,
    FLAGS.image_size,
    FLAGS.filters,
  )
  model, loss, problem, algorithm = make_problem(filters, FLAGS.lr, tau, FLAGS.conv_impl)
  params = init_cnn(model, (size, size, CHANNELS), FLAGS.seed)
  n_params = int(sum(np.size(a) for a in jax.tree.leaves(params)))
  host, rows = make_data(k, FLAGS.examples_per_client, size, FLAGS.seed)

  if FLAGS.check_only:
    dtype = np.float64 if jax.config.jax_enable_x64 else np.float32
    C.write_json(FLAGS.out, run_checks(problem, algorithm, params, host, rows, dtype))
    return

  machine = C.machine_info(torch)
  print(
    f"machine: {machine['platform']} | {machine['cpu_model']} x{machine['cpu_count']} | "
    f"jax {machine['jax']} torch {machine['torch']} ({machine['torch_num_threads']} "
    f"threads) | load {machine['load_average_start']}",
    flush=True,
  )
  checks = {"float32": run_checks(problem, algorithm, params, host, rows, np.float32)}
  if FLAGS.x64_check:
    checks["float64"] = float64_checks()
    if "error" in checks["float64"]:
      print(f"float64 checks failed: {checks['float64']['error'][-500:]}", flush=True)
    else:
      for name, c in checks["float64"].items():
        print(f"{name} (float64): relative update diff {c['relative_diff_update']:.2e}", flush=True)

  diag = {}
  for impl in ("xla", "matmul"):
    impl_loss = make_problem(filters, FLAGS.lr, tau, impl)[1]
    diag[impl] = while_loop_diagnostic(
      impl_loss, params, host, batch_size=b, local_steps=tau, lr=FLAGS.lr, seed=FLAGS.seed
    )
    print(
      f"while-loop diagnostic, conv_impl={impl} (ms/step): single "
      f"{diag[impl]['single_jitted_step_ms_per_step']:.0f}, rolled scan "
      f"{diag[impl]['rolled_scan_ms_per_step']:.0f}, unrolled scan "
      f"{diag[impl]['unrolled_scan_ms_per_step']:.0f}",
      flush=True,
    )

  fed = C.FedcoSide(
    problem, algorithm, host, rows, params, batch_size=b, rounds=FLAGS.rounds, seed=FLAGS.seed
  )
  unrolled = UnrolledSide(
    problem,
    algorithm,
    fed.data,
    params,
    batch_size=b,
    local_steps=tau,
    rounds=FLAGS.rounds,
    seed=FLAGS.seed,
  )
  torch_sides = {}
  tfed = TorchFedAvg(
    params, HostLoader(host, rows, b, FLAGS.seed + 1), k, tau, FLAGS.lr, filters, size
  )
  torch_sides["torch"] = (tfed, TorchSide(tfed, FLAGS.torch_rounds, os.cpu_count()))
  if FLAGS.torch_one_thread:
    tfed1 = TorchFedAvg(
      params, HostLoader(host, rows, b, FLAGS.seed + 1), k, tau, FLAGS.lr, filters, size
    )
    torch_sides["torch_1t"] = (tfed1, TorchSide(tfed1, FLAGS.torch_rounds, 1))
  central = CentralStepSide(
    problem, algorithm, host, params, batch=k * b, local_steps=tau, seed=FLAGS.seed
  )
  load_before = C.load_average()
  runs = {
    "fedco": fed.run,
    **{label: side.run for label, (_, side) in torch_sides.items()},
    "central": central.run,
    "fedco_unrolled": unrolled.run,
  }
  timed = C.alternate(runs, FLAGS.repeats, COMPILES)
  torch.set_num_threads(os.cpu_count())

  eval_x = {"x": jnp.asarray(host["x"][:500]), "y": jnp.asarray(host["y"][:500])}
  mean_loss = jax.jit(lambda p: jnp.mean(jax.vmap(loss, (None, 0))(p, eval_x)))
  sides = {
    "fedco": (FLAGS.rounds, fed.params()),
    **{label: (FLAGS.torch_rounds, tf.params()) for label, (tf, _) in torch_sides.items()},
    "central": (1, central.params()),
    "fedco_unrolled": (FLAGS.rounds, unrolled.params()),
  }
  rec = {
    "problem": problem.name,
    "algorithm": algorithm.name,
    "load_average": load_before,
    "initial_loss_client0": float(mean_loss(params)),
  }
  C.record_sides(
    rec,
    timed,
    sides,
    torch_sides,
    "final_loss_client0",
    mean_loss,
    compare=("fedco", "fedco_unrolled"),
  )
  rec["fedco"]["rounds_run"] = int(fed.state.round)
  rec["fedco_unrolled"]["rounds_run"] = unrolled.rounds_done
  rec["meets_torch_target"] = rec["fedco_over_torch_best"] >= TARGET_VS_TORCH
  rec["fedco_unrolled_meets_torch_target"] = (
    rec["fedco_unrolled_over_torch_best"] >= TARGET_VS_TORCH
  )
  print(
    f"fedco {rec['fedco']['rounds_per_s']:.4f} r/s, torch "
    + ", ".join(f"{label} {rec[label]['rounds_per_s']:.3f}" for label in torch_sides)
    + f" r/s, central {rec['central']['rounds_per_s']:.3f} r/s, fedco_unrolled "
    f"{rec['fedco_unrolled']['rounds_per_s']:.3f} r/s | fedco/best torch "
    f"{rec['fedco_over_torch_best']:.3f}x, fedco/central time "
    f"{rec['fedco_time_over_central']:.2f}x",
    flush=True,
  )

  out = {
    "benchmark": "torch_conv",
    "timestamp": C.timestamp(),
    "config": {
      "clients": k,
      "clients_per_round": k,
      "local_steps": tau,
      "batch_size": b,
      "central_batch_size": k * b,
      "examples_per_client": FLAGS.examples_per_client,
      "input": [size, size, CHANNELS],
      "model": f"CNN4(filters={filters}, norm='group', groups="
      f"{group_count(filters)}, conv_impl={FLAGS.conv_impl!r}), "
      f"{n_params} parameters",
      "conv_impl_resolved": resolve_impl(FLAGS.conv_impl),
      "algorithm": f"fedco.fedavg({FLAGS.lr}, {tau}) on fedco.plain(cross_entropy)",
      "fedco_rounds_per_repeat": FLAGS.rounds,
      "fedco_unrolled_rounds_per_repeat": FLAGS.rounds,
      "central_round_equivalents_per_repeat": 1,
      "torch_rounds_per_repeat": FLAGS.torch_rounds,
      "repeats": FLAGS.repeats,
      "statistic": "median over repeats; fedco, torch(, torch_1t), central and "
      "fedco_unrolled repeats alternate",
      "evaluate": False,
      "seed": FLAGS.seed,
      "torch_threads": {
        "torch": "torch.set_num_threads(os.cpu_count())",
        "torch_1t": "torch.set_num_threads(1)" if FLAGS.torch_one_thread else None,
      },
      "targets": {"fedco_over_torch_at_least": TARGET_VS_TORCH},
    },
    "machine": machine,
    "load_average_end": C.load_average(),
    "checks": checks,
    "while_loop_diagnostic": diag,
    "results": rec,
  }
  C.write_json(FLAGS.out, out)
  print()
  print(markdown_table(rec, checks, diag, b))
  print(f"\nwrote {FLAGS.out}")


if __name__ == "__main__":
  app.run(main)
