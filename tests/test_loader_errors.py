"""The natural-data loaders refuse what they cannot read truthfully, in one line naming the
file, the user or client, and the problem (issue 44's probe: fractional labels truncated,
NumPy's and SQLite's own messages, a NULL blob's TypeError, a locked database called "not a
SQLite file", an empty LEAF folder's ``max()`` error). Files are written by hand in the
upstream formats (LEAF JSON; FedJAX's SQLite table, built without its NOT NULL constraints
where a hand-made table may lack them)."""

import json
import os
import sqlite3
import zlib

import msgpack
import numpy as np
import pytest

import fedco


def _blob(examples):
  def ext(value):
    payload = (value.shape, value.dtype.name, value.tobytes("C"))
    return msgpack.ExtType(1, msgpack.packb(payload, use_bin_type=True))

  return zlib.compress(msgpack.packb(examples, default=ext, strict_types=True))


def _sqlite(path, rows, constraints=True):
  not_null = " NOT NULL" if constraints else ""
  db = sqlite3.connect(path)
  db.execute(
    f"CREATE TABLE federated_data (client_id BLOB{not_null} PRIMARY KEY, data BLOB{not_null}, "
    f"num_examples INTEGER{not_null})"
  )
  db.executemany("INSERT INTO federated_data VALUES (?, ?, ?)", rows)
  db.commit()
  db.close()
  return str(path)


def _emnist(n, labels=None, pixels=784):
  rng = np.random.default_rng(n)
  label = np.arange(n, dtype=np.int32) if labels is None else np.asarray(labels)
  return {"pixels": rng.random((n, pixels)).astype(np.float32), "label": label}


def _one_line(info, *names):
  text = str(info.value)
  assert "\n" not in text, text
  for name in names:
    assert name in text, (name, text)


def test_sqlite_fractional_and_negative_labels_are_refused_not_truncated(tmp_path):
  for labels, shown in (([0.0, 1.5, 2.7], "1.5"), ([0, -3, 1], "-3")):
    path = _sqlite(
      tmp_path / f"train{shown}.sqlite", [(b"w7", _blob(_emnist(3, np.asarray(labels))), 3)]
    )
    with pytest.raises(ValueError, match=f"labels must be .*integers >= 0.*{shown}") as info:
      fedco.data.load_sqlite(path, path, "emnist")
    _one_line(info, os.path.basename(path), "b'w7'")
  whole = np.asarray([0.0, 1.0, 2.0])  # whole numbers stored as floats are class ids
  path = _sqlite(tmp_path / "whole.sqlite", [(b"w", _blob(_emnist(3, whole)), 3)])
  assert fedco.data.load_sqlite(path, path, "emnist").train.client(0)["y"].tolist() == [0, 1, 2]


def test_sqlite_wrong_pixel_count_names_file_and_client(tmp_path):
  path = _sqlite(tmp_path / "px.sqlite", [(b"w1", _blob(_emnist(2, pixels=700)), 2)])
  with pytest.raises(ValueError, match=r"784 pixels \(28x28\) each, got shape \(2, 700\)") as info:
    fedco.data.load_sqlite(path, path, "emnist")
  _one_line(info, "px.sqlite", "b'w1'")


def test_sqlite_text_client_ids_and_images_with_a_channel_axis_read(tmp_path):
  images = {"pixels": np.zeros((2, 28, 28, 1), np.float32), "label": np.arange(2)}
  path = _sqlite(tmp_path / "text.sqlite", [("writer_7", _blob(images), 2)], False)
  assert [cid for cid, _ in fedco.data.read_clients(path)] == [b"writer_7"]
  fed = fedco.data.load_sqlite(path, path, "emnist")
  assert fed.train.examples["x"].shape == (2, 28, 28, 1)


def test_sqlite_null_cells_a_folder_and_a_locked_file(tmp_path):
  path = _sqlite(tmp_path / "null.sqlite", [(b"a", None, 2), (b"b", b"x", None)], False)
  with pytest.raises(ValueError, match="its data is NULL") as info:
    list(fedco.data.read_clients(path))
  _one_line(info, "null.sqlite", "b'a'")
  with pytest.raises(ValueError, match="its num_examples is NULL"):
    list(fedco.data.read_clients(path, client_ids=[b"b"]))
  with pytest.raises(ValueError, match="is a folder, not a FedJAX .sqlite") as info:
    list(fedco.data.read_clients(tmp_path))
  _one_line(info, str(tmp_path))
  good = _sqlite(tmp_path / "locked.sqlite", [(b"a", _blob(_emnist(2)), 2)])
  holder = sqlite3.connect(good, timeout=0.1)
  holder.execute("BEGIN EXCLUSIVE")  # another program writing the file
  try:
    with pytest.raises(ValueError, match="locked by another program") as info:
      list(fedco.data.read_clients(good))
    _one_line(info, "locked.sqlite")
  finally:
    holder.rollback()
    holder.close()
  assert [cid for cid, _ in fedco.data.read_clients(good)] == [b"a"]


def _leaf(root, split, users):
  os.makedirs(os.path.join(root, split), exist_ok=True)
  content = {
    "users": list(users),
    "num_samples": [len(u["y"]) for u in users.values()],
    "user_data": users,
  }
  with open(os.path.join(root, split, "data.json"), "w") as f:
    json.dump(content, f)


def test_leaf_with_no_users_names_the_folder(tmp_path):
  _leaf(str(tmp_path), "train", {})
  _leaf(str(tmp_path), "test", {})
  for dataset in ("synthetic", "femnist"):
    with pytest.raises(ValueError, match="its LEAF files list no users") as info:
      fedco.data.load_leaf(tmp_path, dataset)
    _one_line(info, os.path.join(str(tmp_path), "train"))


@pytest.mark.parametrize(
  "x, match",
  [
    ([[0.5] * 700], r"got shape \(1, 700\)"),
    ([[0.5] * 784, [0.5] * 783], "rows of different lengths"),
  ],
)
def test_leaf_femnist_wrong_pixels_name_file_and_user(tmp_path, x, match):
  good = {"u": {"x": [[0.5] * 784], "y": [3]}}
  _leaf(str(tmp_path), "train", {**good, "f0042_17": {"x": x, "y": [1] * len(x)}})
  _leaf(str(tmp_path), "test", good)
  with pytest.raises(ValueError, match=match) as info:
    fedco.data.load_leaf(tmp_path, "femnist")
  _one_line(info, "data.json", "train user 'f0042_17'", "784 pixels")
