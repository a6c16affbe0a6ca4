"""Every registry algorithm, chained with optax transforms around its injected form, runs in
``fedco.simulate`` with its communication plan and equals the plain algorithm.

(Apart from ``tests/test_contract.py`` so that pytest-xdist runs this one large compilation
beside the other contract tests.)
"""

import functools
import hashlib
import json
import os

import chex
import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
import pytest

import fedco
from tests import mesh_check
from tests import registry

LABELS = sorted(registry.CASES)


@functools.lru_cache(maxsize=None)
def _simulated_pairs():
  """Every registry configuration as it is, and chained with inactive clips around its
  injected form, traced into one program (``mesh_check.compile_all``, no evaluation):
  4 rounds of 3 sampled clients out of 10."""
  rng = np.random.default_rng(0)
  clients = [{"r": rng.normal(0.1 * k, 1.0, size=(4 + 3 * k, 3)).astype(np.float32)}
             for k in range(10)]
  data = fedco.FederatedData.from_clients(clients)
  rows = sum(4 + 3 * k for k in range(10))
  configs = []
  for label in LABELS:
    kw = registry.kwargs(label, local_steps=3, num_examples=rows)
    alg = registry.factory(label)(**kw)
    composed = fedco.chain(registry.inactive_clip(),
                           fedco.inject_hyperparams(registry.factory(label))(**kw),
                           registry.inactive_clip())
    problem = registry.problem_for(alg)
    configs += [(f"{label}_plain", problem, alg, 3), (f"{label}_composed", problem, composed, 3)]
  outputs, _ = mesh_check.compile_all(configs, data, None, x0=jnp.full((3,), 0.1), seed=3,
                                      rounds=4, batch_size=4, evaluate=False)
  return {c[0]: out[0] for c, out in zip(configs, outputs)}


@pytest.mark.parametrize("label", LABELS)
def test_chained_and_injected_algorithms_run_in_simulate_with_their_plan(label):
  runs = _simulated_pairs()
  plain, composed = runs[f"{label}_plain"], runs[f"{label}_composed"]
  assert float(np.max(np.abs(np.asarray(plain.server["params"]) - 0.1))) > 1e-2
  chex.assert_trees_all_close(composed.server["params"], plain.server["params"],
                              rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(composed.server, plain.server, rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(composed.shared, plain.shared, rtol=1e-5, atol=1e-6)
  assert int(composed.round) == int(plain.round) == 4


def _digest(tree):
  h = hashlib.sha256()
  for a in jax.tree.leaves(tree):
    a = np.asarray(a)
    h.update(str(a.dtype).encode())
    h.update(np.ascontiguousarray(a).tobytes())
  return h.hexdigest()[:24]


def test_runs_without_compression_or_privacy_are_bit_identical_to_before_them():
  """The final states (every leaf's bytes) of every registry configuration equal those
  recorded before ``compression=`` / ``privacy=`` existed (``tests/data``, made with the
  commit before them on this jax); a different jax may round differently, so then skip."""
  with open(os.path.join(os.path.dirname(__file__), "data", "plain_run_digests.json")) as f:
    recorded = json.load(f)
  if (recorded["jax"], recorded["jaxlib"]) != (jax.__version__, jaxlib.__version__):
    pytest.skip(f"digests were recorded with jax {recorded['jax']}, this is {jax.__version__}")
  runs = _simulated_pairs()
  now = {label: _digest(runs[f"{label}_plain"]) for label in LABELS}
  assert now == recorded["digests"]
