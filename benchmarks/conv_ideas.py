r"""Convolutions for CNN4's cross-device round on the CPU: ideas against fedco's im2col (issue 31).

    python -m benchmarks.conv_ideas --out=benchmarks/results/conv_ideas.json   # about 4 min

Each candidate is a 3x3, stride-1, SAME convolution, NHWC / HWIO like
``fedco.models.layers.conv2d``:

* ``im2col``: fedco's ``conv_impl="matmul"`` (the CPU default): the 9 shifted windows
  concatenated, times the kernel as ``[9 C_in, C_out]``;
* ``winograd``: Winograd F(2x2, 3x3): each 4x4 input tile transformed (``B^T d B``, additions
  only), 16 ``[tiles, C_in] x [C_in, C_out]`` products with the transformed kernel
  (``G g G^T``) as one batched product, each 2x2 output tile transformed back (``A^T m A``):
  2.25x fewer multiplications than im2col, and 4 instead of 9 copies of the input;
* ``winograd_16``: the same with the 16 products written as 16 separate products (vmapped
  over the clients, a product with two batch axes runs far slower on XLA:CPU);
* ``patches``: ``lax.conv_general_dilated_patches`` for the windows, then one product;
* ``shift``: no window copy: the sum of 9 products, each shifted window ``[n H W, C_in]``
  times its tap's ``[C_in, C_out]``;
* ``rows3``: between the two: the 3 column shifts concatenated once (``3 C_in``), then the
  sum of 3 products over the row shifts.

First each candidate's values and first derivatives (input and kernel) are compared with
``lax.conv_general_dilated`` in float64 on small shapes. Then each CNN4 layer shape is timed
as the cross-device workload runs it: 50 client kernels vmapped, each client 5 SGD steps in a
``lax.scan`` on its 10 images, the model applied per example (as fedco's per-example losses
do); the candidates alternate, and the JSON holds every repeat, the medians, the ratios to
``im2col`` and the machine. ``--round`` also times the whole ``fedco.Simulator`` round of
``benchmarks/peers``' cross-device workload with CNN4's convolutions swapped for
``winograd_16``.
"""

from __future__ import annotations

import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from benchmarks import _common
from fedco.models import layers

FLAGS = flags.FLAGS
flags.DEFINE_integer("repeats", 5, "Timed calls per candidate and shape, alternating.")
flags.DEFINE_bool("round", True, "Also time the whole cross-device round (im2col, winograd).")
flags.DEFINE_string("out", "benchmarks/results/conv_ideas.json", "Where to write the JSON.")

SHAPES = ((32, 3), (16, 32), (8, 32))  # CNN4's (image side, input channels); 32 filters
CLIENTS, BATCH, STEPS = 50, 10, 5
ROUND_SIDES = ("im2col", "winograd_16")
_G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]])


def _input_transform(d):  # B^T applied to 4 slices of the rows (or columns) of a tile
  return [d[0] - d[2], d[1] + d[2], d[2] - d[1], d[1] - d[3]]


def winograd(x, kernel, split=False):
  """F(2x2, 3x3) for a 3x3 stride-1 SAME convolution (odd sides padded to the tiles); the 16
  products as one batched ``dot_general``, or (``split``) as 16 separate products."""
  n, h, w, c = x.shape
  out = kernel.shape[-1]
  th, tw = -(-h // 2), -(-w // 2)
  xp = jnp.pad(x, ((0, 0), (1, 2 * th + 1 - h), (1, 2 * tw + 1 - w), (0, 0)))
  v = []
  for r in _input_transform([xp[:, k : k + 2 * th - 1 : 2] for k in range(4)]):
    v += _input_transform([r[:, :, k : k + 2 * tw - 1 : 2] for k in range(4)])
  g = jnp.asarray(_G, kernel.dtype)
  u = jnp.einsum("ia,abco,jb->ijco", g, kernel, g).reshape(16, c, out)
  if split:  # kept as 16 arrays: stacking them costs a copy of every product
    m = [(vt.reshape(-1, c) @ ut).reshape(n, th, tw, out) for vt, ut in zip(v, u)]
  else:
    m = jnp.einsum("tpc,tco->tpo", jnp.stack(v).reshape(16, n * th * tw, c), u)
    m = list(m.reshape(16, n, th, tw, out))
  m = [m[4 * i : 4 * i + 4] for i in range(4)]  # A^T on the rows, then the columns
  s0 = [m[0][j] + m[1][j] + m[2][j] for j in range(4)]
  s1 = [m[1][j] - m[2][j] - m[3][j] for j in range(4)]
  rows = [(s[0] + s[1] + s[2], s[1] - s[2] - s[3]) for s in (s0, s1)]
  y = jnp.stack([jnp.stack(pair, -2) for pair in rows], 2)  # [n, th, 2, tw, 2, out]
  return y.reshape(n, 2 * th, 2 * tw, out)[:, :h, :w]


def patches(x, kernel):
  cols = jax.lax.conv_general_dilated_patches(
    x, (3, 3), (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
  )
  c, out = kernel.shape[2:]
  k = jnp.transpose(kernel, (2, 0, 1, 3)).reshape(9 * c, out)  # features ordered (C, kh, kw)
  return (cols.reshape(-1, 9 * c) @ k).reshape(*cols.shape[:3], out)


def shift(x, kernel):
  n, h, w, c = x.shape
  xp = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
  taps = [
    xp[:, a : a + h, b : b + w].reshape(-1, c) @ kernel[a, b] for a in range(3) for b in range(3)
  ]
  return sum(taps[1:], taps[0]).reshape(n, h, w, -1)


def rows3(x, kernel):
  n, h, w, c = x.shape
  xp = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
  cols = jnp.concatenate([xp[:, :, b : b + w] for b in range(3)], axis=-1)  # [n, h+2, w, 3c]
  rows = [cols[:, a : a + h].reshape(-1, 3 * c) @ kernel[a].reshape(3 * c, -1) for a in range(3)]
  return sum(rows[1:], rows[0]).reshape(n, h, w, -1)


_CONV2D = layers.conv2d  # fedco's, kept: the round's sides swap layers.conv2d

CANDIDATES = {
  "im2col": lambda x, k: _CONV2D(x, k, impl="matmul"),
  "winograd": winograd,
  "winograd_16": lambda x, k: winograd(x, k, split=True),
  "patches": patches,
  "shift": shift,
  "rows3": rows3,
}


def _reference(x, k):
  return jax.lax.conv_general_dilated(
    x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
  )


def check(conv) -> dict:
  """Largest float64 differences from ``lax.conv_general_dilated``: values, d/dx, d/dkernel."""
  rng = np.random.default_rng(0)
  worst = np.zeros(3)
  with jax.enable_x64(True):
    for shape in ((2, 8, 8, 3), (3, 7, 5, 4), (1, 1, 1, 2), (2, 6, 9, 5)):
      x, k = rng.normal(size=shape), rng.normal(size=(3, 3, shape[-1], 6))
      got = [conv(x, k), *jax.grad(lambda x, k: jnp.sum(jnp.sin(conv(x, k))), (0, 1))(x, k)]
      ref = [
        _reference(x, k),
        *jax.grad(lambda x, k: jnp.sum(jnp.sin(_reference(x, k))), (0, 1))(x, k),
      ]
      worst = np.maximum(worst, [float(jnp.max(jnp.abs(a - b))) for a, b in zip(got, ref)])
  return dict(zip(("values", "d_input", "d_kernel"), worst.tolist()))


def local_steps(conv):
  """50 client kernels, each 5 SGD steps on its 10 images, per-example model: one jit."""

  def loss(kernel, images):
    return jnp.sum(jax.vmap(lambda im: jnp.sum(jnp.tanh(conv(im[None], kernel))))(images))

  def client(kernel, images):
    step = lambda k, _: (k - 1e-3 * jax.grad(loss)(k, images), None)  # noqa: E731
    return jax.lax.scan(step, kernel, None, length=STEPS)[0]

  return jax.jit(jax.vmap(client))


def _layer_sides(side: int, channels: int):
  rng = np.random.default_rng(1)
  kernels = jnp.asarray(0.1 * rng.normal(size=(CLIENTS, 3, 3, channels, 32)), jnp.float32)
  images = jnp.asarray(rng.normal(size=(CLIENTS, BATCH, side, side, channels)), jnp.float32)
  fns = {name: local_steps(conv) for name, conv in CANDIDATES.items()}
  return {name: (lambda f=f: jax.block_until_ready(f(kernels, images))) for name, f in fns.items()}


def _round_sides():
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), "peers"))
  import jax_bench  # pylint: disable=g-import-not-at-top

  sides = {}
  for name in ROUND_SIDES:
    # CNN4's layers call layers.conv2d: swapped while this side's program is traced
    conv = CANDIDATES[name]
    original = layers.conv2d
    layers.conv2d = lambda x, k, strides=(1, 1), padding="SAME", impl="auto", c=conv: c(x, k)
    try:
      sim, params = jax_bench.simulator("cross_device", "matmul")
      state = {"s": sim.init(params, 0)}
      jax.block_until_ready(sim.run(state["s"], 1))  # traced and compiled with the swap
    finally:
      layers.conv2d = original

    def one_round(sim=sim, state=state):
      state["s"], metrics = sim.run(state["s"], 1)
      jax.block_until_ready((state["s"], metrics))

    sides[name] = one_round
  return sides


def _ratios(timed):
  base = timed["im2col"]["median_seconds"]
  return {name: t["median_seconds"] / base for name, t in timed.items()}


def main(argv):
  del argv
  out = {"machine": _common.machine_info(), "started": _common.timestamp()}
  out["checks_float64"] = {name: check(conv) for name, conv in CANDIDATES.items()}
  out["layers"] = {}
  for side, channels in SHAPES:
    timed = _common.alternate(_layer_sides(side, channels), FLAGS.repeats)
    key = f"{side}x{side}x{channels}"
    out["layers"][key] = {"timed": timed, "time_over_im2col": _ratios(timed)}
    print(key, {k: round(v, 2) for k, v in _ratios(timed).items()}, flush=True)
  if FLAGS.round:
    t = time.perf_counter()
    timed = _common.alternate(_round_sides(), FLAGS.repeats, warm=ROUND_SIDES)
    out["cross_device_round"] = {"timed": timed, "time_over_im2col": _ratios(timed)}
    out["cross_device_round"]["setup_seconds"] = time.perf_counter() - t
    print("round", {k: round(v, 2) for k, v in _ratios(timed).items()}, flush=True)
  out["load_average_end"] = _common.load_average()
  _common.write_json(FLAGS.out, out)


if __name__ == "__main__":
  app.run(main)
