"""FedJAX's side of the Shakespeare peer workloads (benchmarks/peers/fedjax_bench.py) does the
same work as fedco's (benchmarks/peers/fedco_shakespeare.py): the same sequences per client,
in the same client order, the same local steps per client, the same model size.

FedJAX lives in its own virtual environment (benchmarks/peers/requirements-fedjax.txt: it needs
jax 0.4.23, fedco a newer one), so its side runs as a subprocess with that environment's
python, named by ``FEDCO_FEDJAX_PYTHON``; skipped without it or without the shared TFF
Shakespeare files (``../shared/data/shakespeare_tff``). Nothing here compiles a model.
"""

import json
import math
import os
import sys

import numpy as np
import pytest

from tests import helpers

PEERS = helpers.ROOT / "benchmarks" / "peers"
FEDJAX_PYTHON = os.environ.get("FEDCO_FEDJAX_PYTHON")
CLIENTS = 12

sys.path.insert(0, str(PEERS))
import workloads  # noqa: E402

pytestmark = [
  pytest.mark.skipif(not FEDJAX_PYTHON, reason="FEDCO_FEDJAX_PYTHON (FedJAX's venv) not set"),
  pytest.mark.skipif(
    not os.path.isdir(workloads.shakespeare_dir()), reason="no shared Shakespeare data"
  ),
]

# Run in FedJAX's environment: its clients from fedco's sequences file, their steps, its
# model's size, and its own preprocessing's counts.
FEDJAX_SIDE = """
import json, sys
import jax
import numpy as np
sys.path.insert(0, {peers!r})
import fedjax_bench
data = fedjax_bench.federated_data(sequences={sequences!r})
ids = list(data.client_ids())
clients = {{cid: {{k: v.tolist() for k, v in ds.all_examples().items()}}
           for cid, ds in data.get_clients(ids)}}
steps = {{w: fedjax_bench.client_steps(data, w, ids) for w in ("shakespeare", "shakespeare_steps")}}
model, _ = fedjax_bench.algorithm("shakespeare")
params = model.init(jax.random.PRNGKey(0))
size = sum(int(np.size(a)) for a in jax.tree_util.tree_leaves(params))
own = fedjax_bench.federated_data(max_clients={clients})
own_rows = sum(len(ds) for _, ds in own.get_clients(own.client_ids()))
print(json.dumps({{"ids": ids, "clients": clients, "steps": steps, "params": size,
                  "own_rows": own_rows}}))
"""


@pytest.fixture(scope="module")
def fedco_data():
  import fedco  # pylint: disable=g-import-not-at-top

  return fedco.data.load_shakespeare_tff(workloads.shakespeare_dir(), max_clients=CLIENTS)


@pytest.fixture(scope="module")
def fedjax_side(fedco_data, tmp_path_factory):
  import fedco_shakespeare  # pylint: disable=g-import-not-at-top

  users = list(fedco_data.info["users"])
  path = str(tmp_path_factory.mktemp("fedjax") / "clients.json")
  fedco_shakespeare.write_schedule(path, [users[:6], users[6:]], fedco_data.train, users)
  script = FEDJAX_SIDE.format(peers=str(PEERS), sequences=path + ".npz", clients=CLIENTS)
  out = helpers.run(
    [FEDJAX_PYTHON, "-c", script],
    cwd=helpers.ROOT,
    env={k: v for k, v in os.environ.items() if k != "XLA_FLAGS"},  # flags jax 0.4.23 lacks
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert out.returncode == 0, out.stderr[-2000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_fedjax_clients_hold_fedcos_sequences(fedco_data, fedjax_side):
  users = list(fedco_data.info["users"])
  assert sorted(fedjax_side["ids"]) == sorted(users)
  train = fedco_data.train
  rows_of = np.asarray(train.flat_rows)
  for k, user in enumerate(users):
    rows = rows_of[train.offsets[k] : train.offsets[k] + train.counts[k]]
    for key in ("x", "y"):
      theirs = np.asarray(fedjax_side["clients"][user][key])
      np.testing.assert_array_equal(np.asarray(train.examples[key])[rows], theirs)


def test_both_sides_take_the_same_local_steps(fedco_data, fedjax_side):
  import fedco  # pylint: disable=g-import-not-at-top

  counts = dict(zip(fedco_data.info["users"], np.asarray(fedco_data.train.counts).tolist()))
  ids = fedjax_side["ids"]
  epoch = [math.ceil(counts[c] / workloads.WORKLOADS["shakespeare"].batch_size) for c in ids]
  assert fedjax_side["steps"]["shakespeare"] == epoch
  assert fedjax_side["steps"]["shakespeare_steps"] == [10] * len(ids)
  assert max(epoch) > min(epoch)  # the slice has clients of different sizes
  assert fedco.runtime.epoch_steps(fedco_data.train, 4) == max(epoch)  # fedco's cap


def test_fedjax_model_is_fedcos_size(fedjax_side):
  assert fedjax_side["params"] == 820_522  # fedco.models.ShakespeareLSTM's, as published


def test_fedjax_own_preprocessing_differs_from_tffs(fedco_data, fedjax_side):
  """Why the FedJAX side is given fedco's sequences: FedJAX joins a client's snippets
  before cutting rows, TFF (and fedco) pad each snippet, so they make fewer rows."""
  assert fedjax_side["own_rows"] < int(np.sum(fedco_data.train.counts))
