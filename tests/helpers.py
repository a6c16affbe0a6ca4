"""Small shared fixtures for the test suite."""

import os

import jax.numpy as jnp
import numpy as np

import fedco


def portfolio_clients(sizes=(24, 8, 40), d=3, seed=0):
  """Per-client returns with different means, so clients are heterogeneous."""
  rng = np.random.default_rng(seed)
  return [
    (rng.normal(0.2 * (k + 1), 1.0, size=(n, d))).astype(np.float32) for k, n in enumerate(sizes)
  ]


def full_batch_args(problem, examples):
  """``(grad_h_fn, kwargs)`` for a deterministic full-batch oracle on one data set."""
  return fedco.oracle_args(problem, examples, examples, examples)


def as_np(tree):
  return (
    np.asarray(tree, np.float64)
    if not isinstance(tree, dict)
    else {k: np.asarray(v, np.float64) for k, v in tree.items()}
  )


def tanh_problem_data(sizes=(3, 5, 8), d=3, p=2, seed=0):
  rng = np.random.default_rng(seed)
  return [
    {
      "A": rng.normal(size=(n, p, d)).astype(np.float32),
      "c": rng.normal(size=(n, p)).astype(np.float32),
      "b": (0.3 * rng.normal(size=(n, d))).astype(np.float32),
    }
    for n in sizes
  ]


def zeros(d):
  return jnp.zeros((d,), jnp.float32)


def override(config, changes):
  """``config`` with ``changes`` (dotted keys, ``"methods.fedavg.q"``) applied, new fields
  allowed; returns ``config``."""
  with config.unlocked():
    for key, value in changes.items():
      *parents, last = key.split(".")
      node = config
      for part in parents:
        node = node[part]
      node[last] = value
  return config


# ---- heterogeneous least squares (SCAFFOLD, FedProx, adaptive servers) --------------------

LSQ_DIM = 4
LEAST_SQUARES = fedco.plain(lambda x, e: 0.5 * (e["a"] @ x - e["b"]) ** 2)


def least_squares_clients(sizes, *, spread=3.0, seed=0):
  """Per-client ``{a: [n, D], b: [n]}`` in float64, each client with its own optimum
  (``spread`` times a standard normal): far apart, so FedAvg's client drift shows."""
  rng = np.random.default_rng(seed)
  clients = []
  for n in sizes:
    a = rng.normal(size=(n, LSQ_DIM))
    x_star = spread * rng.normal(size=LSQ_DIM)
    clients.append({"a": a, "b": a @ x_star + 0.1 * rng.normal(size=n)})
  return clients


def least_squares_grad(client, x):
  """``grad h_i(x) = A^T (A x - b) / n`` in float64."""
  a, b = client["a"], client["b"]
  return a.T @ (a @ x - b) / a.shape[0]


def xla_flags(device_count):
  """This process's ``XLA_FLAGS`` (conftest.py's compile settings) for a subprocess, with
  ``--xla_force_host_platform_device_count=N`` in place of any device count, or without
  one when ``device_count`` is ``0``."""
  flags = [
    f
    for f in os.environ.get("XLA_FLAGS", "").split()
    if not f.startswith("--xla_force_host_platform_device_count")
  ]
  if device_count:
    flags.append(f"--xla_force_host_platform_device_count={device_count}")
  return " ".join(flags)
