"""TFF's HDF5 client data and Shakespeare preprocessed as TFF does it.

The files are written here with h5py in TFF's layout (``examples/<client>/snippets``, byte
strings both as the published files store them, fixed-length, and variable-length), and
the preprocessing is checked on snippets worked out by hand. The project's copy of TFF's
Shakespeare is checked against its README's counts when ``../shared/data`` is present.
"""

import os
import warnings

import h5py
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedco
from fedco.data import tff
from tests import helpers

SHARED = str(helpers.SHARED_DATA / "shakespeare_tff")
A, Y, BANG, D, CR = 71, 70, 79, 1, 86  # ids of "A", "y", "!", "d", "\r" (index + 1)


def _h5(path, clients, vlen=False):
  """``clients``: {id: [snippet bytes]}, written as TFF's ClientData HDF5 file."""
  with h5py.File(path, "w") as f:
    for client, snippets in clients.items():
      if vlen:
        data = np.array(snippets, dtype=object)
        f.create_dataset(
          f"examples/{client}/snippets", data=data, dtype=h5py.special_dtype(vlen=bytes)
        )
      else:  # as the published files: fixed-length byte strings (|S<longest>)
        f.create_dataset(f"examples/{client}/snippets", data=np.array(snippets, dtype=bytes))
  return path


def test_ids_are_tff_s_vocabulary_with_pad_oov_bos_eos():
  assert (tff.PAD, tff.OOV, tff.BOS, tff.EOS, tff.NUM_CLASSES) == (0, 87, 88, 89, 90)
  assert len(tff.SHAKESPEARE_VOCAB) == len(set(tff.SHAKESPEARE_VOCAB)) == 86
  ex = tff.shakespeare_sequences([b"d\r", b"A~\xc3"], sequence_length=5)
  # [BOS d \r EOS] + 2 pads; [BOS A OOV OOV EOS] + 1 pad: rows of 6
  assert ex["x"].tolist() == [[88, D, CR, 89, 0], [88, A, 87, 87, 89]]
  assert ex["y"].tolist() == [[D, CR, 89, 0, 0], [A, 87, 87, 89, 0]]


def test_a_snippet_is_wrapped_cut_into_rows_of_length_plus_one_and_padded():
  ex = tff.shakespeare_sequences([b"Ay!"], sequence_length=3)
  # [BOS A y ! EOS] is 5 tokens, padded to 8: rows [BOS A y !], [EOS 0 0 0]
  assert ex["x"].tolist() == [[88, A, Y], [89, 0, 0]]
  assert ex["y"].tolist() == [[A, Y, BANG], [0, 0, 0]]
  assert ex["x"].dtype == ex["y"].dtype == np.int32
  # the default length, 80: 79 letters fill one row of 81 exactly; 80 need a second row,
  # which begins with EOS (as TFF's: the target EOS at the boundary is not predicted)
  one = tff.shakespeare_sequences([b"d" * 79])
  assert one["x"].shape == (1, 80) and one["x"][0, 0] == 88 and one["y"][0, -1] == 89
  assert (one["x"][0, 1:] == D).all() and (one["y"][0, :-1] == D).all()
  two = tff.shakespeare_sequences([b"d" * 80])
  assert two["x"].shape == two["y"].shape == (2, 80)
  assert (two["y"][0] == D).all() and two["x"][1].tolist() == [89] + [0] * 79
  assert (two["y"][1] == 0).all()
  # each snippet starts its own rows; an empty snippet is [BOS EOS] and still an example
  many = tff.shakespeare_sequences([b"", b"Ay"], sequence_length=3)
  assert many["x"].tolist() == [[88, 89, 0], [88, A, Y]]
  assert many["y"].tolist() == [[89, 0, 0], [A, Y, 89]]


@pytest.mark.parametrize("vlen", [False, True], ids=["fixed_length", "vlen"])
def test_read_h5_clients_in_tff_s_layout(tmp_path, vlen):
  clients = {"ROMEO": [b"But soft!", b"What light"], "JULIET": [b"Ay me."]}
  path = _h5(str(tmp_path / "train.h5"), clients, vlen=vlen)
  read = list(fedco.data.read_h5_clients(path))
  assert [c for c, _ in read] == ["JULIET", "ROMEO"]  # h5py's order: sorted, as TFF lists
  assert [bytes(s) for s in read[1][1]["snippets"]] == clients["ROMEO"]
  sub = list(fedco.data.read_h5_clients(path, client_ids=["ROMEO"]))
  assert [c for c, _ in sub] == ["ROMEO"]
  # numeric features (TFF's EMNIST: pixels and label) are read as arrays too
  with h5py.File(str(tmp_path / "emnist.h5"), "w") as f:
    f.create_dataset("examples/f0/pixels", data=np.ones((3, 28, 28), np.float32))
    f.create_dataset("examples/f0/label", data=np.array([1, 2, 3], np.int32))
  ((cid, ex),) = fedco.data.read_h5_clients(tmp_path / "emnist.h5")
  assert cid == "f0" and ex["pixels"].shape == (3, 28, 28) and ex["label"].tolist() == [1, 2, 3]


def test_load_keeps_a_client_whose_snippets_are_short(tmp_path):
  long = b"Yes, my good lord; and I will speak no more of it than this. " * 2
  train = {"ADAM": [long, b"Ay."], "EVE": [long]}
  test = {"ADAM": [b"No."], "EVE": [long]}  # ADAM's held-out: 3 letters, 1 sequence
  for vlen in (False, True):
    root = tmp_path / str(vlen)
    root.mkdir()
    _h5(str(root / "shakespeare_train.h5"), train, vlen=vlen)
    _h5(str(root / "shakespeare_test.h5"), test, vlen=vlen)
    with warnings.catch_warnings():
      warnings.simplefilter("error")  # no client dropped, so no warning
      fed = fedco.data.load_shakespeare_tff(root)
    assert fed.info["users"] == ["ADAM", "EVE"] and fed.info["dropped_users"] == 0
    assert fed.num_classes == 90 and fed.train_sizes().tolist() == [3, 2]
    assert fed.val_sizes().tolist() == [1, 2]
    x, y = np.asarray(fed.val.examples["x"]), np.asarray(fed.val.examples["y"])
    np.testing.assert_array_equal(x[0], tff.shakespeare_sequences([b"No."])["x"][0])
    assert x.shape == y.shape == (3, 80) and y[0, :4].tolist() == [
      tff.SHAKESPEARE_VOCAB.index("N") + 1,
      tff.SHAKESPEARE_VOCAB.index("o") + 1,
      tff.SHAKESPEARE_VOCAB.index(".") + 1,
      89,
    ]
    np.testing.assert_array_equal(fed.test["y"], y)
  # train_path / test_path, and max_clients
  fed = fedco.data.load_shakespeare_tff(
    train_path=root / "shakespeare_train.h5",
    test_path=root / "shakespeare_test.h5",
    max_clients=1,
    sequence_length=20,
  )
  assert fed.info["users"] == ["ADAM"] and fed.train.examples["x"].shape[1:] == (20,)


def test_the_sqlite_path_gives_the_same_clients_with_preprocess_tff(tmp_path):
  long = b"Yes, my good lord; and I will speak no more of it than this. " * 2
  train = {"ADAM": [long, b"Ay."], "EVE": [long]}
  test = {"ADAM": [b"No."], "EVE": [long]}
  for split, clients in (("train", train), ("test", test)):
    _h5(str(tmp_path / f"shakespeare_{split}.h5"), clients)
    fedco.data.write_clients(
      str(tmp_path / f"{split}.sqlite"),
      {k.encode(): {"snippets": np.array(v, dtype=object)} for k, v in clients.items()},
    )
  paths = str(tmp_path / "train.sqlite"), str(tmp_path / "test.sqlite")
  sql = fedco.data.load_sqlite(*paths, "shakespeare", preprocess="tff")
  h5 = fedco.data.load_shakespeare_tff(tmp_path)
  assert sql.info["users"] == [b"ADAM", b"EVE"] and sql.num_classes == h5.num_classes == 90
  for part in ("train", "val"):
    for key in ("x", "y"):
      np.testing.assert_array_equal(
        getattr(sql, part).examples[key], getattr(h5, part).examples[key]
      )
  # the default (LEAF's windows) is unchanged: ADAM's 3-letter held-out snippet has none
  with pytest.warns(UserWarning, match="1 of 2 users"):
    windows = fedco.data.load_sqlite(*paths, "shakespeare")
  assert windows.info["users"] == [b"EVE"] and windows.num_classes == 81
  with pytest.raises(ValueError, match="preprocess='tff' is for dataset='shakespeare' only"):
    fedco.data.load_sqlite(*paths, "emnist", preprocess="tff")


def _refused(error, match, fn, *args, **kwargs):
  with pytest.raises(error, match=match) as info:
    fn(*args, **kwargs)
  assert "\n" not in str(info.value)
  return str(info.value)


def test_damaged_and_absent_files_are_refused_in_one_line(tmp_path):
  read = lambda p, **kw: list(fedco.data.read_h5_clients(p, **kw))  # noqa: E731
  _refused(FileNotFoundError, "does not exist", read, tmp_path / "none.h5")
  _refused(ValueError, "is a folder, not a TFF HDF5", read, tmp_path)
  text = tmp_path / "text.h5"
  text.write_text("client,snippet\n")
  _refused(ValueError, r"text\.h5: not an HDF5 file", read, text)
  good = _h5(str(tmp_path / "good.h5"), {"A": [b"x" * 5000], "B": [b"y"]})
  cut = tmp_path / "cut.h5"
  cut.write_bytes(open(good, "rb").read()[:3000])  # truncated: the header survives
  _refused(ValueError, r"cut\.h5: ", read, cut)
  with h5py.File(tmp_path / "flat.h5", "w") as f:
    f.create_dataset("snippets", data=[b"a"])
  _refused(ValueError, r"flat\.h5: no 'examples' group .* holds \['snippets'\]", read,
           tmp_path / "flat.h5")  # fmt: skip
  with h5py.File(tmp_path / "empty.h5", "w") as f:
    f.create_group("examples/ADAM")
  _refused(ValueError, r"empty\.h5: client 'ADAM' has no features", read, tmp_path / "empty.h5")
  with h5py.File(tmp_path / "ragged.h5", "w") as f:
    f.create_dataset("examples/ADAM/snippets", data=[b"a", b"b"])
    f.create_dataset("examples/ADAM/line", data=[1])
  _refused(ValueError, r"ragged\.h5: client 'ADAM': .*one row per example", read,
           tmp_path / "ragged.h5")  # fmt: skip
  _refused(ValueError, r"client_ids names 'C'", read, good, client_ids=["A", "C"])
  # Shakespeare's own checks: a client without snippets, snippets that are not text
  with h5py.File(tmp_path / "numbers.h5", "w") as f:
    f.create_dataset("examples/ADAM/snippets", data=np.arange(3.0))
  load = fedco.data.load_shakespeare_tff
  _refused(ValueError, r"numbers\.h5: client 'ADAM': snippets must be a 1-D array of byte",
           load, train_path=tmp_path / "numbers.h5", test_path=good)  # fmt: skip
  _refused(ValueError, r"ragged\.h5: client 'ADAM'", load, train_path=tmp_path / "ragged.h5",
           test_path=good)  # fmt: skip
  with h5py.File(tmp_path / "emnist.h5", "w") as f:
    f.create_dataset("examples/ADAM/label", data=[1])
  _refused(ValueError, r"emnist\.h5: client 'ADAM' has the features \['label'\], not 'snippets'",
           load, train_path=tmp_path / "emnist.h5", test_path=good)  # fmt: skip
  _refused(FileNotFoundError, "data_dir .* is not a folder", load, tmp_path / "absent")
  _refused(FileNotFoundError, r"shakespeare_train\.h5.* does not exist", load, tmp_path)
  _refused(ValueError, "not both", load, tmp_path, train_path=good, test_path=good)
  _refused(ValueError, "go together", load, train_path=good)
  _refused(ValueError, "sequence_length", load, train_path=good, test_path=good, sequence_length=0)


def test_from_users_sequence_labels_are_checked_naming_the_user():
  def user(n, length):
    return {"x": np.zeros((n, length), np.int32), "y": np.ones((n, length), np.int32)}

  fed = fedco.data.from_users(
    {"a": user(2, 4)}, {"a": user(1, 4)}, name="s", num_classes=2, sequence_labels=True
  )
  assert fed.train.examples["y"].shape == (2, 4)
  _refused(ValueError, r"test_users\['a'\]\.y has rows of shape \(3,\)", fedco.data.from_users,
           {"a": user(2, 4)}, {"a": user(1, 3)}, name="s", num_classes=2,
           sequence_labels=True)  # fmt: skip
  _refused(ValueError, r"train_users\['a'\]\.y must be integer class ids, one row per example",
           fedco.data.from_users, {"a": {"x": np.zeros((2, 4)), "y": np.zeros((2, 4))}},
           {"a": user(1, 4)}, name="s", num_classes=2, sequence_labels=True)  # fmt: skip
  _refused(ValueError, r"must lie in \[0, num_classes=2\)", fedco.data.from_users,
           {"a": {"x": np.zeros((2, 4)), "y": np.full((2, 4), 2)}}, {"a": user(1, 4)},
           name="s", num_classes=2, sequence_labels=True)  # fmt: skip


def test_accuracy_leaves_out_pad_oov_bos_eos():
  y = jnp.array([A, Y, tff.OOV, tff.BOS, tff.EOS, tff.PAD, BANG, D])
  right = jax.nn.one_hot(y, tff.NUM_CLASSES)
  assert float(fedco.data.shakespeare_accuracy(right, y)) == 1.0
  # wrong on every masked target: still 1.0; wrong on 1 of the 4 characters: 0.75
  wrong = jnp.array([A, Y, 5, 5, 5, 5, BANG, D])
  assert float(fedco.data.shakespeare_accuracy(jax.nn.one_hot(wrong, 90), y)) == 1.0
  wrong = wrong.at[1].set(A)
  assert float(fedco.data.shakespeare_accuracy(jax.nn.one_hot(wrong, 90), y)) == 0.75
  # nothing scored: 0.0, never NaN; the weight for pooling is the scored count
  pad = jnp.array([tff.EOS, 0, 0])
  assert float(fedco.data.shakespeare_accuracy(jax.nn.one_hot(pad, 90), pad)) == 0.0
  assert tff.shakespeare_scored(np.asarray(y)).tolist() == [1, 1, 0, 0, 0, 0, 1, 1]
  # per example, vmapped and jitted as fedco's metrics call it
  batch = jnp.stack([y, y.at[0].set(tff.PAD)])
  hits = jax.jit(jax.vmap(fedco.data.shakespeare_accuracy))(jax.nn.one_hot(wrong, 90)[None]
                                                            .repeat(2, 0), batch)  # fmt: skip
  np.testing.assert_allclose(hits, [0.75, 2 / 3], rtol=1e-6)


@pytest.mark.skipif(not os.path.isdir(SHARED), reason="no ../shared/data/shakespeare_tff here")
def test_the_shared_copy_has_the_readme_s_counts_and_keeps_all_715_roles():
  files = [os.path.join(SHARED, f) for f in tff.SHAKESPEARE_FILES]
  counts = []
  for path in files:
    clients = {c: len(x["snippets"]) for c, x in fedco.data.read_h5_clients(path)}
    counts.append((len(clients), sum(clients.values())))
  assert counts == [(715, 16_068), (715, 2_356)]
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    fed = fedco.data.load_shakespeare_tff(SHARED)
  assert fed.num_clients == 715 and fed.info["dropped_users"] == 0
  assert fed.info["users"][0] == "ALL_S_WELL_THAT_ENDS_WELL_ADAM"
  assert fed.train_sizes().min() >= 1 and fed.val_sizes().min() >= 1
  y = np.asarray(fed.train.examples["y"])
  assert y.shape[1:] == (80,) and 0 <= y.min() and y.max() < 90
