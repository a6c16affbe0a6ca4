"""Every registry algorithm, chained with optax transforms around its injected form, runs in
``fedco.simulate`` with its communication plan and equals the plain algorithm.

(Apart from ``tests/test_contract.py`` so that pytest-xdist runs this one large compilation
beside the other contract tests.)
"""

import functools

import chex
import jax.numpy as jnp
import numpy as np
import pytest

import fedco
from fedco.runtime import uplink
from tests import mesh_check, registry

LABELS = sorted(registry.CASES)


# The uplink's pass-through branches depend on the kinds of fields a plan sends, not on the
# algorithm: one of each (model only, every-step, every-round, round-start, reduced
# round-start, round-start loss with reports and an aggregator, a snapshot report with loss
# queries, private per-client state, per-example weights, a server aggregator over control
# variates), which keeps the one program's compilation affordable.
UPLINK_LABELS = (
  "fedavg",
  "feddro",
  "ds_feddro",
  "mbsgd",
  "comfedl",
  "qfedavg",
  "drfa",
  "ditto",
  "primal_dual_dro",
  "scaffold",
  "gcivr",
)
# An uplink with no codec and no clip bound: every field takes its pass-through branch.
_NOTHING_TO_ENCODE = uplink.Uplink(
  codecs={},
  clip={},
  noise_multiplier=0.0,
  privacy=None,
  messages={},
  sampling_rate=0.3,
  server_reads_each=False,
)


@functools.lru_cache(maxsize=None)
def _simulated_pairs():
  """Every registry configuration as it is, chained with inactive clips around its
  injected form, and with an uplink that encodes nothing, traced into one program (``mesh_check.compile_all``, no evaluation):
  4 rounds of 3 sampled clients out of 10."""
  rng = np.random.default_rng(0)
  clients = [
    {"r": rng.normal(0.1 * k, 1.0, size=(4 + 3 * k, 3)).astype(np.float32)} for k in range(10)
  ]
  data = fedco.FederatedData.from_clients(clients)
  rows = sum(4 + 3 * k for k in range(10))
  configs = []
  for label in LABELS:
    kw = registry.kwargs(label, local_steps=3, num_examples=rows)
    alg = registry.factory(label)(**kw)
    composed = fedco.chain(
      registry.inactive_clip(),
      fedco.inject_hyperparams(registry.factory(label))(**kw),
      registry.inactive_clip(),
    )
    problem = registry.problem_for(alg)
    configs += [(f"{label}_plain", problem, alg, 3), (f"{label}_composed", problem, composed, 3)]
    if label in UPLINK_LABELS:
      configs.append((f"{label}_uplink", problem, alg, 3, {"uplink": _NOTHING_TO_ENCODE}))
  outputs, _ = mesh_check.compile_all(
    configs, data, None, x0=jnp.full((3,), 0.1), seed=3, rounds=4, batch_size=4, evaluate=False
  )
  return {c[0]: out[0] for c, out in zip(configs, outputs)}


@pytest.mark.parametrize("label", LABELS)
def test_chained_and_injected_algorithms_run_in_simulate_with_their_plan(label):
  runs = _simulated_pairs()
  plain, composed = runs[f"{label}_plain"], runs[f"{label}_composed"]
  assert float(np.max(np.abs(np.asarray(plain.server["params"]) - 0.1))) > 1e-2
  chex.assert_trees_all_close(
    composed.server["params"], plain.server["params"], rtol=1e-5, atol=1e-6
  )
  chex.assert_trees_all_close(composed.server, plain.server, rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(composed.shared, plain.shared, rtol=1e-5, atol=1e-6)
  assert int(composed.round) == int(plain.round) == 4


def test_the_uplink_with_nothing_to_encode_is_the_plain_path_bit_for_bit():
  """A configuration of every kind of plan with an uplink that handles no field (no codec,
  no clip bound: the branches a run with ``compression`` or ``privacy`` takes, each field
  passed through) ends in exactly the state of the plain run, every leaf's bytes. Compared
  in one process: bit-identity holds on one machine, not across CPU models."""
  runs = _simulated_pairs()
  assert set(UPLINK_LABELS) <= set(LABELS)
  for label in UPLINK_LABELS:
    chex.assert_trees_all_equal(runs[f"{label}_uplink"], runs[f"{label}_plain"])
