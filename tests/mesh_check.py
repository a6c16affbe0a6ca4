"""Run every algorithm on one device and on an 8-device clients mesh; print max differences.

Executed by tests/test_mesh.py in a subprocess with
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (the flag must precede jax's import).
Prints one JSON line per (algorithm, participation) with the largest absolute difference of
the final model and of the objective trajectory.
"""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

import fedco
from fedco.problems import portfolio


def registry(num_rows=None):
  """``{name: (problem, algorithm)}``; ``num_rows`` sizes primal-dual DRO's row weights
  (default: this script's 10 clients)."""
  num_rows = NUM_ROWS if num_rows is None else num_rows
  plain = fedco.plain(lambda x, e: 0.5 * jnp.sum((x - e["r"]) ** 2) + 0.1 * jnp.sum(x ** 4))
  local, glob = portfolio(1.0, kind="local"), portfolio(1.0)
  return {
      "comfedl": (local, fedco.comfedl(0.1, 3)),
      "local_scgd": (local, fedco.local_scgd(0.1, 0.9, 3)),
      "local_scgdm": (local, fedco.local_scgdm(1.0, 0.1, 0.8, 0.7, 3)),
      "fedavg": (plain, fedco.fedavg(0.1, 3)),
      "fedavg_co_I": (glob, fedco.fedavg_co(0.1, 3, case="I")),
      "fedavg_co_II": (glob, fedco.fedavg_co(0.1, 3, case="II")),
      "fedavg_co_modified": (glob, fedco.fedavg_co(0.1, 3, case="modified")),
      "mbsgd": (glob, fedco.mbsgd(0.1)),
      "feddro": (glob, fedco.feddro(0.1, 0.5, 3)),
      "ds_feddro": (glob, fedco.ds_feddro(0.1, 0.5, 3)),
      "qfedavg": (plain, fedco.qfedavg(0.1, 3, q=0.5)),
      "drfa": (plain, fedco.drfa(0.1, 3, weights_lr=0.01)),
      "afl": (plain, fedco.afl(0.1, weights_lr=0.01)),
      "fastdro": (plain, fedco.fastdro(0.1, geometry="cvar", size=0.5, local_steps=3)),
      "primal_dual_dro": (plain, fedco.primal_dual_dro(0.1, num_rows, weights_lr=0.01)),
      "ditto": (plain, fedco.ditto(0.1, 0.1, 3)),
      "per_fedavg": (local, fedco.per_fedavg(0.1, 3)),
      "tr_maml": (local, fedco.tr_maml(0.1, 0.05, 3)),
  }


NUM_ROWS = sum(4 + 3 * k for k in range(10))  # the clients' rows in main()
SAMPLED = ("comfedl", "feddro", "mbsgd", "drfa", "primal_dual_dro", "tr_maml")  # averaging, every-step, round-start, aggregator


def main():
  assert jax.device_count() == 8, jax.devices()
  rng = np.random.default_rng(0)
  clients = [{"r": rng.normal(0.1 * k, 1.0, size=(4 + 3 * k, 3)).astype(np.float32)}
             for k in range(10)]
  data = fedco.FederatedData.from_clients(clients)
  mesh = fedco.runtime.client_mesh(8)
  names = sys.argv[1:] or list(registry())
  for name in names:
    problem, alg = registry()[name]
    # 10 clients -> 16 slots for all; 3 sampled -> 8 slots for one algorithm per server kind
    for m in ((None, 3) if name in SAMPLED else (None,)):
      runs = [fedco.simulate(problem, alg, data, jnp.full((3,), 0.1), rounds=4, seed=3,
                             batch_size=4, clients_per_round=m, mesh=mesh_)
              for mesh_ in (None, mesh)]
      one, eight = runs
      print(json.dumps({
          "algorithm": name, "clients_per_round": m,
          "params": float(np.max(np.abs(np.asarray(one.params) - np.asarray(eight.params)))),
          "objective": float(np.max(np.abs(one.metrics["objective"] -
                                           eight.metrics["objective"]))),
          "same_clients": bool(np.array_equal(one.metrics["clients"],
                                              eight.metrics["clients"])),
          "moved": float(np.max(np.abs(np.asarray(one.params) - 0.1))),
      }), flush=True)


if __name__ == "__main__":
  main()
