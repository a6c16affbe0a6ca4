"""One local epoch per client (``local_epochs``) and clients run a chunk at a time
(``client_chunk``): decision 101."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedco
from fedco.runtime.batching import ClientView, epoch_draw

COUNTS = (1, 3, 7, 12, 5)  # at batch 2: 1, 2, 4, 6 and 3 steps an epoch
QUADRATIC = fedco.plain(lambda x, e: 0.5 * jnp.sum((x - e["t"]) ** 2))


def _data(counts=COUNTS, seed=0):
  rng = np.random.default_rng(seed)
  return fedco.FederatedData.from_clients(
    [{"t": rng.normal(size=(n, 2)).astype(np.float32)} for n in counts]
  )


def _epoch_rows(key, start, count, batch, max_count, steps, row_list):
  """The rows (weight > 0) and weights of a client's first ``steps`` epoch batches."""
  examples = {"i": jnp.arange(row_list.size)}
  view = ClientView(examples, jnp.array(start), jnp.array(count), jnp.asarray(row_list))
  draw = jax.jit(lambda t: epoch_draw(key, view, batch, max_count, t, return_rows=True))
  out = []
  for t in range(steps):
    b, w, rows = draw(t)
    np.testing.assert_array_equal(np.asarray(b["i"]), np.asarray(rows))
    out.append((np.asarray(rows), np.asarray(w)))
  return out


def test_every_row_is_used_exactly_once_per_epoch_in_a_fresh_shuffle():
  # a client of 7 rows at positions 4..10 of a shuffled row list; batch 3: 3 batches an
  # epoch (3, 3 and the remainder 1)
  row_list = np.random.default_rng(1).permutation(16)
  own = set(row_list[4:11].tolist())
  batches = _epoch_rows(jax.random.PRNGKey(3), 4, 7, 3, 12, 6, row_list)
  epochs = []
  for e in range(2):
    used = []
    for rows, w in batches[3 * e : 3 * e + 3]:
      assert w.shape == (3,) and np.isclose(w.sum(), 1.0)
      size = int((w > 0).sum())
      np.testing.assert_allclose(w[w > 0], 1.0 / size)
      used.extend(rows[w > 0].tolist())
    assert [int((w > 0).sum()) for _, w in batches[3 * e : 3 * e + 3]] == [3, 3, 1]
    assert sorted(used) == sorted(own)  # each of its rows once, no other client's
    epochs.append(used)
  assert epochs[0] != epochs[1]  # a fresh shuffle per epoch


def test_epoch_shuffles_are_uniform():
  """Over many keys each row is first in the shuffle about equally often."""
  view = ClientView({"i": jnp.arange(8)}, jnp.array(0), jnp.array(5))
  first = jax.jit(jax.vmap(lambda k: epoch_draw(k, view, 1, 8, 0, return_rows=True)[2][0]))(
    jax.random.split(jax.random.PRNGKey(0), 5000)
  )
  freq = np.bincount(np.asarray(first), minlength=8) / 5000
  np.testing.assert_allclose(freq[:5], 0.2, atol=0.03)
  assert freq[5:].sum() == 0


def test_one_local_epoch_in_the_simulator_uses_each_row_once():
  """A linear loss -x.e_i on one-hot examples: after one round of FedAvg at rate 1, each
  coordinate is 1/m times 1/(the size of the batch that held row i): a missing or repeated
  row would show as 0 or a doubled coefficient."""
  counts, batch = (1, 3, 7, 12, 5), 3
  total = sum(counts)
  eye = np.eye(total, dtype=np.float32)
  starts = np.cumsum((0,) + counts)
  data = fedco.FederatedData.from_clients(
    [{"t": eye[starts[k] : starts[k + 1]]} for k in range(len(counts))]
  )
  problem = fedco.plain(lambda x, e: -jnp.dot(x, e["t"]))
  cap = fedco.runtime.epoch_steps(data, batch)
  res = fedco.simulate(
    problem,
    fedco.fedavg(1.0, cap, weighting="uniform"),
    data,
    jnp.zeros(total),
    rounds=1,
    batch_size=batch,
    local_epochs=1,
    evaluate=False,
  )
  np.testing.assert_array_equal(res.metrics["local_steps"][0], [1, 1, 3, 4, 2])
  coef = np.asarray(res.params) * len(counts)
  for k, n in enumerate(counts):
    mine = np.sort(coef[starts[k] : starts[k + 1]])
    rest = n % batch
    want = np.sort([1.0 / max(rest, 1)] * rest + [1.0 / batch] * (n - rest))
    np.testing.assert_allclose(mine, want, rtol=1e-6)


def test_epoch_steps_and_the_cap_warning():
  data = _data()
  assert fedco.runtime.epoch_steps(data, 2) == 6
  assert fedco.runtime.epoch_steps(data, 2, local_epochs=3) == 18
  with pytest.raises(ValueError, match="local_epochs"):
    fedco.runtime.epoch_steps(data, 2, 0)
  with pytest.warns(
    UserWarning,
    match=r"cuts the 1 local epoch\(s\) of 2 of 5 clients.*"
    r"local_steps=6",
  ) as seen:
    fedco.Simulator(QUADRATIC, fedco.fedavg(0.1, 3), data, batch_size=2, local_epochs=1)
  assert len(seen) == 1 and "\n" not in str(seen[0].message)
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # a cap every client fits in: no warning
    fedco.Simulator(QUADRATIC, fedco.fedavg(0.1, 6), data, batch_size=2, local_epochs=1)


@pytest.mark.parametrize(
  "kwargs,match",
  [
    (dict(local_epochs=0), "local_epochs must be"),
    (dict(local_epochs=1.0), "local_epochs must be"),
    (dict(local_epochs=True), "local_epochs must be"),
    (dict(local_epochs=1, batch_size=None), "local_epochs=1 needs batch_size"),
    (dict(local_epochs=1, outer_batch_size=3), "outer_batch_size must equal batch_size=2"),
    (dict(client_chunk=0), "client_chunk must be"),
    (dict(client_chunk=6), "client_chunk must be"),
    (dict(client_chunk=3, clients_per_round=2), "client_chunk must be"),
    (dict(client_chunk=2, mesh="mesh"), "client_chunk=2 runs a round's clients on one device"),
  ],
)
@pytest.mark.filterwarnings("ignore:batch_size=2 is larger than the smallest client")
def test_bad_epoch_and_chunk_arguments_are_one_line_errors(kwargs, match):
  if kwargs.get("mesh") == "mesh":
    kwargs["mesh"] = fedco.runtime.client_mesh(1)
  kwargs = {"batch_size": 2, **kwargs}
  with pytest.raises(ValueError, match=match) as err:
    fedco.Simulator(QUADRATIC, fedco.fedavg(0.1, 6), _data(), **kwargs)
  assert "\n" not in str(err.value)


def test_client_chunk_refuses_every_step_fields():
  data = _data((4, 6, 5, 4))
  problem = fedco.problems.client_kl_dro_log(
    lambda w, e: jnp.sum((w - e["t"]) ** 2), gamma=1.0, num_clients=4
  )
  with pytest.raises(ValueError, match=r"client_chunk=2 .*every_step fields \['y'\]"):
    fedco.Simulator(problem, fedco.feddro(0.1, 2), data.with_owner(), batch_size=2, client_chunk=2)


# (algorithm, simulator options): FedAvg, SCAFFOLD and FedAdam, with and without
# local_epochs, with stragglers and dropouts, and through a codec at round end.
CASES = {
  "fedavg-epoch": (fedco.fedavg(0.2, 6), dict(local_epochs=1)),
  "fedavg-faults": (fedco.fedavg(0.2, 5), dict(straggler_prob=0.6, participation=0.8)),
  "fedavg-2epochs-faults": (fedco.fedavg(0.2, 12), dict(local_epochs=2, straggler_prob=0.5)),
  "scaffold-epoch-faults": (fedco.scaffold(0.2, 6), dict(local_epochs=1, straggler_prob=0.5)),
  "fedadam-epoch": (fedco.fedadam(0.2, 6, server_lr=0.05), dict(local_epochs=1)),
  "fedavg-epoch-quantized": (
    fedco.fedavg(0.2, 6),
    dict(local_epochs=1, compression={"params": fedco.compression.stochastic_quantization(4)}),
  ),
}


def _run(alg, chunk, **kwargs):
  return fedco.simulate(
    QUADRATIC,
    alg,
    _data(),
    jnp.array([0.5, -0.5]),
    rounds=3,
    batch_size=2,
    clients_per_round=5,
    client_chunk=chunk,
    seed=4,
    evaluate=False,
    **kwargs,
  )


@pytest.mark.parametrize("case", sorted(CASES))
def test_chunked_clients_equal_the_vmapped_round(case):
  alg, kwargs = CASES[case]
  base = _run(alg, None, **kwargs)
  chunked = _run(alg, 2, **kwargs)  # chunks of 2, 2 and 1 clients, sorted by steps
  steps = base.metrics["local_steps"]
  assert len(np.unique(steps)) >= 3  # clients of a chunk differ in their step counts
  np.testing.assert_array_equal(chunked.metrics["local_steps"], steps)
  for a, b in zip(jax.tree.leaves(base.state), jax.tree.leaves(chunked.state)):
    if jnp.issubdtype(jnp.asarray(a).dtype, jnp.floating):
      np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6)
    else:
      np.testing.assert_array_equal(np.asarray(b), np.asarray(a))


def test_local_steps_are_each_clients_epochs_and_chunks_stop_at_their_own():
  with pytest.warns(UserWarning, match="cuts the 1 local epoch"):  # client 3's 6 steps, to 5
    res = _run(fedco.fedavg(0.2, 5), 2, local_epochs=1)
  want = np.minimum(5, np.ceil(np.array(COUNTS) / 2))
  np.testing.assert_array_equal(res.metrics["local_steps"], np.tile(want, (3, 1)))
  # FedAvg's state counts the steps each client took: 3 rounds of its own steps each
  np.testing.assert_array_equal(np.asarray(res.state.clients.count), 3 * want)


def test_stragglers_take_the_fewer_of_their_draw_and_their_epochs():
  res = _run(fedco.fedavg(0.2, 6), 1, local_epochs=1, straggler_prob=0.7)
  steps = res.metrics["local_steps"]
  epochs = np.ceil(np.array(COUNTS) / 2)
  assert np.all((steps >= 1) & (steps <= epochs)) and np.any((steps < epochs) & (epochs > 1))
  np.testing.assert_array_equal(np.asarray(res.state.clients.count), steps.sum(0))
