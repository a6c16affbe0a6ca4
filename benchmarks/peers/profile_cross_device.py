r"""Where fedco's cross-device round goes (issue 17's profile), fedco's environment only.

    python benchmarks/peers/profile_cross_device.py > benchmarks/results/peers_profile.json

Times, on the cross-device workload (50 sampled clients, 5 steps of batch 10, CNN4 with
im2col convolutions), the mean of 3 calls after a compiling one:

* ``fedco_round``: one round of ``fedco.Simulator`` (sampling, gathers, vmapped local
  steps, averaging);
* ``vmapped_50_models_5_steps``: a hand-written jitted program with the same arithmetic: 50
  client models vmapped over 5 SGD steps on fixed batches, no sampling or averaging: the
  floor of per-client models on XLA:CPU;
* ``one_model_pooled_batch_5_steps``: ONE model, 5 steps on the pooled 500-image batch:
  what the convolutions cost without per-client weights;
* the arithmetic floor: CNN4's multiply-adds per round (counted from the layer shapes:
  forward, weight gradients, input gradients but the first layer's) at the matrix-product
  speed this CPU reaches on the round's own im2col product (the second layer's
  ``[2560, 288] x [288, 32]`` per client, 50 clients vmapped), ``matmul_gflops``.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import jax
import jax.numpy as jnp
import jax_bench
import numpy as np
import workloads

import fedco
from benchmarks import _common

w = workloads.WORKLOADS["cross_device"]
arrays = workloads.data("cross_device")
arrays["y"] = arrays["y"].astype(np.int32)
loss, params = jax_bench._model("cross_device", "auto")
clients = [
  {k: v[workloads.client_rows("cross_device", c)] for k, v in arrays.items()}
  for c in range(w.num_clients)
]
sim = fedco.Simulator(
  fedco.plain(loss),
  fedco.fedavg(0.1, 5),
  fedco.FederatedData.from_clients(clients),
  batch_size=10,
  clients_per_round=50,
  evaluate=False,
)
state = sim.init(params, 0)


def timeit(fn, n=3):
  fn()
  t = time.perf_counter()
  for _ in range(n):
    fn()
  return (time.perf_counter() - t) / n


def round_():
  s, _ = sim.run(state, 1)
  jax.block_until_ready(s)


x = jnp.asarray(arrays["x"][:500])
y = jnp.asarray(arrays["y"][:500])


def batch_loss(p, xb, yb):
  return jnp.mean(jax.vmap(loss, (None, 0))(p, {"x": xb, "y": yb}))


@jax.jit
def central(p):  # 5 steps of ONE model on the pooled 500-image batch (50 clients x 10)
  def step(p, _):
    g = jax.grad(batch_loss)(p, x, y)
    return jax.tree.map(lambda a, b: a - 0.1 * b, p, g), None

  return jax.lax.scan(step, p, None, length=5)[0]


@jax.jit
def clients50(p):  # 5 steps of 50 client models, batch 10 each (vmapped), no fedco runtime
  xs, ys = x.reshape(50, 10, *x.shape[1:]), y.reshape(50, 10)

  def one(p, xb, yb):
    def step(p, _):
      g = jax.grad(batch_loss)(p, xb, yb)
      return jax.tree.map(lambda a, b: a - 0.1 * b, p, g), None

    return jax.lax.scan(step, p, None, length=5)[0]

  return jax.vmap(one, (None, 0, 0))(p, xs, ys)


def cnn4_flops_per_image_step(side=32, channels=3, filters=32, classes=10):
  """Floating-point operations of one image's SGD step through CNN4 (convolutions, dense)."""
  flops, c = 0, channels
  for block in range(4):
    conv = 2 * side * side * 9 * c * filters  # one forward product
    flops += conv * (2 if block == 0 else 3)  # + weight gradient (+ input gradient)
    side, c = side // 2, filters
  return flops + 3 * 2 * side * side * c * classes


k1, k2 = jax.random.split(jax.random.PRNGKey(0))
lhs = jax.random.normal(k1, (50, 2560, 288), jnp.float32)
rhs = jax.random.normal(k2, (50, 288, 32), jnp.float32)
product = jax.jit(jnp.matmul)
matmul_seconds = timeit(lambda: jax.block_until_ready(product(lhs, rhs)), n=10)
matmul_gflops = 2 * lhs.size * 32 / matmul_seconds / 1e9
round_flops = cnn4_flops_per_image_step() * 50 * 5 * 10  # clients x steps x batch

out = {
  "fedco_round": timeit(round_),
  "one_model_pooled_batch_5_steps": timeit(lambda: jax.block_until_ready(central(params))),
  "vmapped_50_models_5_steps": timeit(lambda: jax.block_until_ready(clients50(params))),
}

out.update(
  {
    "round_gflop": round_flops / 1e9,
    "matmul_gflops": matmul_gflops,
    "arithmetic_floor_seconds": round_flops / (matmul_gflops * 1e9),
    "load_average": list(os.getloadavg()),
    "jax": jax.__version__,
    "cpu_count": os.cpu_count(),
    "cpu_model": _common.machine_info()["cpu_model"],
  }
)
print(json.dumps(out))
