"""A streamed run's data as strict and as verified as an in-memory run's (issue 44, decision
94): every client it reads is checked on the host (labels, finiteness) with the in-memory
run's errors; the store's rows and metadata are verified against their checksums and digest;
``write_store`` is whole or absent and refuses what it cannot read back."""

import errno
import hashlib
import json
import logging
import os
import traceback
import warnings

import jax.numpy as jnp
import numpy as np
import pytest
from absl import logging as absl_logging

import fedco
from fedco import checkpoint
from fedco.data import store as store_lib
from fedco.runtime import checks, streaming

K, CLASSES = 6, 3


def _clients(seed=0):
  rng = np.random.default_rng(seed)
  return [
    {
      "x": rng.normal(size=(n, 4)).astype(np.float32),
      "y": rng.integers(0, CLASSES, n).astype(np.int32),
    }
    for n in (3, 4, 2, 5, 3, 4)
  ]


def _loss(p, e):  # fedco.models.cross_entropy checks its labels (fedco/_labels.py)
  return fedco.models.cross_entropy(e["x"] @ p["w"] + p["b"], e["y"])


PARAMS = {"w": jnp.zeros((4, CLASSES)), "b": jnp.zeros(CLASSES)}
RUN = dict(rounds=2, batch_size=2, clients_per_round=K, evaluate=False, chunk_rounds=1)


def _both(clients, tmp_path, **kwargs):
  """The errors of the in-memory run and the streamed run of ``clients``."""
  errors = []
  data = fedco.FederatedData.from_clients(clients)
  store = fedco.data.write_store(tmp_path / "store", clients)
  for source in (data, store):
    with pytest.raises(Exception) as info:
      fedco.simulate(fedco.plain(_loss), fedco.fedavg(0.1), source, PARAMS, **{**RUN, **kwargs})
    errors.append(info.value)
  return errors


def test_labels_past_the_classes_in_any_client_are_refused_as_in_memory(tmp_path):
  """The probe's case: off-by-one labels in every client but the first. In memory:
  LabelError before the run; streamed, the same error (client 1's first label 3), where it
  used to train on NaN losses with zero gradients."""
  clients = _clients()
  clients[1]["y"][-1] = CLASSES - 1  # so that client 1 holds a 3 once shifted
  for c in clients[1:]:
    c["y"] = c["y"] + 1
  memory, streamed = _both(clients, tmp_path)
  assert type(memory) is type(streamed) is fedco._labels.LabelError
  assert str(memory) == str(streamed)
  row = 3 + int(np.argmax(clients[1]["y"] == CLASSES))  # client 0 holds rows 0-2
  assert f"client 1, row {row}, is 3" in str(memory) and "[0, 3)" in str(memory)
  assert "\n" not in str(memory)


def test_a_bad_label_in_a_client_sampled_late_is_refused_before_its_round(tmp_path):
  """Partial participation: the bad client is read (ahead, on the host thread) only for a
  later chunk; that chunk is refused with the in-memory error, one line, no thread frames."""
  clients = _clients()
  clients[4]["y"][2] = CLASSES
  memory = _both(clients, tmp_path)[0]
  store = fedco.data.ClientStore(tmp_path / "store")
  kwargs = dict(batch_size=2, clients_per_round=2, evaluate=False)
  sim = fedco.Simulator(fedco.plain(_loss), fedco.fedavg(0.1), streaming.template(store), **kwargs)

  def first_round(seed):  # the first round sampling client 4 (a read-ahead chunk from 2 on)
    sampled = streaming.schedule(fedco.runtime.paging.state_key(sim.seed_key(seed)), K, 2, 6)
    return int(np.argmax((sampled == 4).any(axis=1)) if (sampled == 4).any() else -1)

  seed = next(s for s in range(100) if first_round(s) >= 2)
  with pytest.raises(fedco._labels.LabelError) as info:
    fedco.simulate(
      fedco.plain(_loss), fedco.fedavg(0.1), store, PARAMS, rounds=6, chunk_rounds=1,
      seed=seed, **kwargs,
    )  # fmt: skip
  assert str(info.value) == str(memory) and "client 4, row 16, is 3" in str(memory)
  frames = [f.filename for f in traceback.extract_tb(info.value.__traceback__)]
  assert not any("concurrent" in f for f in frames), frames


def test_non_finite_data_are_named_as_in_memory(tmp_path):
  """A NaN row diverges the run, in memory and streamed alike, and both errors name the
  row (the streamed one used to blame the iterates: "The data are finite"): the streamed
  run finds the row as it reads it, so it names it although its data hold client 0 only."""
  clients = _clients()
  clients[3]["x"][:, 2] = np.nan  # every batch of client 3 diverges the run
  memory, streamed = _both(clients, tmp_path)
  assert type(memory) is type(streamed) is checks.NonFiniteError
  note = "The data hold non-finite values (field ['x'], client 3, row 9): fix the data."
  assert note in str(memory) and note in str(streamed) and "\n" not in str(streamed)
  assert str(memory) == str(streamed)


def test_non_finite_values_a_run_does_not_use_end_neither_run(tmp_path):
  """As in memory, non-finite data end a streamed run only when they make it diverge: an
  inf in a field the problem never reads, or any with check_finite=False, runs to the end
  with the same result in memory and streamed."""
  clients = _clients()
  for c in clients:
    c["w"] = np.ones(len(c["y"]), np.float32)
  clients[4]["w"][1] = np.inf
  data = fedco.FederatedData.from_clients(clients)
  store = fedco.data.write_store(tmp_path / "store", clients)
  for kwargs in ({}, {"check_finite": False}):
    runs = [
      fedco.simulate(fedco.plain(_loss), fedco.fedavg(0.1), source, PARAMS, **RUN, **kwargs)
      for source in (data, store)
    ]
    np.testing.assert_array_equal(runs[0].params["w"], runs[1].params["w"])


def test_a_divergence_says_what_data_were_checked():
  """A streamed run's data (its template: one client's rows) do not make it claim the whole
  data set finite; an in-memory run's finite data do."""
  data = fedco.FederatedData.from_clients(_clients())
  assert checks.data_finiteness_note(data) == "The data are finite: the iterates diverged."
  template = fedco.FederatedData.from_clients(_clients()[:1]).replace(counts=data.counts)
  assert "this run read are finite" in checks.data_finiteness_note(template)


def _edit(file, at, data=np.float32(123.0).tobytes()):  # finite: only a checksum sees it
  with open(file, "r+b") as f:
    f.seek(at)
    f.write(data)


def test_edited_rows_stop_a_resumed_run(tmp_path):
  """One client's rows edited after a checkpoint (store.json untouched): the rerun used to
  resume and finish on two versions of the data; now the read is refused, naming the file,
  the client and a damaged store."""
  clients = _clients()
  store = fedco.data.write_store(tmp_path / "store", clients)
  kwargs = dict(RUN, checkpoint_dir=tmp_path / "ckpt")
  fedco.simulate(fedco.plain(_loss), fedco.fedavg(0.1), store, PARAMS, **kwargs)
  _edit(tmp_path / "store" / "x.rows", int(store.offsets[2]) * 16 + 4)
  store = fedco.data.ClientStore(tmp_path / "store")  # the metadata are whole
  match = r"x\.rows: client 2's rows do not match their checksum \(damaged store"
  with pytest.raises(ValueError, match=match):
    fedco.simulate(fedco.plain(_loss), fedco.fedavg(0.1), store, PARAMS, **{**kwargs, "rounds": 4})
  store.read([0, 1, 3])  # the others read as before
  with pytest.raises(ValueError, match=match):
    store.read([3, 2])


def test_garbled_rows_and_damaged_metadata_are_one_line_naming_the_file(tmp_path):
  clients = _clients()
  path = tmp_path / "s"
  fedco.data.write_store(path, clients)
  original = {n: (path / n).read_bytes() for n in os.listdir(path)}

  def damaged(name, content, match, error=ValueError):
    (path / name).write_bytes(content)
    try:
      with pytest.raises(error, match=match) as info:
        fedco.data.ClientStore(path).read(range(K))
      assert "\n" not in str(info.value)
    finally:
      (path / name).write_bytes(original[name])

  rng = np.random.default_rng(0)
  garbled = rng.integers(0, 256, len(original["y.rows"]), np.uint8).tobytes()
  damaged("y.rows", garbled, r"y\.rows: client 0's rows do not match their checksum")
  counts = np.load(path / "counts.npy")
  shifted = np.concatenate([counts[1:], counts[:1]])  # same total: the sizes still fit
  buffer = __import__("io").BytesIO()
  np.save(buffer, shifted)
  damaged("counts.npy", buffer.getvalue(), r"store\.json: its digest does not match counts")
  damaged("counts.npy", b"garbage", r"counts\.npy: missing or unreadable")
  damaged("checksums.npy", original["checksums.npy"][:-8], r"checksums\.npy: missing or unread")
  damaged("store.json", original["store.json"][:-9], r"store\.json: not a readable store\.json")
  meta = json.loads(original["store.json"])
  del meta["fields"]["x"]["dtype"]
  damaged("store.json", json.dumps(meta).encode(), r"store\.json: not a readable")
  meta = json.loads(original["store.json"])
  meta["fields"]["x"]["dtype"] = "object"
  damaged("store.json", json.dumps(meta).encode(), r"store\.json: its fields")
  fedco.data.ClientStore(path).read(range(K))  # restored: whole again


def _legacy(path):
  """``path``'s store as an older fedco wrote it: no checksums.npy, no format, the digest
  over every client's rows and the counts."""
  store = fedco.data.ClientStore(path)
  digest = hashlib.blake2b(digest_size=16)
  for k in range(store.num_clients):
    for rows in store.read([k]).values():
      digest.update(rows.tobytes())
  digest.update(store.counts.tobytes())
  meta = json.loads((path / "store.json").read_text())
  del meta["format"]
  meta["digest"] = digest.hexdigest()
  (path / "store.json").write_text(json.dumps(meta))
  os.remove(path / "checksums.npy")


def test_an_older_stores_rows_are_verified_once_at_open(tmp_path):
  """No checksums.npy: opening verifies store.json's digest in one pass (a warning says how
  to rewrite it), and reads are then verified as a new store's; damage is refused."""
  clients = _clients()
  path = tmp_path / "old"
  fedco.data.write_store(path, clients)
  _legacy(path)
  with pytest.warns(UserWarning, match=r"older fedco .*write_store\(new_path"):
    old = fedco.data.ClientStore(path)
  np.testing.assert_array_equal(old.read([4])["x"], clients[4]["x"])
  new = fedco.data.write_store(tmp_path / "new", old)  # the rewrite the warning names
  np.testing.assert_array_equal(new.read(range(K))["y"], np.concatenate([c["y"] for c in clients]))
  _edit(path / "x.rows", 8)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    with pytest.raises(ValueError, match=r"store\.json: its digest does not match the rows"):
      fedco.data.ClientStore(path)


class _FullDisk:
  """A file that fails as a file on a full disk does: a write past ``room`` bytes raises
  ENOSPC, and so does closing it while data are still buffered."""

  def __init__(self, file, room, close_fails=False):
    self.file, self.room, self.name = file, room, file.name
    self.close_fails = close_fails

  def write(self, data):
    self.room -= memoryview(data).nbytes
    if self.room < 0:
      raise OSError(errno.ENOSPC, "No space left on device")
    return self.file.write(data)

  def flush(self):
    if self.room < 0 or self.close_fails:
      raise OSError(errno.ENOSPC, "No space left on device")
    self.file.flush()

  def fileno(self):
    return self.file.fileno()

  def close(self):
    self.file.close()
    if self.room < 0 or self.close_fails:
      raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("where", ["rows", "close", "counts", "checksums"])
def test_write_store_on_a_full_disk_leaves_nothing(tmp_path, monkeypatch, where):
  """Whole or absent: the disk fills while rows are written, when the buffered rows reach
  the disk at close, or while counts.npy / checksums.npy are written."""
  real_open = open

  def full_open(name, mode="r", *args, **kwargs):
    room = 100 if where == "rows" else 10**9
    close_fails = where == "close" and name.endswith("y.rows")  # buffered bytes that do not fit
    return _FullDisk(real_open(name, mode, *args, **kwargs), room, close_fails)

  real_atomic = store_lib.io.atomic_write

  def full_atomic(path, data, **kwargs):
    if os.path.basename(path) == f"{where}.npy":
      raise OSError(errno.ENOSPC, "No space left on device")
    return real_atomic(path, data, **kwargs)

  monkeypatch.setattr(store_lib, "open", full_open, raising=False)
  monkeypatch.setattr(store_lib.io, "atomic_write", full_atomic)
  with pytest.raises(OSError, match="No space left"):
    fedco.data.write_store(tmp_path / "a" / "store", _clients())
  assert os.listdir(tmp_path) == []  # the folders it created go too


def test_write_store_refuses_what_it_cannot_read_back(tmp_path):
  clients = _clients()
  for bad, match in [
    ([{**clients[0], "name": np.array(["a", "b", "c"])}], r"clients\[0\]\['name'\] has dtype <U1"),
    (
      [clients[0], {**clients[1], "x": clients[1]["x"].astype(object)}],
      r"clients\[1\]\['x'\] has dtype object; a store holds numeric or bool arrays only",
    ),
    ([{**clients[0], "w": np.float32(1.0)}], r"clients\[0\]\['w'\] must be an array with a lead"),
    ([{**clients[0], "../x": clients[0]["x"]}], r"field name '\.\./x'"),
    ([], r"clients must hold at least one client"),
  ]:
    with pytest.raises(ValueError, match=match):
      fedco.data.write_store(tmp_path / "new" / "store", bad)
    assert not os.path.exists(tmp_path / "new")  # nothing it created stays, parents included
  (tmp_path / "file").write_text("mine")
  with pytest.raises(ValueError, match=r"is a file; write_store makes a new folder"):
    fedco.data.write_store(tmp_path / "file", clients)

  def interrupted():
    yield clients[0]
    raise KeyboardInterrupt

  with pytest.raises(KeyboardInterrupt):
    fedco.data.write_store(tmp_path / "new", interrupted())
  assert sorted(os.listdir(tmp_path)) == ["file"]


def test_a_failed_write_store_removes_the_folders_it_made_and_only_those(tmp_path, monkeypatch):
  """A path through ``..`` (its folders on the way go too); a parent another job creates
  while this call creates the folders stays (it is not this call's); a Ctrl-C while the
  folders are created leaves none."""
  with pytest.raises(ValueError, match="at least one client"):
    fedco.data.write_store(tmp_path / "new" / "sub" / ".." / "store", [])
  assert os.listdir(tmp_path) == []
  real_mkdir = os.mkdir

  def parallel_job_first(path, *args, **kwargs):  # the other job makes out/ first
    if os.path.basename(os.fspath(path)) == "out" and not os.path.exists(path):
      real_mkdir(path)
    return real_mkdir(path, *args, **kwargs)

  monkeypatch.setattr(os, "mkdir", parallel_job_first)
  with pytest.raises(ValueError, match="at least one client"):
    fedco.data.write_store(tmp_path / "out" / "store", [])
  assert os.listdir(tmp_path) == ["out"] and os.listdir(tmp_path / "out") == []
  os.rmdir(tmp_path / "out")

  def interrupted(path, *args, **kwargs):  # Ctrl-C once the first level exists
    if os.path.basename(os.fspath(path)) == "store":
      raise KeyboardInterrupt
    return real_mkdir(path, *args, **kwargs)

  monkeypatch.setattr(os, "mkdir", interrupted)
  with pytest.raises(KeyboardInterrupt):
    fedco.data.write_store(tmp_path / "a" / "b" / "store", _clients())
  assert os.listdir(tmp_path) == []


def test_read_refuses_ids_that_are_not_integers(tmp_path):
  store = fedco.data.write_store(tmp_path / "s", _clients())
  for ids, match in [
    ([1.5], r"ids must be integer client ids in \[0, 6\), got float64"),
    ([True], r"ids must be integer client ids"),
    (1, r"ids must be a 1-D sequence"),
    ([6], r"ids must lie in \[0, 6\)"),
  ]:
    with pytest.raises(ValueError, match=match):
      store.read(ids)
  assert store.read([])["x"].shape == (0, 4)


# ---- orbax's log lines held back, and only orbax's -----------------------------------------


def test_a_restore_drops_orbaxs_log_lines_and_keeps_the_users(tmp_path, caplog, monkeypatch):
  """A damaged checkpoint's metadata makes orbax log "Failed to json parse"; a user's own
  absl line logged while the restore runs is kept."""
  ckpt = checkpoint.Checkpointer(tmp_path)
  template = {"w": np.arange(4.0, dtype=np.float32)}
  for r in (1, 2):
    ckpt.save(r, template, {"objective": np.zeros(r)})
  ckpt.close()
  (tmp_path / "2" / "_CHECKPOINT_METADATA").write_text("garbage{")
  real = checkpoint.Checkpointer._restore_one

  def restore_one(self, *args):
    absl_logging.warning("the user's own line")
    return real(self, *args)

  monkeypatch.setattr(checkpoint.Checkpointer, "_restore_one", restore_one)
  with caplog.at_level(logging.DEBUG, logger="absl"), warnings.catch_warnings():
    warnings.simplefilter("ignore")
    ckpt = checkpoint.Checkpointer(tmp_path)
    assert ckpt.restore(template)[0] == 2
    ckpt.close()
  loud = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
  assert loud == ["the user's own line"], caplog.text


def test_overlapping_quiet_uses_leave_absl_logging_as_it_was(caplog):
  """Two threads' restores overlapping (entered A, B; ended A, B): once both end, nothing is
  held back (the level the first saved and the second restored stayed at CRITICAL)."""
  absl = logging.getLogger("absl")
  level = absl.level
  first, second = checkpoint._quiet(), checkpoint._quiet()
  first.__enter__()
  second.__enter__()
  first.__exit__(None, None, None)
  absl_logging.warning("between")  # a user's line while the other restore runs
  second.__exit__(None, None, None)
  absl_logging.warning("after")
  assert absl.level == level and not absl.filters
  assert [r.getMessage() for r in caplog.records] == ["between", "after"], caplog.text
