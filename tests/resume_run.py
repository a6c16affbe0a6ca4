"""A checkpointed run for tests/test_checkpoint.py: ``resume_run.py ALGORITHM DIR OUT.npz``.

Runs 1500 rounds with a checkpoint every 50 and saves the final model and metrics to
``OUT.npz``. Run it twice on one DIR (killed the first time) to test resumption.
``streamed``: SCAFFOLD on a plain problem, its clients read from a
:class:`fedco.data.ClientStore` written next to ``OUT`` (streamed runs evaluate through
``metrics_fn``).
"""

import os
import sys

import jax.numpy as jnp
import numpy as np

import fedco
from fedco.problems import portfolio

ROUNDS, EVERY = 1500, 50


def setup(name):
  rng = np.random.default_rng(0)
  clients = [
    {"r": rng.normal(0.2 * (k + 1), 1.0, size=(20 + 7 * k, 3)).astype(np.float32)} for k in range(4)
  ]
  data = fedco.FederatedData.from_clients(clients)
  algorithms = {
    "comfedl": (portfolio(1.0, kind="local"), fedco.comfedl(0.01, 3)),
    "local_scgdm": (
      portfolio(1.0, kind="local"),
      fedco.local_scgdm(1.0, 3, beta=0.01, alpha=0.8, gamma=0.7),
    ),
    "feddro": (portfolio(1.0), fedco.feddro(0.01, 3, beta=0.5)),
  }
  if name == "streamed":
    return fedco.plain(lambda x, e: jnp.sum((x - e["r"]) ** 2)), fedco.scaffold(0.01, 3), data
  problem, alg = algorithms[name]
  return problem, alg, data


def main(name, directory, out, checkpoint=True):
  problem, alg, data = setup(name)
  kwargs = {}
  if name == "streamed":
    path = out + ".store"
    store = fedco.data.ClientStore(path) if os.path.isdir(path) else None
    data = store or fedco.data.write_store(path, data)
    kwargs = dict(evaluate=False, metrics_fn=lambda x: {"objective": jnp.sum(x**2)})
  result = fedco.simulate(
    problem,
    alg,
    data,
    jnp.zeros(3),
    rounds=ROUNDS,
    seed=5,
    batch_size=4,
    clients_per_round=3,
    chunk_rounds=EVERY,
    checkpoint_dir=directory if checkpoint else None,
    checkpoint_every=EVERY,
    **kwargs,
  )
  np.savez(
    out,
    params=np.asarray(result.params),
    objective=result.metrics["objective"],
    clients=result.metrics["clients"],
  )


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2], sys.argv[3], checkpoint=sys.argv[2] != "-")
