"""Clients streamed from a ClientStore: bit for bit the in-memory run, what it refuses, the
store's own checks. (A SIGKILLed streamed run resumes bit for bit: test_checkpoint.py.)"""

import json
import os
import signal
import tempfile
import time
import types

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedco
from fedco.algorithms.base import make_plan
from fedco.runtime import paging, streaming


def _clients(k=30, seed=0):
  rng = np.random.default_rng(seed)
  return [
    {
      "x": rng.normal(size=(int(n), 5)).astype(np.float32),
      "y": rng.integers(0, 3, int(n)).astype(np.int32),
    }
    for n in rng.integers(1, 9, k)
  ]


def _loss(p, e):
  logits = e["x"] @ p["w"] + p["b"]
  return jax.nn.logsumexp(logits) - logits[e["y"]]


def _metrics(p, d):
  losses = fedco.metrics.per_client_mean(_loss, p, d)
  return {"mean_loss": jnp.mean(losses), "worst_loss": jnp.max(losses)}


PARAMS = {"w": jnp.zeros((5, 3)), "b": jnp.zeros(3)}


@pytest.fixture(scope="module")
def data_and_store(tmp_path_factory):
  data = fedco.FederatedData.from_clients(_clients())
  return data, fedco.data.write_store(tmp_path_factory.mktemp("s") / "clients", data)


# Per-client state of each kind: an optimizer count (FedAvg), control variates (SCAFFOLD),
# personal models (Ditto), a codec's error feedback (top-k: the uplink's state).
CASES = {
  "fedavg": (fedco.fedavg, {}),
  "scaffold": (fedco.scaffold, {}),
  "ditto": (fedco.ditto, {}),
  "fedavg_top_k": (fedco.fedavg, {"compression": {"params": fedco.compression.top_k(0.5)}}),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("checkpoint_every", [3, 6])
def test_streamed_run_equals_the_in_memory_run_bit_for_bit(
  data_and_store, case, checkpoint_every, tmp_path
):
  """Every client's state too: on the device a streamed run holds only the last chunk's
  clients' state; the disk holds every sampled client's, each equal to the in-memory run's.
  Checkpoints every chunk (rows written to the files each chunk) or every second chunk
  (rows of the chunk between them read back from memory)."""
  data, store = data_and_store
  factory, options = CASES[case]
  alg = factory(0.1, 3)
  kwargs = dict(rounds=7, seed=3, batch_size=4, clients_per_round=5, evaluate=False)
  kwargs.update(chunk_rounds=3, metrics_fn=_metrics, metrics_data=data, **options)  # 3+3+1
  memory = fedco.simulate(fedco.plain(_loss), alg, data, PARAMS, **kwargs)
  ckpt = tmp_path / "ckpt"
  streamed = fedco.simulate(
    fedco.plain(_loss), alg, store, PARAMS, checkpoint_dir=ckpt,
    checkpoint_every=checkpoint_every, **kwargs,
  )  # fmt: skip
  pages = streamed.state.uplink if case.endswith("top_k") else streamed.state.clients
  assert isinstance(pages, fedco.runtime.Pages) and pages.ids.shape[0] < data.num_clients
  states = paging.StateStore.open(ckpt / "client_state", streamed.state)
  assert states.touched.sum() == np.unique(memory.metrics["clients"]).size < data.num_clients
  state = paging.unpaged(streamed.state, states)
  for a, b in zip(jax.tree.leaves(memory.state), jax.tree.leaves(state), strict=True):
    np.testing.assert_array_equal(a, b)
  for key in ("mean_loss", "worst_loss", "clients"):
    np.testing.assert_array_equal(memory.metrics[key], streamed.metrics[key], err_msg=key)


def test_without_checkpoints_client_state_lives_in_a_temporary_folder(
  data_and_store, tmp_path, monkeypatch
):
  """Applied to the files after every chunk, removed at the end; the run is the same."""
  data, store = data_and_store
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
  kwargs = dict(rounds=7, seed=3, batch_size=4, clients_per_round=5, evaluate=False)
  kwargs.update(chunk_rounds=2, metrics_fn=_metrics, metrics_data=data)
  seen = []
  action = fedco.runtime.RoundAction(
    lambda state, r: seen.append(os.listdir(tmp_path)), every_rounds=2
  )
  memory = fedco.simulate(fedco.plain(_loss), fedco.scaffold(0.1, 3), data, PARAMS, **kwargs)
  streamed = fedco.simulate(
    fedco.plain(_loss), fedco.scaffold(0.1, 3), store, PARAMS, actions=[action], **kwargs
  )
  assert seen and all(any(n.startswith("fedco-client-state-") for n in s) for s in seen)
  assert not os.listdir(tmp_path)
  np.testing.assert_array_equal(memory.params["w"], streamed.params["w"])
  np.testing.assert_array_equal(memory.metrics["mean_loss"], streamed.metrics["mean_loss"])


def test_client_state_on_disk_recovers_a_killed_checkpoint(tmp_path):
  """Killed after a checkpoint's journal was written but before its rows reached the files:
  reopened at that round, the journal is applied again; at an older round, undone; at a
  round no journal leads to, refused."""
  fresh = ({"a": np.zeros(2, np.float32)}, ())
  ids = np.array([1, 3, 5])
  rows = lambda v: ({"a": np.full((3, 2), v, np.float32)}, ())
  states = paging.StateStore(tmp_path / "s", fresh, 6, run="r")
  states.write(ids, rows(1.0))
  states.journal(4)
  states.apply(4)
  states.write(ids[:2], ({"a": np.full((2, 2), 2.0, np.float32)}, ()))
  states.journal(8)  # ... and killed here: the checkpoint of round 8 was then saved
  states.close()
  again = paging.StateStore(tmp_path / "s", fresh, 6, run="r", create=False)
  assert again.round == 4
  np.testing.assert_array_equal(again.read([1, 5])[0]["a"][:, 0], [1.0, 1.0])
  again.recover(8)
  got = again.read([0, 1, 3, 5, 6])[0]["a"][:, 0]  # 0 never sampled, 6 is padding: fresh
  np.testing.assert_array_equal(got, [0.0, 2.0, 2.0, 1.0, 0.0])
  again.close()
  reopened = paging.StateStore(tmp_path / "s", fresh, 6, run="r", create=False)
  with pytest.raises(ValueError, match="holds round 8, the checkpoint restored round 2"):
    reopened.recover(2)  # no checkpoint (no journal) of round 2
  reopened.recover(4)  # round 8's checkpoint lost: its journal undoes its rows
  np.testing.assert_array_equal(reopened.read([1, 3, 5])[0]["a"][:, 0], [1.0, 1.0, 1.0])
  reopened.close()
  with pytest.raises(ValueError, match="written by another run"):
    paging.StateStore(tmp_path / "s", fresh, 6, run="other", create=False)


def test_each_chunk_holds_only_its_clients_and_the_next_is_read_ahead(data_and_store):
  _, store = data_and_store
  sampled = streaming.schedule(jax.random.PRNGKey(0), store.num_clients, 4, rounds=6)
  assert sampled.shape == (6, 4) and (np.diff(sampled, axis=1) > 0).all()
  chunks = streaming.Chunks(store, sampled, chunk_rounds=2)
  per_round = store.counts[sampled].sum(1)
  assert chunks.capacity == max(per_round[i] + per_round[i + 1] for i in range(5))
  try:
    chunks.prefetch(2, 2)
    ahead = chunks._ahead[1]
    data = chunks.get(2, 2)
    assert ahead.done() and chunks._ahead is None  # served from the read-ahead
    ids = np.unique(sampled[2:4])
    assert data.examples["x"].shape[0] == chunks.capacity
    for k in ids:
      rows = data.flat_rows[data.offsets[k] : data.offsets[k] + data.counts[k]]
      np.testing.assert_array_equal(data.examples["x"][rows], store.read([k])["x"])
    np.testing.assert_array_equal(data.counts, store.counts)  # every client's weight
  finally:
    chunks.close()


@pytest.mark.parametrize(
  "kwargs, match",
  [
    ({}, r"does not support evaluate=True"),
    ({"evaluate": False, "exact_grad_norm": True}, "exact_grad_norm"),
  ],
)
def test_what_streaming_cannot_do_is_a_one_line_error(data_and_store, kwargs, match):
  _, store = data_and_store
  with pytest.raises(ValueError, match=match):
    fedco.simulate(fedco.plain(_loss), fedco.fedavg(0.1), store, PARAMS, rounds=2, **kwargs)
  with pytest.raises(ValueError, match=r"got ClientStore; clients on disk are streamed by fedco"):
    fedco.Simulator(fedco.plain(_loss), fedco.fedavg(0.1), store)
  with pytest.raises(ValueError, match=r"metrics_data must be a pytree .* got a ClientStore"):
    fedco.simulate(
      fedco.plain(_loss), fedco.fedavg(0.1), store, PARAMS, rounds=2, evaluate=False,
      metrics_fn=_metrics, metrics_data=store,
    )  # fmt: skip
  log_form = fedco.problems.client_kl_dro_log(_loss, 5.0, store.num_clients)
  with pytest.raises(ValueError, match=r"field 'client', which the data lack .*with_owner\(\)"):
    fedco.simulate(log_form, fedco.feddro(0.1), store, PARAMS, rounds=2, evaluate=False)
  problem = fedco.problems.client_kl_dro(_loss, 5.0)
  sent = fedco.local_scgd(0.1).replace(plan=make_plan(2, every_round=("u",), at_init=()))
  with pytest.raises(ValueError, match=r"sends but does not average at init \(state\.u: its"):
    fedco.simulate(problem, sent, store, PARAMS, rounds=2, evaluate=False)
  with pytest.raises(ValueError, match=r"per-example state \(num_examples"):
    fedco.simulate(
      fedco.plain(_loss),
      fedco.primal_dual_dro(0.1, num_examples=store.num_examples, weights_lr=0.1),
      store,
      PARAMS,
      rounds=2,
      evaluate=False,
    )


def test_trackers_are_found_by_the_at_init_field_above_them_however_nested():
  # a NamedTuple field, a chain, injected hyperparameters, a dict key, a tuple of trackers
  plan = fedco.extend.make_plan(2, every_round=("u",), at_init=("u",))
  pending = lambda: fedco.extend.pending_or(None, lambda v: v)
  shaped = lambda init: types.SimpleNamespace(
    problem=types.SimpleNamespace(compositional=True),
    algorithm=types.SimpleNamespace(init=init),
    plan=plan,
  )
  scgd = fedco.local_scgd(0.1, 2)
  for init in (
    scgd.init,
    fedco.chain(optax.clip_by_global_norm(1.0), scgd).init,
    fedco.inject_hyperparams(fedco.local_scgd)(0.1, 2).init,
    lambda p: {"u": pending(), "count": 0},
    lambda p: {"u": (pending(), pending())},
  ):
    assert streaming.pending_fields(shaped(init), PARAMS) == (("u",), ())
  assert streaming.pending_fields(shaped(lambda p: {"v": pending()}), PARAMS) == (
    (),
    ("state['v']",),
  )


# Compositional methods: trackers averaged at init (Local-SCGD: every_round u; FedDRO, global:
# every_step y, on the log form with each example's owner) and none (ComFedL).
COMPOSITIONAL = {  # (problem, factory, simulate's other arguments)
  "local_scgd": (lambda: fedco.problems.client_kl_dro(_loss, 5.0), fedco.local_scgd, {}),
  "feddro": (lambda: fedco.problems.client_kl_dro_log(_loss, 5.0, 30), fedco.feddro, {}),
  "comfedl": (lambda: fedco.problems.client_kl_dro(_loss, 5.0), fedco.comfedl, {}),
  # the initial y clipped per client (its values exceed the bound) and noised once
  "feddro_private": (
    lambda: fedco.problems.client_kl_dro_log(_loss, 5.0, 30),
    fedco.feddro,
    {"privacy": fedco.privacy.gaussian({"params": 1.0, "y": 0.5}, noise_multiplier=1.0)},
  ),
}


@pytest.mark.parametrize("case", sorted(COMPOSITIONAL))
def test_compositional_methods_stream_with_their_initial_means_from_one_pass(
  case, tmp_path, monkeypatch
):
  problem, factory, kwargs = COMPOSITIONAL[case]
  data = fedco.FederatedData.from_clients(_clients()).with_owner()
  store = fedco.data.write_store(tmp_path / "clients", data)
  # not zeros: at w = 0 every example's loss is log 3, so every client's g_k(x_0) is alike
  w = np.random.default_rng(2).normal(0, 0.5, (5, 3)).astype(np.float32)
  params = {"w": jnp.asarray(w), "b": jnp.zeros(3)}
  run = lambda source: fedco.simulate(
    problem(),
    factory(0.05, 3),
    source,
    params,
    rounds=6,
    seed=1,
    clients_per_round=7,
    batch_size=4,
    evaluate=False,
    chunk_rounds=2,
    **kwargs,
  )
  memory = run(data).state.server
  if case == "comfedl":  # no tracker from the data: no pass, equal bit for bit
    chex.assert_trees_all_equal(run(store).state.server, memory)
  # the means from one block of all 30 clients, and from blocks of 4: summed in other orders
  # than in memory, so equal to float round-off
  chex.assert_trees_all_close(run(store).state.server, memory, rtol=1e-5, atol=1e-7)
  monkeypatch.setattr(streaming, "INIT_BLOCK", 4)
  chex.assert_trees_all_close(run(store).state.server, memory, rtol=1e-5, atol=1e-7)


def test_store_round_trip_and_damage(tmp_path):
  clients = _clients(5, seed=1)
  store = fedco.data.write_store(tmp_path / "a", iter(clients))  # a generator, read once
  assert store.num_clients == 5 and store.counts.tolist() == [len(c["y"]) for c in clients]
  got = store.read([3, 0])
  np.testing.assert_array_equal(got["x"], np.concatenate([clients[3]["x"], clients[0]["x"]]))
  again = fedco.data.ClientStore(tmp_path / "a")
  assert again.digest == store.digest
  with pytest.raises(ValueError, match="not empty"):
    fedco.data.write_store(tmp_path / "a", clients)
  with pytest.raises(ValueError, match=r"clients\[1\] has fields"):
    fedco.data.write_store(tmp_path / "b", [clients[0], {"x": clients[1]["x"]}])
  with pytest.raises(ValueError, match=r"ids must lie in \[0, 5\)"):
    store.read([5])
  rows = tmp_path / "a" / "x.rows"
  rows.write_bytes(rows.read_bytes()[:-4])
  with pytest.raises(ValueError, match=r"x.rows: missing or of the wrong size"):
    fedco.data.ClientStore(tmp_path / "a")
  with pytest.raises(FileNotFoundError, match="is not a client store"):
    fedco.data.ClientStore(tmp_path / "missing")
  # a failed write leaves nothing it wrote (its new folder included), so it can be rerun;
  # into a folder it did not create, that folder stays
  assert not os.path.exists(tmp_path / "b")
  (tmp_path / "mine").mkdir()
  with pytest.raises(ValueError, match=r"clients\[1\] has fields"):
    fedco.data.write_store(tmp_path / "mine", [clients[0], {"x": clients[1]["x"]}])
  assert os.listdir(tmp_path / "mine") == []
  (tmp_path / "mine" / "x.rows").write_bytes(b"")  # a killed write's files: said so
  with pytest.raises(ValueError, match=r"not empty \(no store\.json: a killed write_store"):
    fedco.data.write_store(tmp_path / "mine", clients)
  users = {"u1": clients[0], "u2": clients[1]}
  for wrong, match in [
    (fedco.data.synthetic(1.0, 1.0, num_users=3, seed=0), r"a FederatedDataset: .*\.train"),
    (users, r"got a mapping \(a dict of users: pass its \.values\(\)\)"),
    ([clients[0], (1, 2)], r"clients\[1\] must be a dict"),
  ]:
    with pytest.raises(ValueError, match=match):
      fedco.data.write_store(tmp_path / "c", wrong)
    assert not os.path.exists(tmp_path / "c")


def test_few_of_many_clients_are_drawn_uniformly_without_a_permutation(monkeypatch):
  from fedco.runtime import sampling

  big = jax.jit(lambda k: sampling.sample_clients(k, 1_000_000, 100))(jax.random.PRNGKey(0))
  assert np.unique(np.asarray(big)).size == 100 and 0 <= big.min() and big.max() < 1_000_000
  monkeypatch.setattr(sampling, "FLOYD_MIN_CLIENTS", 0)  # Floyd's draw on a small case
  draws = jax.jit(jax.vmap(lambda k: sampling.sample_clients(k, 10, 3)))
  s = np.asarray(draws(jax.random.split(jax.random.PRNGKey(1), 60_000)))
  assert (np.diff(s, axis=1) > 0).all()  # sorted, no repeats
  inclusion = np.bincount(s.ravel(), minlength=10) / len(s)
  np.testing.assert_allclose(inclusion, 0.3, atol=0.006)  # 3.5 standard errors
  pairs = np.mean([(0 in row) and (9 in row) for row in s])
  np.testing.assert_allclose(pairs, 3 * 2 / (10 * 9), atol=0.005)


def test_a_streamed_run_of_many_clients_equals_the_in_memory_one(tmp_path):
  # 70,000 clients: past FLOYD_MIN_CLIENTS, so the host replays Floyd's draw
  rng = np.random.default_rng(2)
  x = rng.normal(size=(70_000, 1, 2)).astype(np.float32)
  clients = ({"x": x[k], "y": np.array([k % 3], np.int32)} for k in range(70_000))
  store = fedco.data.write_store(tmp_path / "many", clients)
  data = fedco.FederatedData.from_index_lists(
    {"x": x[:, 0], "y": (np.arange(70_000) % 3).astype(np.int32)},
    [np.array([k]) for k in range(70_000)],
  )
  loss = lambda p, e: jnp.sum((e["x"] @ p - e["y"]) ** 2)
  kwargs = dict(rounds=3, seed=1, batch_size=1, clients_per_round=8, evaluate=False)
  a = fedco.simulate(fedco.plain(loss), fedco.fedavg(0.1, 2), data, jnp.zeros(2), **kwargs)
  b = fedco.simulate(fedco.plain(loss), fedco.fedavg(0.1, 2), store, jnp.zeros(2), **kwargs)
  np.testing.assert_array_equal(a.params, b.params)
  np.testing.assert_array_equal(a.metrics["clients"], b.metrics["clients"])


def test_a_resumed_run_starts_unsampled_clients_fresh_whatever_its_chunks(data_and_store, tmp_path):
  """Stopped by Ctrl-C after round 4 (most clients not sampled yet), resumed with other
  chunks (so another number of pages on the device): every client's state and the model
  equal the in-memory run's."""
  data, store = data_and_store
  kwargs = dict(rounds=8, seed=1, batch_size=4, clients_per_round=3, evaluate=False)
  memory = fedco.simulate(fedco.plain(_loss), fedco.scaffold(0.1, 3), data, PARAMS, **kwargs)
  stop = fedco.runtime.RoundAction(
    lambda state, r: signal.raise_signal(signal.SIGINT) if r == 4 else None, every_rounds=2
  )
  ckpt = tmp_path / "ckpt"
  with pytest.raises(fedco.runtime.Interrupted):
    fedco.simulate(
      fedco.plain(_loss), fedco.scaffold(0.1, 3), store, PARAMS, checkpoint_dir=ckpt,
      chunk_rounds=2, actions=[stop], **kwargs,
    )  # fmt: skip
  first = np.unique(memory.metrics["clients"][:4])
  assert first.size < data.num_clients  # clients the resumed run samples for the first time
  resumed = fedco.simulate(
    fedco.plain(_loss), fedco.scaffold(0.1, 3), store, PARAMS, checkpoint_dir=ckpt,
    chunk_rounds=3, **kwargs,
  )  # fmt: skip
  states = paging.StateStore.open(ckpt / "client_state", resumed.state)
  state = paging.unpaged(resumed.state, states)
  for a, b in zip(jax.tree.leaves(memory.state), jax.tree.leaves(state), strict=True):
    np.testing.assert_array_equal(a, b)


def test_a_journal_waits_for_the_rows_still_being_written(tmp_path, monkeypatch):
  """The previous checkpoint's rows reach the files before the next journal replaces
  theirs: a kill during the next checkpoint then finds them (the write is slowed here)."""
  write = paging.state_files.Disk.apply

  def slow(self, journal, undo=False):
    time.sleep(0.5)
    write(self, journal, undo)

  monkeypatch.setattr(paging.state_files.Disk, "apply", slow)
  fresh = ({"a": np.zeros(2, np.float32)}, ())
  states = paging.StateStore(tmp_path / "s", fresh, 6, run="r")
  states.write([1, 3], ({"a": np.ones((2, 2), np.float32)}, ()))
  states.journal(2)
  states.apply(2)  # on the writer thread
  states.write([4], ({"a": np.full((1, 2), 2.0, np.float32)}, ()))
  states.journal(4)  # ... then killed during round 4's checkpoint
  with open(tmp_path / "s" / "store.json") as f:
    assert json.load(f)["round"] == 2
  again = paging.StateStore(tmp_path / "s", fresh, 6, run="r", create=False)
  again.recover(4)
  np.testing.assert_array_equal(again.read([1, 3, 4, 5])[0]["a"][:, 0], [1.0, 1.0, 2.0, 0.0])
  again.close()
  states.close()


def test_failures_leave_no_folder_open_file_or_writer_behind(data_and_store, tmp_path, monkeypatch):
  """Bad actions, a refused recovery and a failed write each end with the temporary folder
  removed, the store's files closed and the metric writer closed."""
  _, store = data_and_store
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
  os.makedirs(tmp_path / "tmp")
  kwargs = dict(rounds=4, chunk_rounds=2, clients_per_round=3, batch_size=4, evaluate=False)
  before = _open_state_files()
  with pytest.raises(ValueError, match="actions must be"):
    fedco.simulate(
      fedco.plain(_loss), fedco.scaffold(0.1, 3), store, PARAMS, actions=[print],
      checkpoint_dir=tmp_path / "ckpt", **kwargs,
    )  # fmt: skip
  fedco.simulate(  # the directory is not left locked
    fedco.plain(_loss), fedco.scaffold(0.1, 3), store, PARAMS, checkpoint_dir=tmp_path / "ckpt",
    **kwargs,
  )  # fmt: skip

  def full(self, journal, undo=False):
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(paging.state_files.Disk, "apply", full)
  writer = _Writer()
  with pytest.raises(OSError, match="No space left"):
    fedco.simulate(
      fedco.plain(_loss), fedco.scaffold(0.1, 3), store, PARAMS, metric_writers=[writer], **kwargs
    )
  assert not os.listdir(tmp_path / "tmp")
  assert _open_state_files() == before and writer.closed


class _Writer(fedco.runtime.RowWriter):
  closed = False

  def write(self, rows):
    pass

  def close(self):
    self.closed = True


def _open_state_files() -> int:
  """How many of this process's open files are a client-state store's."""
  count = 0
  for fd in os.listdir("/proc/self/fd"):
    try:
      count += "rows.bin" in os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # closed meanwhile (the listing's own descriptor)
      pass
  return count


def test_the_streamed_initial_state_computes_no_clients_batch():
  """The streamed (paged) initial state is built on a template and its trackers' means come
  from the pass: its compiled program's scratch memory must not grow with the client count
  (it drew a mini-batch for each of K clients, 3 GiB at 10^6)."""

  def temp_bytes(k):
    one = {"x": np.ones((1, 5), np.float32), "y": np.zeros(1, np.int32)}
    data = fedco.FederatedData.from_clients([one] * k)
    with pytest.warns(UserWarning, match="batch_size=32 is larger"):
      sim = fedco.Simulator(
        fedco.problems.client_kl_dro(_loss, 5.0), fedco.local_scgd(0.05, 3), data, batch_size=32
      )
    compiled = sim._init_paged.lower(PARAMS, sim.seed_key(0), sim.data, pages=8).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  small, large = temp_bytes(1_000), temp_bytes(10_000)
  assert large <= small + 10_000 * 8, (small, large)  # a few bytes a client, never a batch


def _episodes(k=12, seed=3):
  """Clients of 1-3 MAML episodes, each of 2 task slots (support and query sets)."""
  rng = np.random.default_rng(seed)
  out = []
  for n in rng.integers(1, 4, k):
    sx, qx = rng.normal(size=(2, int(n), 2, 3, 2)).astype(np.float32)
    w = rng.normal(size=(2, 2)).astype(np.float32)
    sy, qy = (np.einsum("ntsd,td->nts", a, w)[..., None] for a in (sx, qx))
    out.append({"support_x": sx, "support_y": sy, "query_x": qx, "query_y": qy})
  return out


def test_local_moml_streams_each_clients_own_first_tracker(tmp_path):
  """Local-MOML's memories ``u`` start from each client's own first inner value (not
  averaged): a streamed run computes a client's when a round first samples it, so the run
  and every sampled client's memories equal the in-memory run's, also when it is stopped
  after round 2 and resumed with other chunks (the clients sampled before keep theirs)."""
  data = fedco.FederatedData.from_clients(_episodes())
  store = fedco.data.write_store(tmp_path / "clients", data)
  params = {"w": jnp.asarray([0.3, -0.2]), "b": jnp.asarray(0.1)}
  problem = fedco.problems.maml(lambda p, x: p["w"] @ x + p["b"], 0.1)
  run = lambda source, **kwargs: fedco.simulate(
    problem,
    fedco.local_moml(0.05, 2, beta=0.6, first_order=False),
    source,
    params,
    rounds=6,
    seed=2,
    clients_per_round=3,
    batch_size=2,
    evaluate=False,
    **kwargs,
  )
  memory = run(data)
  stop = fedco.runtime.RoundAction(
    lambda state, r: signal.raise_signal(signal.SIGINT) if r == 2 else None, every_rounds=2
  )
  ckpt = str(tmp_path / "ckpt")
  with pytest.raises(fedco.runtime.Interrupted):
    run(store, checkpoint_dir=ckpt, chunk_rounds=2, actions=[stop])
  streamed = run(store, checkpoint_dir=ckpt, chunk_rounds=3)
  # rows still pending (checkpoints every 6 rounds, chunks of 1) or being written (no
  # checkpoints) are rows too: recomputing them would restart those clients' memories
  for kwargs in ({"checkpoint_dir": str(tmp_path / "late"), "checkpoint_every": 6}, {}):
    again = run(store, chunk_rounds=1, **kwargs)
    chex.assert_trees_all_close(again.params, memory.params, rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(streamed.params, memory.params, rtol=1e-5, atol=1e-6)
  states = fedco.runtime.StateStore.open(tmp_path / "ckpt" / "client_state", streamed.state)
  u = fedco.runtime.unpaged(streamed.state, states).clients.u
  sampled = np.unique(streamed.metrics["clients"])
  assert 0 < sampled.size < data.num_clients and states.touched[sampled].all()
  chex.assert_trees_all_close(
    jax.tree.map(lambda a: a[sampled], u),
    jax.tree.map(lambda a: a[sampled], memory.state.clients.u),
    rtol=1e-5,
    atol=1e-6,
  )
