"""A streamed run's client state on disk (issue 44 part B, decision 95): every file
checksummed and verified, damage refused in one line naming the file (and the client); the
files consistent with whichever retained checkpoint a run restores (a streamed stateful run
falls back like an in-memory one); the temporaries and folders of killed runs removed on the
next run; disk in proportion to the clients sampled."""

import builtins
import contextlib
import errno
import fcntl
import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedco
from fedco.runtime import paging, state_files, state_folders

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


def _store_at_12(directory):
  """Rounds 4, 8 (see :func:`_store_with_rounds`) and 12 (client 0 at 3.0) applied, round 4's
  checkpoint no longer kept."""
  states, fresh = _store_with_rounds(directory)
  states.apply(8)
  states.write([0], ({"a": np.full((1, 2), 3.0, np.float32)}, ()))
  states.journal(12)
  states.apply(12)
  states.keep_journals([8, 12])
  states.close()
  return fresh


ROUND_12 = [3.0] + ROUND_8[1:]


def _values(directory, fresh, restored):
  states = paging.StateStore(directory, fresh, 6, run="r", create=False)
  try:
    states.recover(restored)
    return states.read(np.arange(6))[0]["a"][:, 0].tolist()
  finally:
    states.close()


def test_journals_follow_the_checkpoints_kept(tmp_path):
  """One journal per checkpoint kept; the files go back two checkpoints along them."""
  fresh = _store_at_12(tmp_path)
  assert sorted(n for n in os.listdir(tmp_path) if n.startswith("journal")) == [
    "journal-12.npz",
    "journal-8.npz",
  ]
  # the files at 12, back to 4 (round 8's journal holds round 4's rows)
  assert _values(tmp_path, fresh, 4) == ROUND_4


def test_a_newer_checkpoint_readable_again_after_a_fallback_is_resumed(tmp_path):
  """The newest checkpoint (12) failed to read once (a transient error): the run fell back
  to 4 (the files undone to it) and was killed before its next save; the next resume
  reads checkpoint 12 again, and the files go forward to it along the journals kept (they
  used to be removed at the fallback, and the resume was refused)."""
  fresh = _store_at_12(tmp_path)
  assert _values(tmp_path, fresh, 4) == ROUND_4
  assert _values(tmp_path, fresh, 12) == ROUND_12
  assert _values(tmp_path, fresh, 8) == ROUND_8


def test_a_journal_of_files_since_rewritten_is_never_applied(tmp_path):
  """Fallen back to 4, the run wrote round 8 again (other rows: a new journal-8); the old
  journal-12, planned on the old round 8's files, is kept (its checkpoint still is) but
  never applied: a restore of 12 is refused, not served another timeline's rows."""
  fresh = _store_at_12(tmp_path)
  states = paging.StateStore(tmp_path, fresh, 6, run="r", create=False)
  states.recover(4)
  states.write([4], ({"a": np.full((1, 2), 5.0, np.float32)}, ()))
  states.journal(8)
  states.apply(8)
  states.close()
  assert _values(tmp_path, fresh, 8) == [0.0, 1.0, 0.0, 1.0, 5.0, 1.0]
  with pytest.raises(ValueError, match="holds round 8, the checkpoint restored round 12, and no"):
    _values(tmp_path, fresh, 12)


def test_rows_over_what_one_system_call_moves_are_written_and_read_whole(tmp_path, monkeypatch):
  """``pwrite`` and ``preadv`` may move fewer bytes than asked (Linux: at most 2,147,479,552
  a call): a run of records is written and read in as many calls as it takes (a run over
  2 GiB used to be cut silently, then reported as damage)."""
  pwrite, preadv = os.pwrite, os.preadv
  calls = []

  def short_pwrite(fd, data, offset):
    calls.append("w")
    return pwrite(fd, memoryview(data).cast("B")[:5], offset)

  def short_preadv(fd, buffers, offset):
    calls.append("r")
    return preadv(fd, [memoryview(buffers[0]).cast("B")[:7]], offset)

  monkeypatch.setattr(os, "pwrite", short_pwrite)
  monkeypatch.setattr(os, "preadv", short_preadv)
  fresh = ({"a": np.zeros(3, np.float32)}, ())
  states = paging.StateStore(tmp_path, fresh, 6, run="r")
  rows = np.arange(12, dtype=np.float32).reshape(4, 3)
  states.write([0, 1, 2, 5], ({"a": rows}, ()))  # one run of consecutive slots
  states.journal(2)
  states.apply(2)
  states.close()
  again = paging.StateStore(tmp_path, fresh, 6, run="r", create=False)
  np.testing.assert_array_equal(again.read([0, 1, 2, 5])[0]["a"], rows)
  again.close()
  assert calls.count("w") > 4 and calls.count("r") > 4, calls  # the short calls were used


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
  """Only ``fedco-client-state-*`` folders whose owner file no process holds locked go (a
  killed run's lock went with it); a folder whose lock is held stays, whatever its owner
  file says (another boot id, a pid not here: a temporary directory shared by machines or
  containers), as does one without an owner file or with an earlier fedco's (no lock);
  the run's own folder goes at its end, its lock with it; anything else stays."""
  _, store = data_and_store
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
  me = {"pid": os.getpid(), "boot": state_folders._boot_id(), "lock": "flock"}
  elsewhere = {"pid": _dead_pid(), "boot": "another-boot", "lock": "flock"}
  owners = {
    "fedco-client-state-killed": me,
    "fedco-client-state-killed-elsewhere": elsewhere,
    "fedco-client-state-alive-elsewhere": elsewhere,  # its lock held below
    "fedco-client-state-earlier": {k: v for k, v in elsewhere.items() if k != "lock"},
    "fedco-client-state-noowner": None,
    "not-fedco-killed": me,
  }
  for name, owner in owners.items():
    (tmp_path / name).mkdir()
    (tmp_path / name / "rows.bin").write_bytes(b"x")
    if owner is not None:
      (tmp_path / name / "owner.json").write_text(json.dumps(owner))
  (tmp_path / "fedco-client-state-file").write_text("")
  with open(tmp_path / "fedco-client-state-alive-elsewhere" / "owner.json") as held:
    fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # a live holder (here: this process)
    _scaffold(store, 2)
  gone = {"fedco-client-state-killed", "fedco-client-state-killed-elsewhere"}
  assert sorted(os.listdir(tmp_path)) == sorted(set(owners) - gone | {"fedco-client-state-file"})
  assert not state_folders._HELD  # the run's own folder and its lock are gone


def test_a_run_holds_its_temporary_folder_locked(tmp_path, monkeypatch):
  """While a run lives its folder's owner file is locked: another run's clean-up leaves it."""
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
  folder = state_folders.temporary_folder()
  try:
    assert json.loads(pathlib.Path(folder, "owner.json").read_text())["lock"] == "flock"
    with open(pathlib.Path(folder, "owner.json")) as f:  # as another process would try
      with pytest.raises(OSError):
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    assert state_folders.remove_abandoned() == [] and os.path.isdir(folder)
  finally:
    state_folders.remove_temporary(folder)
  assert not os.path.exists(folder) and folder not in state_folders._HELD


# ---- 3b: errors that are not damage, earlier formats, read-only opening ---------------------


def _small_store(directory):
  fresh = ({"a": np.zeros(3, np.float32)}, ())
  states = paging.StateStore(directory, fresh, 6, run="r")
  states.write([1, 4], ({"a": np.ones((2, 3), np.float32)}, ()))
  states.journal(2)
  states.apply(2)
  states.close()
  like = fedco.runtime.SimState(0, None, {}, (), {}, paging.Pages(jnp.arange(2), fresh[0]), None)
  return fresh, like


@pytest.mark.parametrize("name", ["store.json", "fresh.npz", "index.npz", "rows.bin"])
def test_a_file_that_cannot_be_read_is_not_called_damaged(tmp_path, monkeypatch, name):
  """Permissions, too many open files, an I/O error: one line saying the file cannot be read
  and why, as the same OSError kind, never "damaged ... delete the checkpoint directory"."""
  fresh, like = _small_store(tmp_path)
  real_open, real_os_open = builtins.open, os.open

  def refuse(path):
    if os.fspath(path).endswith(name):
      raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))

  monkeypatch.setattr(builtins, "open", lambda p, *a, **k: refuse(p) or real_open(p, *a, **k))
  monkeypatch.setattr(os, "open", lambda p, *a, **k: refuse(p) or real_os_open(p, *a, **k))
  for opening in (
    lambda: paging.StateStore.open(tmp_path, like),
    lambda: paging.StateStore(tmp_path, fresh, 6, run="r", create=False),
  ):
    with pytest.raises(PermissionError) as err:
      opening()
    assert str(err.value) == (
      f"cannot read client state file {tmp_path / name} (Permission denied)"
    )


def test_memory_errors_are_not_called_damaged(tmp_path, monkeypatch):
  fresh, like = _small_store(tmp_path)

  def no_memory(*args, **kwargs):
    raise MemoryError

  monkeypatch.setattr(np, "load", no_memory)
  with pytest.raises(MemoryError):
    paging.StateStore.open(tmp_path, like)


def test_open_reads_a_read_only_store(tmp_path):
  """``StateStore.open`` only reads: ``rows.bin`` is opened read-only (a read-only folder
  works; root ignores permissions, so the open mode itself is checked)."""
  fresh, like = _small_store(tmp_path)
  states = paging.StateStore.open(tmp_path, like)
  try:
    assert fcntl.fcntl(states._disk.fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
    np.testing.assert_array_equal(states.read([4])[0]["a"], np.ones((1, 3)))
  finally:
    states.close()


@pytest.mark.parametrize("fmt", [1, 2])
def test_a_store_of_an_earlier_fedco_is_refused_saying_so(tmp_path, fmt):
  """Stores an earlier fedco wrote (format 1: per-leaf files; 2: journals without tokens):
  one line saying so and what to do, not "damaged ... delete the checkpoint directory"."""
  fresh, like = _small_store(tmp_path)
  if fmt == 1:
    for name in os.listdir(tmp_path):
      os.remove(tmp_path / name)
    (tmp_path / "store.json").write_text(json.dumps({"round": 2, "run": "r", "clients": 6}))
    np.save(tmp_path / "touched.npy", np.zeros(6, bool))
    (tmp_path / "leaf-0.bin").write_bytes(b"")
  else:
    meta = json.loads((tmp_path / "store.json").read_text())
    meta.pop("crc")
    meta.pop("head")
    state_files.save_meta(tmp_path / "store.json", {**meta, "format": 2})
  for opening in (
    lambda: paging.StateStore.open(tmp_path, like),
    lambda: paging.StateStore(tmp_path, fresh, 6, run="r", create=False),
  ):
    with pytest.raises(ValueError) as err:
      opening()
    assert str(err.value) == (
      f"client state in {tmp_path} was written by an earlier fedco version whose client-state "
      "format this one does not read; start the run afresh with a new checkpoint_dir, or "
      "finish it with the earlier fedco"
    )


def test_without_checkpoints_rows_are_encoded_on_the_writer_thread(tmp_path, monkeypatch):
  """A run without checkpoints hands the rows to the writer thread, which encodes and
  checksums them too (they used to be encoded on the main thread, the device waiting)."""
  threads = []
  encode = state_files.Records.encode

  def spy(self, ids, leaves):
    threads.append(threading.current_thread().name)
    return encode(self, ids, leaves)

  monkeypatch.setattr(state_files.Records, "encode", spy)
  fresh = ({"a": np.zeros(3, np.float32)}, ())
  states = paging.StateStore(tmp_path, fresh, 6, durable=False)
  states.write([1, 4], ({"a": np.ones((2, 3), np.float32)}, ()))
  states.apply(2)
  np.testing.assert_array_equal(states.read([4])[0]["a"], np.ones((1, 3)))  # while in flight
  states.close()
  assert threads and all(t.startswith("fedco-state") for t in threads), threads


# ---- 4: orbax's log lines: tests/test_streaming_integrity.py (dropped, and only orbax's) --


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
