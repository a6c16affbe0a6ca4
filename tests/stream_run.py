"""A streaming run for tests/test_host.py: ``stream_run.py WORKDIR [CHECKPOINT]``.

FedDRO on the portfolio problem for many rounds in chunks of 3, every round evaluated and
streamed to ``WORKDIR/metrics.jsonl`` and ``metrics.csv``; with ``CHECKPOINT``, a
checkpoint every 12 rounds. Ctrl-C prints the one-line message and exits with 130.
"""

import os
import sys

import jax.numpy as jnp
import numpy as np

import fedco
from fedco.problems import portfolio
from fedco.runtime import host

ROUNDS, CHUNK, EVERY = 3000, 3, 12


def main(workdir, checkpoint=None, rounds=ROUNDS):
  rng = np.random.default_rng(0)
  data = fedco.FederatedData.from_clients(
    [
      {"r": rng.normal(0.2 * (k + 1), 1.0, size=(20 + 7 * k, 3)).astype(np.float32)}
      for k in range(4)
    ]
  )
  writers = [
    host.JsonlWriter(os.path.join(workdir, "metrics.jsonl")),
    host.CsvWriter(os.path.join(workdir, "metrics.csv")),
  ]
  return fedco.simulate(
    portfolio(1.0),
    fedco.feddro(0.01, 3, beta=0.5),
    data,
    jnp.zeros(3),
    rounds=rounds,
    seed=5,
    batch_size=4,
    chunk_rounds=CHUNK,
    checkpoint_dir=checkpoint,
    checkpoint_every=EVERY,
    metric_writers=writers,
    metric_labels={"algorithm": "feddro", "seed": 5},
  )


if __name__ == "__main__":
  try:
    main(*sys.argv[1:])
  except host.Interrupted as err:
    print(err, file=sys.stderr)
    sys.exit(130)
