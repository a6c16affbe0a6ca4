r"""The JAX sides of the peer comparison: fedco, and a DrJAX FedAvg program.

    python benchmarks/peers/jax_bench.py --peer=fedco --workload=logistic
    python benchmarks/peers/jax_bench.py --peer=drjax --workload=logistic

Same contract as the other peer programs (``workloads.py``): the last stdout line is the
JSON ``workloads.report``. Both sides use the same model, loss, data, batch size and rates.

* ``fedco``: ``fedco.Simulator(problem, fedco.fedavg(...), data, batch_size=...,
  evaluate=False)``: rounds, sampled clients, local steps and averaging in one jitted
  ``lax.scan``; ``round_seconds`` are ``run(state, rounds)`` timed as one call after a
  compiling call, divided evenly over its rounds (what one round costs in steady state).
  The compiling call runs the rounds too; the driver takes that second run
  (``duplicate_run_seconds``) off the whole-process time.
  ``--conv_impl`` picks CNN4's convolutions for ``cross_device`` (``auto``: im2col matrix
  products on the CPU; ``xla``: channel-last ``lax.conv_general_dilated``).
* ``drjax``: FedAvg as DrJAX's documentation writes it: a ``drjax.program`` over the
  ``clients`` placement that broadcasts the server model, ``map_fn``-s each client's local
  steps (a ``lax.scan`` of SGD steps on batches drawn on device) and ``reduce_mean``-s the
  models (the clients are equal-sized, so this is FedAvg's sample-weighted mean); one jitted program per round, called from a Python loop (DrJAX has no rounds
  loop), each round timed. Cross-device sampling draws the round's clients on the host.
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
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import workloads  # noqa: E402


def _model(workload, conv_impl, network="cnn4"):
  """``(loss(params, example), params)``: one example's loss and the initial model
  (``cross_device``: E2's CNN4, or with ``network="resnet20"`` E5's ResNet20)."""
  import fedco  # pylint: disable=g-import-not-at-top

  if workload == "cross_device":
    model = (
      fedco.models.ResNet20(num_classes=workloads.CLASSES, conv_impl=conv_impl)
      if network == "resnet20"
      else fedco.models.CNN4(
        num_classes=workloads.CLASSES, filters=32, norm="group", conv_impl=conv_impl
      )
    )

    def loss(params, example):  # the images in the parameters' dtype (mixed precision)
      image = example["x"].astype(jax.tree.leaves(params)[0].dtype) / 255.0
      return fedco.models.cross_entropy(model.apply(params, image), example["y"])

    return loss, fedco.models.init_cnn(model, workloads.IMAGE, 0)

  def loss(params, example):
    logits = params["w"] @ example["x"] + params["b"]
    return jax.nn.logsumexp(logits) - logits[example["y"]]

  return loss, {
    "w": jnp.zeros((workloads.CLASSES, workloads.FEATURES)),
    "b": jnp.zeros((workloads.CLASSES,)),
  }


def simulator(workload, conv_impl="auto", network="cnn4", compute_dtype="float32"):
  """``(fedco.Simulator, initial params)`` of ``workload`` as fedco's side runs it
  (``network``: the cross-device model, ``cnn4`` or ``resnet20``; ``compute_dtype``: the
  local steps' arithmetic, :func:`fedco.problems.mixed_precision`)."""
  import fedco  # pylint: disable=g-import-not-at-top

  w = workloads.WORKLOADS[workload]
  arrays = workloads.data(workload)
  arrays["y"] = arrays["y"].astype(np.int32)
  clients = [
    {k: v[workloads.client_rows(workload, c)] for k, v in arrays.items()}
    for c in range(w.num_clients)
  ]
  data = fedco.FederatedData.from_clients(clients)
  loss, params = _model(workload, conv_impl, network)
  if workload == "feddro":
    problem = fedco.problems.client_kl_dro_log(loss, workloads.FEDDRO_GAMMA, w.num_clients)
    algorithm = fedco.feddro(w.learning_rate, w.local_steps, beta=workloads.FEDDRO_BETA)
    data = data.with_owner()
  else:
    problem = fedco.plain(loss)
    algorithm = fedco.fedavg(w.learning_rate, w.local_steps, weighting="samples")
  sim = fedco.Simulator(
    fedco.problems.mixed_precision(problem, compute_dtype),
    algorithm,
    data,
    batch_size=w.batch_size or None,
    clients_per_round=w.clients_per_round,
    evaluate=False,
  )
  return sim, params


def run_fedco(workload, rounds, conv_impl):
  import fedco  # pylint: disable=g-import-not-at-top

  sim, params = simulator(workload, conv_impl)
  state = sim.init(params, 0)
  compiled, _ = sim.run(state, rounds)  # compiles the program for this many rounds
  jax.block_until_ready(compiled)
  setup = time.perf_counter() - START
  start = time.perf_counter()
  final, _ = sim.run(state, rounds)
  jax.block_until_ready(final)
  seconds = time.perf_counter() - start
  # The first call compiled *and* ran the rounds: a program that ran them once would end
  # ``seconds`` earlier, so the driver subtracts them from this process's wall time.
  extra = {
    "compile_and_first_call_seconds": setup,
    "conv_impl": conv_impl,
    "duplicate_run_seconds": seconds,
  }
  if workload == "check":
    extra["final_params"] = jax.tree.map(lambda a: np.asarray(a).tolist(), final.server["params"])
  return workloads.report(
    "fedco", fedco.__version__, workload, [seconds / rounds] * rounds, setup, **extra
  )


def run_drjax(workload, rounds):
  import drjax  # pylint: disable=g-import-not-at-top

  w = workloads.WORKLOADS[workload]
  if workload == "feddro":
    raise ValueError("drjax has no algorithms: only FedAvg is written for it here")
  arrays = workloads.data(workload)
  x = jnp.asarray(arrays["x"].reshape((w.num_clients, w.per_client) + arrays["x"].shape[1:]))
  y = jnp.asarray(arrays["y"].reshape(w.num_clients, w.per_client).astype(np.int32))
  loss, params = _model(workload, "auto")
  m = w.clients_per_round
  batch_loss = lambda p, xb, yb: jnp.mean(jax.vmap(loss, (None, 0))(p, {"x": xb, "y": yb}))
  grad = jax.grad(batch_loss)

  def local_train(model, client_x, client_y, key):
    def step(model, key):
      if w.batch_size:
        rows = jax.random.randint(key, (w.batch_size,), 0, w.per_client)
        xb, yb = client_x[rows], client_y[rows]
      else:
        xb, yb = client_x, client_y
      g = grad(model, xb, yb)
      return jax.tree.map(lambda p, d: p - w.learning_rate * d, model, g), None

    model, _ = jax.lax.scan(step, model, jax.random.split(key, w.local_steps))
    return model

  @jax.jit  # drjax.program patches the API in; the jit is the user's (as DrJAX's examples)
  @drjax.program(placements={"clients": m})
  def fedavg_round(server, client_x, client_y, keys):
    models = drjax.broadcast(server)
    trained = drjax.map_fn(local_train, (models, client_x, client_y, keys))
    return drjax.reduce_mean(trained)  # equal client sizes: the sample-weighted mean

  rng = np.random.default_rng(0)
  key = jax.random.PRNGKey(0)
  round_seconds, setup = [], None
  for r in range(rounds + 1):  # round 0 compiles; it is not timed
    start = time.perf_counter()
    ids = np.sort(rng.choice(w.num_clients, m, replace=False)) if m < w.num_clients else None
    cx, cy = (x, y) if ids is None else (x[ids], y[ids])
    key, sub = jax.random.split(key)
    new = fedavg_round(params, cx, cy, jax.random.split(sub, m))
    jax.block_until_ready(new)
    if r == 0:
      setup = time.perf_counter() - START
    else:
      params = new
      round_seconds.append(time.perf_counter() - start)
  extra = {}
  if workload == "check":
    extra["final_params"] = jax.tree.map(lambda a: np.asarray(a).tolist(), params)
  from importlib import metadata  # pylint: disable=g-import-not-at-top

  return workloads.report(
    "drjax", metadata.version("drjax"), workload, round_seconds, setup, **extra
  )


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--peer", choices=("fedco", "drjax"), required=True)
  parser.add_argument("--workload", choices=sorted(workloads.WORKLOADS), required=True)
  parser.add_argument("--rounds", type=int, default=None)
  parser.add_argument("--conv_impl", choices=("auto", "matmul", "xla"), default="auto")
  args = parser.parse_args()
  rounds = args.rounds or workloads.WORKLOADS[args.workload].rounds
  if args.peer == "fedco":
    out = run_fedco(args.workload, rounds, args.conv_impl)
  else:
    out = run_drjax(args.workload, rounds)
  print(json.dumps(out))


if __name__ == "__main__":
  main()
