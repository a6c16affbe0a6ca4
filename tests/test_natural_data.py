"""Naturally partitioned data: LEAF JSON, FedJAX SQLite, TFDS with a client key, Synthetic.

Each loader reads files the tests write in the upstream format, written here by hand (json
and sqlite3 + msgpack, not fedco's writers), and refuses damaged ones with one line naming
the file and the problem.
"""

import json
import os
import sqlite3
import warnings
import zlib

import jax.numpy as jnp
import msgpack
import numpy as np
import pytest
import tensorflow_datasets as tfds

import fedco
from fedco.data import LETTERS
from tests import helpers


def _leaf_file(path, users):
  content = {
    "users": list(users),
    "num_samples": [len(u["y"]) for u in users.values()],
    "user_data": users,
  }
  with open(path, "w") as f:
    json.dump(content, f)


def _leaf_dir(root, train_files, test_files):
  for split, files in (("train", train_files), ("test", test_files)):
    os.makedirs(os.path.join(root, split), exist_ok=True)
    for i, users in enumerate(files):
      _leaf_file(os.path.join(root, split, f"all_data_{i}_niid_05_keep_0_{split}_9.json"), users)
  return root


def _femnist_user(rng, n):
  # LEAF: 784 floats in [0, 1] per image, 1.0 the white background; labels 0..61
  return {"x": rng.random((n, 784)).round(3).tolist(), "y": rng.integers(0, 62, n).tolist()}


def test_leaf_femnist_one_client_per_writer_in_file_order(tmp_path):
  rng = np.random.default_rng(0)
  train = [
    {"f0001_12": _femnist_user(rng, 4), "f0002_31": _femnist_user(rng, 2)},
    {"f0100_07": _femnist_user(rng, 3)},
  ]
  test = [{"f0001_12": _femnist_user(rng, 1), "f0002_31": _femnist_user(rng, 1)}, {}]
  test[1]["f0100_07"] = _femnist_user(rng, 2)
  fed = fedco.data.load_leaf(_leaf_dir(str(tmp_path), train, test), "femnist")
  assert fed.info["users"] == ["f0001_12", "f0002_31", "f0100_07"]
  assert fed.num_classes == 62
  np.testing.assert_array_equal(fed.train.counts, [4, 2, 3])
  np.testing.assert_array_equal(fed.val.counts, [1, 1, 2])
  second = fed.train.client(1)
  raw = np.asarray(train[0]["f0002_31"]["x"], np.float32).reshape(-1, 28, 28, 1)
  np.testing.assert_allclose(second["x"], 1.0 - raw)  # ink 1.0, like fedco's MNIST
  np.testing.assert_array_equal(second["y"], train[0]["f0002_31"]["y"])
  np.testing.assert_array_equal(fed.test["y"][-2:], test[1]["f0100_07"]["y"])


def test_leaf_shakespeare_letters_and_its_miscounted_test_files(tmp_path):
  text = "To be, or not to be, that is the question: Whether 'tis nobler in the mind to suffer"
  x = [text[i : i + 80] for i in range(4)]
  y = [text[i + 80] for i in range(4)]
  train = {"THE_TRAGEDY_OF_HAMLET_HAMLET": {"x": x[:3], "y": y[:3]}}
  test = {"THE_TRAGEDY_OF_HAMLET_HAMLET": {"x": x[3:], "y": ["~"]}}
  root = _leaf_dir(str(tmp_path), [train], [test])
  path = os.path.join(root, "test", os.listdir(os.path.join(root, "test"))[0])
  content = json.load(open(path))
  content["num_samples"] = [80]  # LEAF counts the 79 windows its split skips
  json.dump(content, open(path, "w"))
  fed = fedco.data.load_leaf(root, "shakespeare")
  assert fed.num_classes == 81
  client = fed.train.client(0)
  assert client["x"].shape == (3, 80)
  assert "".join(LETTERS[i] for i in client["x"][0]) == text[:80]
  assert [LETTERS[i] for i in client["y"]] == y[:3]
  assert fed.val.client(0)["y"].tolist() == [80]  # "~" is not in LEAF's alphabet


def test_leaf_sent140_words_from_the_training_tweets(tmp_path):
  def tweet(text, label):
    return ["1467810369", "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", "user", text, "training"]

  train = {"user": {"x": [tweet("good good day", 4), tweet("bad day", 0)], "y": [1, 0]}}
  test = {"user": {"x": [tweet("good unseen", 4)], "y": [1]}}
  fed = fedco.data.load_leaf(
    _leaf_dir(str(tmp_path), [train], [test]), "sent140", vocab_size=4, max_len=3
  )
  # ids: 0 padding, 1 unknown, then by frequency: day (2), good (2) -> 2, 3; bad left out
  np.testing.assert_array_equal(fed.train.client(0)["x"], [[3, 3, 2], [1, 2, 0]])
  np.testing.assert_array_equal(fed.val.client(0)["x"], [[3, 1, 0]])


def test_leaf_refuses_damaged_files_naming_them(tmp_path):
  good = {"u": {"x": [[0.0, 1.0]], "y": [1]}}
  root = _leaf_dir(str(tmp_path), [good], [good])
  bad = os.path.join(root, "train", "zz.json")

  def refused(content, match):
    with open(bad, "w") as f:
      f.write(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(ValueError, match=match) as info:
      fedco.data.load_leaf(root, "synthetic")
    assert "zz.json" in str(info.value) and "\n" not in str(info.value)

  refused('{"users": ["u"], "num_s', "not a JSON file")
  refused({"users": ["v"], "user_data": {}}, r"a LEAF file has keys .* this one has")
  refused({"users": ["v"], "num_samples": [1, 2], "user_data": {}}, "same length")
  refused({"users": ["v"], "num_samples": [1], "user_data": {}}, "user 'v' has no 'x' and 'y'")
  refused(
    {"users": ["v"], "num_samples": [2], "user_data": {"v": {"x": [[1.0]], "y": [0, 1]}}},
    "user 'v' has 1 inputs 'x' but 2 labels 'y'",
  )
  refused({"users": ["u"], "num_samples": [1], "user_data": good}, "user 'u' is also in")
  refused({"users": ["u", "u"], "num_samples": [1, 1], "user_data": good}, "listed twice")
  os.remove(bad)
  os.remove(os.path.join(root, "test", os.listdir(os.path.join(root, "test"))[0]))
  with pytest.raises(FileNotFoundError, match="test' holds no .json files"):
    fedco.data.load_leaf(root, "synthetic")
  with pytest.raises(FileNotFoundError, match="data_dir .* is not a folder"):
    fedco.data.load_leaf(str(tmp_path / "missing"), "synthetic")
  with pytest.raises(ValueError, match="dataset must be one of"):
    fedco.data.load_leaf(root, "celeba")


@pytest.mark.parametrize(
  "user, match",
  [
    ({"x": [[0.0, 1.0], [2.0]], "y": [0, 1]}, "rows of numbers, all of one length"),
    ({"x": [["a", "b"]], "y": [0]}, "rows of numbers"),
    ({"x": [[0.0, 1.0]], "y": ["dog"]}, "labels must be a list of integers >= 0.*'dog'"),
    ({"x": [[0.0, 1.0]], "y": ["0"]}, "labels must be a list of integers >= 0.*'0'"),
    ({"x": [[0.0, 1.0]], "y": [[1, 0]]}, r"labels must be a list of integers >= 0.*\[1, 0\]"),
  ],
)
def test_leaf_vectors_and_labels_of_ones_own_files_are_checked_per_user(tmp_path, user, match):
  good = {"u": {"x": [[0.0, 1.0]], "y": [1]}}
  root = _leaf_dir(str(tmp_path), [{**good, "v": user}], [{**good, "v": good["u"]}])
  with pytest.raises(ValueError, match=f"train user 'v': .*{match}") as info:
    fedco.data.load_leaf(root, "synthetic")
  assert "\n" not in str(info.value)


def test_users_of_ones_own_arrays_are_checked_naming_the_user():
  def user(n, dim=2, label=0):
    return {"x": np.zeros((n, dim), np.float32), "y": np.full(n, label, np.int32)}

  def refused(train, test, match):
    with pytest.raises(ValueError, match=match):
      fedco.data.from_users(train, test, name="mine", num_classes=2)

  refused(
    {"a": user(2), "b": user(3, dim=3)},
    {"a": user(1), "b": user(1)},
    r"train_users\['b'\]\.x has rows of shape \(3,\), the first training user's have \(2,\)",
  )
  refused({"a": user(2)}, {"a": user(1, dim=3)}, r"test_users\['a'\]\.x has rows of shape")
  for y in (np.array([0.0, 1.5]), np.eye(2, dtype=np.int32), np.array(["a", "b"])):
    refused(
      {"a": {"x": np.zeros((2, 2)), "y": y}},
      {"a": user(1)},
      r"train_users\['a'\]\.y must be integer class ids",
    )
  refused(
    {"a": {"x": np.zeros((3, 2)), "y": np.zeros(2, np.int32)}},
    {"a": user(1)},
    r"train_users\['a'\] has 3 rows of 'x' but 2 labels",
  )
  refused({"a": {"x": [[0.0], [1.0, 2.0]], "y": [0, 1]}}, {"a": user(1)}, "different shapes")
  # whole numbers written as floats, and bools, are class ids
  for y in (np.array([0.0, 1.0]), np.array([False, True])):
    fed = fedco.data.from_users(
      {"a": {"x": np.zeros((2, 2), np.float32), "y": y}}, {"a": user(1)}, name="m", num_classes=2
    )
    assert fed.train.examples["y"].tolist() == [0, 1] and fed.train.examples["y"].dtype.kind == "i"
  with pytest.warns(UserWarning, match=r"1 of 2 users .* left out: 'b'"):
    fedco.data.from_users(
      {"a": user(2), "b": user(0)}, {"a": user(1), "b": user(1)}, name="mine", num_classes=2
    )


def test_write_leaf_refuses_what_read_leaf_would(tmp_path):
  with pytest.raises(ValueError, match=r"users\['a'\] has 2 inputs 'x' but 1 labels"):
    fedco.data.write_leaf(tmp_path / "d.json", {"a": {"x": [[0.0], [1.0]], "y": [0]}})
  with pytest.raises(ValueError, match=r"users\['a'\] must hold 'x' and 'y'"):
    fedco.data.write_leaf(tmp_path / "d.json", {"a": {"x": [[0.0]]}})
  with pytest.raises(FileNotFoundError, match="folder .*missing.* does not exist"):
    fedco.data.write_leaf(tmp_path / "missing" / "d.json", {"a": {"x": [[0.0]], "y": [0]}})
  assert not os.listdir(tmp_path)


def test_leaf_user_split_is_refused_and_users_without_held_out_data_dropped(tmp_path):
  one, two = {"a": {"x": [[0.0]], "y": [0]}}, {"b": {"x": [[1.0]], "y": [1]}}
  with pytest.raises(ValueError, match="-t sample, not -t user"):
    fedco.data.load_leaf(_leaf_dir(str(tmp_path / "users"), [one], [two]), "synthetic")
  with pytest.warns(UserWarning, match="1 of 2 users"):
    fed = fedco.data.load_leaf(
      _leaf_dir(str(tmp_path / "samples"), [{**one, **two}], [one]), "synthetic"
    )
  assert fed.info["users"] == ["a"] and fed.info["dropped_users"] == 1


def test_synthetic_is_fedprox_recipe_seeded():
  train, test = fedco.data.synthetic_users(1.0, 1.0, num_users=30, seed=3)
  again, _ = fedco.data.synthetic_users(1.0, 1.0, num_users=30, seed=3)
  other, _ = fedco.data.synthetic_users(1.0, 1.0, num_users=30, seed=4)
  assert list(train) == [f"f_{k:05d}" for k in range(30)]
  np.testing.assert_array_equal(train["f_00007"]["x"], again["f_00007"]["x"])
  assert train["f_00007"]["x"].shape != other["f_00007"]["x"].shape or not np.array_equal(
    train["f_00007"]["x"], other["f_00007"]["x"]
  )
  sizes = np.array([len(train[u]["y"]) + len(test[u]["y"]) for u in train])
  assert sizes.min() >= 50  # lognormal(4, 2) + 50
  for u in train:
    n = len(train[u]["y"]) + len(test[u]["y"])
    assert len(train[u]["y"]) == int(0.9 * n)
  # Sigma = diag(j^-1.2): the variance within a user falls along the coordinates
  x = np.concatenate([train[u]["x"] - train[u]["x"].mean(0) for u in train])
  var = x.var(0)
  np.testing.assert_allclose(var[[0, 9, 59]], np.arange(1, 61)[[0, 9, 59]] ** -1.2, rtol=0.15)
  capped, _ = fedco.data.synthetic_users(1.0, 1.0, num_users=30, max_samples=60, seed=3)
  assert max(len(a["y"]) for a in capped.values()) <= int(0.9 * 60)


def test_synthetic_alpha_and_beta_set_how_much_users_differ():
  def spread(alpha, beta):
    train, _ = fedco.data.synthetic_users(alpha, beta, num_users=40, max_samples=400, seed=0)
    means = np.stack([a["x"].mean(0) for a in train.values()])
    labels = np.stack([np.bincount(a["y"], minlength=10) / len(a["y"]) for a in train.values()])
    return means.mean(1).std(), labels.max(1).mean()

  input_spread_0, _ = spread(0.0, 0.0)
  input_spread_1, _ = spread(0.0, 3.0)
  assert input_spread_1 > 2 * input_spread_0  # beta moves each user's inputs
  fed = fedco.data.synthetic(1.0, 1.0, num_users=5, seed=0)
  assert fed.num_clients == 5 and fed.num_classes == 10 and fed.info["alpha"] == 1.0
  with pytest.raises(ValueError, match="alpha"):
    fedco.data.synthetic_users(-1.0, 1.0)
  with pytest.raises(ValueError, match="train_fraction"):
    fedco.data.synthetic_users(1.0, 1.0, train_fraction=1.0)


def test_synthetic_round_trips_through_leaf_files(tmp_path):
  train, test = fedco.data.synthetic_users(0.5, 0.5, num_users=3, seed=1)
  for split, users in (("train", train), ("test", test)):
    os.mkdir(tmp_path / split)
    fedco.data.write_leaf(tmp_path / split / "data.json", users)
  fed = fedco.data.load_leaf(tmp_path, "synthetic")
  direct = fedco.data.synthetic(0.5, 0.5, num_users=3, seed=1)
  np.testing.assert_array_equal(fed.train.examples["x"], direct.train.examples["x"])
  np.testing.assert_array_equal(fed.val.examples["y"], direct.val.examples["y"])


# FedJAX's format, written by hand: zlib(msgpack({feature: ExtType(1, packb((shape, dtype
# name, bytes)))})), byte-string arrays as ExtType(4, packb((shape, flat list))).
def _fedjax_blob(examples):
  def ext(value):
    if value.dtype == object:
      return msgpack.ExtType(
        4, msgpack.packb((value.shape, list(value.ravel())), use_bin_type=True)
      )
    packed = msgpack.packb((value.shape, value.dtype.name, value.tobytes("C")), use_bin_type=True)
    return msgpack.ExtType(1, packed)

  return zlib.compress(msgpack.packb(examples, default=ext, strict_types=True))


def _fedjax_file(path, clients, table="federated_data"):
  db = sqlite3.connect(path)
  db.execute(
    f"CREATE TABLE {table} (client_id BLOB NOT NULL PRIMARY KEY, data BLOB NOT NULL, "
    "num_examples INTEGER NOT NULL);"
  )
  for cid, examples in clients.items():
    n = len(next(iter(examples.values())))
    db.execute(f"INSERT INTO {table} VALUES (?, ?, ?);", (cid, _fedjax_blob(examples), n))
  db.commit()
  db.close()
  return str(path)


def _emnist_client(rng, n):
  return {
    "pixels": rng.random((n, 28, 28)).astype(np.float32),
    "label": rng.integers(0, 62, n).astype(np.int32),
  }


def test_fedjax_emnist_clients_from_sqlite(tmp_path):
  rng = np.random.default_rng(0)
  ids = [b"0a1b2c3d4e5f6a7b:f0001_12", b"9f8e7d6c5b4a3f2e:f0002_31"]
  train = {ids[0]: _emnist_client(rng, 5), ids[1]: _emnist_client(rng, 3)}
  test = {ids[1]: _emnist_client(rng, 2), ids[0]: _emnist_client(rng, 1)}
  fed = fedco.data.load_sqlite(
    _fedjax_file(tmp_path / "train.sqlite", train),
    _fedjax_file(tmp_path / "test.sqlite", test),
    "emnist",
  )
  assert fed.info["users"] == ids and fed.num_classes == 62
  np.testing.assert_array_equal(fed.train.counts, [5, 3])
  np.testing.assert_array_equal(fed.val.counts, [1, 2])
  np.testing.assert_allclose(
    fed.train.client(1)["x"][..., 0], 1.0 - train[ids[1]]["pixels"]
  )  # FedJAX's preprocessing flips the pixels too
  np.testing.assert_array_equal(fed.val.client(1)["y"], test[ids[1]]["label"])
  only = dict(fedco.data.read_clients(tmp_path / "train.sqlite", client_ids=[ids[1]]))
  assert list(only) == [ids[1]] and only[ids[1]]["label"].dtype == np.int32
  one = fedco.data.load_sqlite(
    tmp_path / "train.sqlite", tmp_path / "test.sqlite", "emnist", max_clients=1
  )
  assert one.info["users"] == ids[:1]


def test_fedjax_shakespeare_and_cifar100_conversions(tmp_path):
  snippet = "Who's there? Nay, answer me. Stand and unfold yourself. Long live the king! " * 2
  clients = {b"KING_LEAR": {"snippets": np.array([snippet.encode()], dtype=object)}}
  path = _fedjax_file(tmp_path / "shakespeare.sqlite", clients)
  fed = fedco.data.load_sqlite(path, path, "shakespeare", stride=10)
  client = fed.train.client(0)
  assert client["x"].shape == (len(range(0, len(snippet) - 80, 10)), 80)
  assert "".join(LETTERS[i] for i in client["x"][1]) == snippet[10:90]
  assert LETTERS[int(client["y"][1])] == snippet[90]
  rng = np.random.default_rng(1)
  images = {
    b"17": {
      "image": rng.integers(0, 256, (3, 32, 32, 3)).astype(np.uint8),
      "label": np.array([5, 77, 3], np.int64),
      "coarse_label": np.array([1, 19, 4], np.int64),
    }
  }
  path = _fedjax_file(tmp_path / "cifar.sqlite", images)
  fed = fedco.data.load_sqlite(path, path, "cifar100", label_key="coarse_label")
  assert fed.num_classes == 20
  np.testing.assert_array_equal(fed.train.client(0)["y"], [1, 19, 4])
  np.testing.assert_allclose(fed.train.client(0)["x"], images[b"17"]["image"] / 255.0, atol=1e-7)


def test_fedjax_files_written_by_fedco_read_like_upstream_ones(tmp_path):
  rng = np.random.default_rng(2)
  clients = {b"a": _emnist_client(rng, 2), b"b": _emnist_client(rng, 4)}
  fedco.data.write_clients(tmp_path / "ours.sqlite", clients)
  _fedjax_file(tmp_path / "theirs.sqlite", clients)
  ours = list(fedco.data.read_clients(tmp_path / "ours.sqlite"))
  theirs = list(fedco.data.read_clients(tmp_path / "theirs.sqlite"))
  assert [c for c, _ in ours] == [c for c, _ in theirs] == [b"a", b"b"]
  for (_, a), (_, b) in zip(ours, theirs):
    np.testing.assert_array_equal(a["pixels"], b["pixels"])


def test_fedjax_refuses_damaged_files_naming_them(tmp_path):
  rng = np.random.default_rng(3)

  def refused(path, match, **kwargs):
    with pytest.raises(ValueError, match=match) as info:
      list(fedco.data.read_clients(path, **kwargs))
    assert os.path.basename(str(path)) in str(info.value) and "\n" not in str(info.value)

  text = tmp_path / "notes.sqlite"
  text.write_text("not a database, just text " * 100)
  refused(text, "not a SQLite file")
  refused(_fedjax_file(tmp_path / "other.sqlite", {}, table="examples"), "no such table")
  path = _fedjax_file(tmp_path / "good.sqlite", {b"a": _emnist_client(rng, 2)})
  refused(path, "does not hold", client_ids=[b"zz"])
  db = sqlite3.connect(path)
  db.execute("INSERT INTO federated_data VALUES (?, ?, ?)", (b"b", b"\x00garbage", 2))
  db.execute(
    "INSERT INTO federated_data VALUES (?, ?, ?)", (b"c", _fedjax_blob(_emnist_client(rng, 3)), 7)
  )
  db.commit()
  db.close()
  refused(path, r"client b'b': its data blob does not decode", client_ids=[b"b"])
  refused(path, r"client b'c': num_examples is 7", client_ids=[b"c"])
  with pytest.raises(FileNotFoundError, match="does not exist"):
    list(fedco.data.read_clients(tmp_path / "missing.sqlite"))
  with pytest.raises(ValueError, match="label_key must be one of"):
    fedco.data.load_sqlite(path, path, "cifar100", label_key="fine")
  with pytest.raises(ValueError, match=r"holds the features .* not 'image': is it FedJAX's"):
    fedco.data.load_sqlite(path, path, "cifar100")  # an EMNIST file


def test_tfds_client_key_groups_records_into_clients():
  with tfds.testing.mock_data(num_examples=80):
    fed = fedco.data.load_tfds_clients("cifar100", "coarse_label", num_classes=100)
    train = fedco.data.load_tfds("cifar100", "train")
  assert fed.info["client_key"] == "coarse_label" and 1 < fed.num_clients <= 20
  assert int(fed.train.counts.sum()) <= 80 and fed.train.examples["x"].dtype == np.float32
  assert fed.train.examples["x"].shape[1:] == train["x"].shape[1:]
  with tfds.testing.mock_data(num_examples=8):
    with pytest.raises(ValueError, match="no feature 'writer'"):
      fedco.data.load_tfds_clients("cifar100", "writer", num_classes=100)


def test_a_federated_dataset_where_simulate_wants_its_parts_is_named():
  user = lambda label: {"x": np.full((2, 2), label, np.float32), "y": np.full(2, label, np.int32)}
  fed = fedco.data.from_users(
    {"a": user(0), "b": user(1)}, {"a": user(0), "b": user(1)}, name="mine", num_classes=2
  )
  loss = lambda w, e: jnp.sum((w - e["x"]) ** 2)
  run = lambda data, **kw: fedco.simulate(
    fedco.plain(loss), fedco.fedavg(0.1, 2), data, jnp.zeros(2), rounds=1, **kw
  )
  with pytest.raises(ValueError, match="got FederatedDataset; pass its .train"):
    run(fed)
  with pytest.raises(ValueError, match="metrics_data .* got a FederatedDataset: pass its .val"):
    run(fed.train, metrics_data=fed, metrics_fn=lambda params, data: {})


FEMNIST = str(helpers.SHARED_DATA / "femnist_leaf_sf005")


@pytest.mark.skipif(not os.path.isdir(FEMNIST), reason="no ../shared/data/femnist_leaf_sf005 here")
def test_the_shared_femnist_copy_has_the_readme_s_writers_and_images():
  """LEAF's FEMNIST (sample fraction 0.05, partial): one client per writer with both splits,
  the counts its README gives (105 writers, 14,708 train and 1,685 test images)."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # test-only writers are left out
    fed = fedco.data.load_leaf(FEMNIST, "femnist")
  assert (fed.num_clients, fed.num_classes) == (105, 62)
  assert (int(fed.train.counts.sum()), int(fed.val.counts.sum())) == (14_708, 1_685)
  assert fed.train.examples["x"].shape[1:] == (28, 28, 1)
  assert int(fed.train.counts.min()) >= 4 and int(fed.train.counts.max()) == 165
