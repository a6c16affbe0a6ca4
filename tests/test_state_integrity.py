"""A streamed run's client state on disk (issue 44 part B, decision 95): every file
checksummed and verified, damage refused in one line naming the file (and the client); the
files consistent with whichever retained checkpoint a run restores (a streamed stateful run
falls back like an in-memory one); the temporaries and folders of killed runs removed on the
next run; disk in proportion to the clients sampled."""

import contextlib
import json
import logging
import os
import pathlib
import shutil
import subprocess
import tempfile
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedco
from fedco import checkpoint
from fedco.runtime import paging, state_files

K = 12


def _clients(k=K, seed=0):
  rng = np.random.default_rng(seed)
  return [{"x": rng.normal(size=(int(n), 3)).astype(np.float32)} for n in rng.integers(2, 6, k)]


def _loss(p, e):
  return jnp.sum((p - e["x"]) ** 2)


@pytest.fixture(scope="module")
def data_and_store(tmp_path_factory):
  clients = _clients()
  data = fedco.FederatedData.from_clients(clients)
  return data, fedco.data.write_store(tmp_path_factory.mktemp("s") / "clients", clients)


KW = dict(seed=2, batch_size=2, clients_per_round=3, evaluate=False, chunk_rounds=2)


def _scaffold(data, rounds, **kw):
  return fedco.simulate(
    fedco.plain(_loss), fedco.scaffold(0.1, 2), data, jnp.zeros(3), rounds=rounds, **KW, **kw
  )


@pytest.fixture(scope="module")
def straight(data_and_store):
  """The uninterrupted in-memory run (every client's state as a [K] stack)."""
  return _scaffold(data_and_store[0], 8)


def _assert_same_state(memory, streamed, ckpt):
  states = paging.StateStore.open(pathlib.Path(ckpt) / "client_state", streamed.state)
  state = paging.unpaged(streamed.state, states)
  states.close()
  for a, b in zip(jax.tree.leaves(memory.state), jax.tree.leaves(state), strict=True):
    np.testing.assert_array_equal(a, b)


def _flip(path, offset, count=4):
  raw = bytearray(path.read_bytes())
  raw[offset : offset + count] = bytes(b ^ 0xFF for b in raw[offset : offset + count])
  path.write_bytes(bytes(raw))


# ---- 1: damaged rows and index refused, naming the file and the client ----------------------


def test_a_garbled_row_is_refused_naming_the_file_and_the_client(
  data_and_store, straight, tmp_path
):
  """Bytes of a sampled client's row changed on disk between the stop and the resume: the
  resumed run refuses it in one line (it used to read the garbled state and end with other
  results)."""
  _, store = data_and_store
  _scaffold(store, 4, checkpoint_dir=tmp_path)
  directory = tmp_path / "client_state"
  with open(directory / "store.json") as f:
    record = json.load(f)["record_bytes"]
  owners = np.load(directory / "index.npz")["owners"]
  slot = np.flatnonzero(np.isin(owners, straight.metrics["clients"][4:6]))[0]  # read next
  _flip(directory / "rows.bin", slot * record + 20)  # in the row's state, not its header
  with pytest.raises(ValueError, match=rf"rows.bin is damaged .*client {owners[slot]} ") as err:
    _scaffold(store, 8, checkpoint_dir=tmp_path)
  assert "\n" not in str(err.value)


def test_a_cleared_or_garbled_index_is_refused(data_and_store, tmp_path):
  """The index that says which clients have rows (``touched.npy`` before): cleared to no
  client (a well-formed file with its own checksum) or garbled, the reopened store refuses
  it instead of starting every client afresh."""
  _, store = data_and_store
  result = _scaffold(store, 4, checkpoint_dir=tmp_path)
  directory = tmp_path / "client_state"
  owners = np.load(directory / "index.npz")["owners"]
  for changed in (np.zeros(0, np.int32), owners[::-1].copy()):  # cleared; clients swapped
    state_files.save_arrays(directory / "index.npz", {"owners": changed})
    with pytest.raises(ValueError, match="index.npz is damaged .it does not match store.json"):
      paging.StateStore.open(directory, result.state)
  (directory / "index.npz").write_bytes(b"PK\x03\x04 garbage")
  with pytest.raises(ValueError, match="index.npz is damaged .unreadable") as err:
    _scaffold(store, 8, checkpoint_dir=tmp_path)
  assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", ["store.json", "fresh.npz", "index.npz"])
@pytest.mark.parametrize("how", ["garbage", "truncated", "flipped"])
def test_open_names_a_damaged_file_in_one_line(tmp_path, name, how):
  """What used to be raw BadZipFile / KeyError / JSON tracebacks is one ValueError naming
  the file, from StateStore.open and from the constructor a resumed run uses."""
  fresh = ({"a": np.zeros(3, np.float32)}, ())
  states = paging.StateStore(tmp_path, fresh, 6, run="r")
  states.write([1, 4], ({"a": np.ones((2, 3), np.float32)}, ()))
  states.journal(2)
  states.apply(2)
  states.close()
  path = tmp_path / name
  if how == "garbage":
    path.write_bytes(b"\x00garbage{")
  elif how == "truncated":
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
  else:
    _flip(path, path.stat().st_size // 2 if name != "store.json" else 20, 1)
  like = fedco.runtime.SimState(0, None, {}, (), {}, paging.Pages(jnp.arange(2), fresh[0]), None)
  for opening in (
    lambda: paging.StateStore.open(tmp_path, like),
    lambda: paging.StateStore(tmp_path, fresh, 6, run="r", create=False),
  ):
    with pytest.raises(ValueError, match=rf"client state file .*{name} is damaged") as err:
      opening()
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("how", ["flipped", "rewritten"])
def test_a_damaged_journal_is_refused_naming_it(tmp_path, how):
  """Killed after round 4's journal was written, before its rows reached the files; the
  journal then damaged (bytes flipped, or rewritten as a well-formed file with another
  slot count): the resume refuses it in one line (it was a BadZipFile traceback)."""
  fresh = ({"a": np.zeros(3, np.float32)}, ())
  states = paging.StateStore(tmp_path, fresh, 6, run="r")
  states.write([1, 4], ({"a": np.ones((2, 3), np.float32)}, ()))
  states.journal(4)
  states.close()
  path = tmp_path / "journal-4.npz"
  if how == "flipped":
    _flip(path, path.stat().st_size // 2)
  else:
    arrays = dict(np.load(path))
    arrays["used"] = np.asarray(arrays["used"] + 1)
    np.savez(path, **arrays)  # its old checksum kept
  again = paging.StateStore(tmp_path, fresh, 6, run="r", create=False)
  with pytest.raises(ValueError, match=r"journal-4.npz is damaged") as err:
    again.recover(4)
  assert "\n" not in str(err.value)
  again.close()


# ---- 2: the files follow the checkpoint restored: fallback like an in-memory run -----------


def _garble_newest_checkpoint(directory):
  newest = max(int(p.name) for p in pathlib.Path(directory).iterdir() if p.name.isdigit())
  files = [p for p in (pathlib.Path(directory) / str(newest) / "state").rglob("*") if p.is_file()]
  for target in [p for p in files if p.parent.name == "d"]:
    _flip(target, target.stat().st_size // 2, 64)
  return newest


@pytest.mark.parametrize("damage", ["garbled", "lost"])
def test_a_damaged_newest_checkpoint_falls_back_like_an_in_memory_run(
  data_and_store, straight, tmp_path, capsys, damage
):
  """A streamed SCAFFOLD run with checkpoints at rounds 4, 6 and 8, its newest checkpoint
  garbled (or its folder lost) after it finished: the rerun falls back to round 6 (the
  files, at round 8, are undone to it along round 8's journal) and ends equal, every
  client's state included, to the uninterrupted run, as the in-memory run does in the
  same situation (the streamed one used to say "resumed from round 6", then refuse)."""
  data, store = data_and_store
  memory_dir, streamed_dir = tmp_path / "memory", tmp_path / "streamed"
  for data_, directory in ((data, memory_dir), (store, streamed_dir)):
    _scaffold(data_, 8, checkpoint_dir=directory, checkpoint_every=2, keep_checkpoints=3)
    assert _garble_newest_checkpoint(directory) == 8
    if damage == "lost":
      shutil.rmtree(directory / "8")

  def warns():
    if damage == "lost":  # nothing to say: round 6 is the newest there is
      return contextlib.nullcontext()
    return pytest.warns(UserWarning, match="round 8 .* damaged")

  with warns():
    memory = _scaffold(data, 8, checkpoint_dir=memory_dir, checkpoint_every=2)
  with warns():
    streamed = _scaffold(store, 8, checkpoint_dir=streamed_dir, checkpoint_every=2)
  assert capsys.readouterr().err.count("resumed from round 6") == 2
  for result in (memory, streamed):
    np.testing.assert_array_equal(result.params, straight.params)
    np.testing.assert_array_equal(result.metrics["clients"], straight.metrics["clients"])
  _assert_same_state(straight, streamed, streamed_dir)
  names = os.listdir(streamed_dir / "client_state")
  assert sorted(n for n in names if n.startswith("journal")) == [
    "journal-4.npz",
    "journal-6.npz",
    "journal-8.npz",
  ]  # one per checkpoint kept


def _store_with_rounds(directory):
  """A store at round 4 (clients 1, 3, 5 at 1.0) with round 8's journal written (clients 1
  and 2 at 2.0: a row replaced, a new one): round 8's checkpoint is saved next."""
  fresh = ({"a": np.zeros(2, np.float32)}, ())
  states = paging.StateStore(directory, fresh, 6, run="r")
  states.write([1, 3, 5], ({"a": np.full((3, 2), 1.0, np.float32)}, ()))
  states.journal(4)
  states.apply(4)
  states.write([1, 2], ({"a": np.full((2, 2), 2.0, np.float32)}, ()))
  states.journal(8)
  return states, fresh


ROUND_4, ROUND_8 = [0.0, 1.0, 0.0, 1.0, 0.0, 1.0], [0.0, 2.0, 2.0, 1.0, 0.0, 1.0]


@pytest.mark.parametrize("restored,want", [(4, ROUND_4), (8, ROUND_8)])
def test_a_kill_while_rows_are_written_then_either_checkpoint(
  tmp_path, monkeypatch, restored, want
):
  """Killed while round 8's rows were being written (one of them reached the file), then the
  newest checkpoint lost (restored: 4) or kept (8): the files hold exactly that round (the
  half-done write is completed first, then undone for round 4)."""
  states, fresh = _store_with_rounds(tmp_path)
  write = state_files.Disk._write

  def killed(self, records, slots):
    write(self, records[:1], slots[:1])
    raise KeyboardInterrupt  # stands for the kill: nothing after the first row runs

  monkeypatch.setattr(state_files.Disk, "_write", killed)
  states.apply(8)
  with pytest.raises(KeyboardInterrupt):
    states.close()
  monkeypatch.undo()
  again = paging.StateStore(tmp_path, fresh, 6, run="r", create=False)
  again.recover(restored)
  np.testing.assert_array_equal(again.read(np.arange(6))[0]["a"][:, 0], want)
  again.close()
  reopened = paging.StateStore(tmp_path, fresh, 6, run="r", create=False)  # and it was recorded
  assert reopened.round == restored
  np.testing.assert_array_equal(reopened.read(np.arange(6))[0]["a"][:, 0], want)
  reopened.close()


def test_journals_follow_the_checkpoints_kept(tmp_path):
  """One journal per checkpoint kept; the files go back two checkpoints along them."""
  states, fresh = _store_with_rounds(tmp_path)
  states.apply(8)
  states.write([0], ({"a": np.full((1, 2), 3.0, np.float32)}, ()))
  states.journal(12)
  states.apply(12)
  states.keep_journals([8, 12])  # round 4's checkpoint no longer kept
  states.close()
  assert sorted(n for n in os.listdir(tmp_path) if n.startswith("journal")) == [
    "journal-12.npz",
    "journal-8.npz",
  ]
  again = paging.StateStore(tmp_path, fresh, 6, run="r", create=False)
  again.recover(4)  # the files at 12, back to 4 (round 8's journal holds round 4's rows)
  np.testing.assert_array_equal(again.read(np.arange(6))[0]["a"][:, 0], ROUND_4)
  assert not [n for n in os.listdir(tmp_path) if n.startswith("journal-12")]  # a later one
  again.close()


# ---- 3: what killed runs leave behind -----------------------------------------------------


def test_stale_temporaries_of_the_stores_files_are_removed_on_the_next_run(tmp_path):
  fresh = ({"a": np.zeros(2, np.float32)}, ())
  paging.StateStore(tmp_path, fresh, 6, run="r").close()
  left = [
    ".tmp-journal-4.npz.ab12cd34",
    ".tmp-store.json.ab12cd34",
    ".tmp-index.npz.ab12cd34",
    ".tmp-touched.npy.ab12cd34",  # an older fedco's
  ]
  others = [".tmp-notes.txt.ab12cd34", "notes.txt", ".tmp-store.json.x"]
  for name in left + others:
    (tmp_path / name).write_text("")
  like = fedco.runtime.SimState(0, None, {}, (), {}, paging.Pages(jnp.arange(2), fresh[0]), None)
  paging.StateStore.open(tmp_path, like).close()  # a reader removes nothing
  assert set(left) <= set(os.listdir(tmp_path))
  paging.StateStore(tmp_path, fresh, 6, run="r", create=False).close()  # the resumed run
  assert not set(left) & set(os.listdir(tmp_path))
  assert set(others) <= set(os.listdir(tmp_path))


def _dead_pid() -> int:
  proc = subprocess.Popen(["true"])
  proc.wait()
  return proc.pid


def test_folders_of_killed_runs_without_checkpoints_are_removed(
  data_and_store, tmp_path, monkeypatch
):
  """Only ``fedco-client-state-*`` folders whose owner file names a process provably gone
  (no such pid, another process under its pid, another boot) go; the run's own folder goes
  at its end; anything else stays."""
  _, store = data_and_store
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
  me = json.loads(json.dumps({"pid": os.getpid(), "boot": paging._boot_id()}))
  me["start"] = paging._start_time(os.getpid())
  owners = {
    "fedco-client-state-dead": {**me, "pid": _dead_pid()},
    "fedco-client-state-reused": {**me, "start": (me["start"] or 0) + 1},
    "fedco-client-state-reboot": {**me, "boot": "another-boot"},
    "fedco-client-state-alive": me,
    "fedco-client-state-noowner": None,
    "not-fedco-dead": {**me, "pid": _dead_pid()},
  }
  for name, owner in owners.items():
    (tmp_path / name).mkdir()
    (tmp_path / name / "rows.bin").write_bytes(b"x")
    if owner is not None:
      (tmp_path / name / "owner.json").write_text(json.dumps(owner))
  (tmp_path / "fedco-client-state-file").write_text("")
  _scaffold(store, 2)
  gone = {"fedco-client-state-dead", "fedco-client-state-reused", "fedco-client-state-reboot"}
  if me["start"] is None:  # no /proc: a pid in use cannot be shown to be another process
    gone.discard("fedco-client-state-reused")
  assert sorted(os.listdir(tmp_path)) == sorted(set(owners) - gone | {"fedco-client-state-file"})


# ---- 4: orbax's log lines ------------------------------------------------------------------


def test_damaged_checkpoint_metadata_leaves_no_orbax_log_lines(tmp_path, caplog):
  ckpt = checkpoint.Checkpointer(tmp_path)
  template = {"w": np.arange(4.0, dtype=np.float32)}
  for r in (1, 2):
    ckpt.save(r, template, {"objective": np.zeros(r)})
  ckpt.close()
  (tmp_path / "2" / "_CHECKPOINT_METADATA").write_text("garbage{")
  with caplog.at_level(logging.DEBUG, logger="absl"), warnings.catch_warnings():
    warnings.simplefilter("ignore")
    ckpt = checkpoint.Checkpointer(tmp_path)
    assert ckpt.restore(template)[0] == 2  # its arrays are intact: checksums verified
    ckpt.close()
  assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


# ---- 5: disk in proportion to the clients sampled -----------------------------------------


def test_disk_grows_by_one_record_per_sampled_client(tmp_path):
  """A million clients, 300 sampled, SCAFFOLD-sized rows (4 model-sized arrays and a count):
  the files take about 300 records of disk (rows in sparse per-leaf files took 2-5 blocks
  of 4 KiB per client and leaf)."""
  w = np.zeros((61, 10), np.float32)
  fresh = ({"count": np.int32(0), "c": w, "c_round": w, "c_i": w, "c_plus": w}, ())
  states = paging.StateStore(tmp_path, fresh, 10**6, run="r")
  ids = np.sort(np.random.default_rng(0).choice(10**6, 300, replace=False))
  states.write(ids, jax.tree.map(lambda a: np.ones((300,) + a.shape, a.dtype), fresh))
  states.journal(1)
  states.apply(1)
  states.close()
  record = 8 + 4 + 4 * w.nbytes
  used = {n: os.stat(tmp_path / n).st_blocks * 512 for n in os.listdir(tmp_path)}
  assert used["rows.bin"] <= 300 * record + 8192, used
  assert used["index.npz"] <= 8192, used  # not O(K)
  assert sum(used.values()) <= 2 * (300 * record) * 2 + 64 * 1024, used  # the journal: 2x
