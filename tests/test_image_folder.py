"""Image folders (issue 47): ``split/<class>/<file>`` in a folder or a ``.tar(.gz)``, written
here in that layout; damaged ones refused in one line naming the file; the shared CIFAR-10
(JPEG) archive's counts against its README whenever ``../shared/data/cifar10_jpeg`` is
present."""

import io
import os
import tarfile

import ml_collections
import numpy as np
import pytest
from PIL import Image

import fedco
from fedco.data import image_folder
from tests import helpers

SHARED = str(helpers.SHARED_DATA / "cifar10_jpeg" / "cifar10_jpeg.tar.gz")


def _image(value, shape=(4, 4, 3), fmt="PNG") -> bytes:
  out = io.BytesIO()
  Image.fromarray(np.full(shape, value, np.uint8)).save(out, fmt)
  return out.getvalue()


FILES = {
  "train/dog/0001.png": _image(200),
  "train/cat/0001.png": _image(10),
  "train/cat/0000.png": _image(0),
  "test/dog/0000.png": _image(255),
}


def _tar(path, files, mode="w:gz"):
  with tarfile.open(path, mode) as tar:
    for name, data in files.items():
      info = tarfile.TarInfo(name)
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
  return path


def _folder(root, files):
  for name, data in files.items():
    os.makedirs(os.path.join(root, os.path.dirname(name)), exist_ok=True)
    with open(os.path.join(root, name), "wb") as f:
      f.write(data)
  return root


@pytest.mark.parametrize("kind", ["folder", "tar.gz", "tar"])
def test_rows_labels_and_scale_are_the_same_from_a_folder_or_an_archive(tmp_path, kind):
  if kind == "folder":
    path = _folder(tmp_path / "images", FILES)
  else:
    path = _tar(tmp_path / f"images.{kind}", FILES, "w:gz" if kind == "tar.gz" else "w")
  train = image_folder.load_image_folder(path, "train")
  assert train["y"].tolist() == [0, 0, 1]  # cat, cat, dog: classes sorted, then files
  np.testing.assert_array_equal(np.round(train["x"][:, 0, 0, 0] * 255), [0, 10, 200])
  assert train["x"].dtype == np.float32 and train["x"].shape == (3, 4, 4, 3)
  test = image_folder.load_image_folder(path, "test", classes=["cat", "dog"])
  assert test["y"].tolist() == [1] and float(test["x"].max()) == 1.0
  assert image_folder.is_image_folder(path)


def test_grey_images_keep_one_channel_and_jpeg_decodes(tmp_path):
  files = {
    "train/a/0.png": _image(7, (5, 6)),
    "train/b/0.jpg": _image(128, (5, 6), "JPEG"),
  }
  data = image_folder.load_image_folder(_folder(tmp_path, files), "train")
  assert data["x"].shape == (2, 5, 6, 1) and abs(float(data["x"][1].mean()) * 255 - 128) < 2


def test_load_reads_an_image_folder_as_a_tfds_name_s_splits(tmp_path):
  path = _tar(tmp_path / "cifar.tar.gz", FILES)
  train, test = fedco.data.load("cifar10", path)
  assert train["y"].tolist() == [0, 0, 1] and test["y"].tolist() == [1]
  many = {f"train/c{i:02d}/0.png": _image(i) for i in range(11)}
  many["test/c00/0.png"] = _image(0)
  with pytest.raises(ValueError, match="holds 11 class folders; cifar10 has 10"):
    fedco.data.load("cifar10", _tar(tmp_path / "many.tar", many, "w"))
  assert not image_folder.is_image_folder(tmp_path)  # a TFDS data_dir stays one
  # figures and summaries say where the data came from (a JPEG copy is not TFDS's)
  assert fedco.data.sources.describe("cifar10", path) == "cifar10 from cifar.tar.gz"
  assert fedco.data.sources.describe("cifar10", tmp_path) == "cifar10"
  from experiments import imbalanced_cifar  # pylint: disable=g-import-not-at-top

  named = imbalanced_cifar._name(
    ml_collections.ConfigDict({"dataset": "cifar10", "data_dir": path})
  )
  assert named == "cifar10-ST from cifar.tar.gz"


@pytest.mark.parametrize(
  "files, message",
  [
    ({"train/cat/0.png": b"garbage"}, r"train/cat/0\.png is not a readable image"),
    ({"train/cat/0.png": _image(0)[:40]}, r"train/cat/0\.png is not a readable image"),
    (
      {"train/cat/0.png": _image(0), "train/dog/0.png": _image(0, (5, 4, 3))},
      r"train/dog/0\.png is \(5, 4, 3\), the first image \(4, 4, 3\)",
    ),
    ({"test/cat/0.png": _image(0)}, r"no images under train/<class>/"),
  ],
)
def test_damaged_images_and_layouts_are_one_line_naming_the_file(tmp_path, files, message):
  path = _tar(tmp_path / "x.tar.gz", files)
  with pytest.raises(ValueError, match=message) as raised:
    image_folder.load_image_folder(path, "train")
  assert "x.tar.gz" in str(raised.value) and "\n" not in str(raised.value)


def test_damaged_archives_missing_paths_and_unknown_classes(tmp_path):
  (tmp_path / "bad.tar.gz").write_bytes(b"\x1f\x8b not really gzip")
  with pytest.raises(ValueError, match=r"bad\.tar\.gz: (not a readable tar|damaged)"):
    image_folder.load_image_folder(tmp_path / "bad.tar.gz", "train")
  whole = _tar(tmp_path / "whole.tar.gz", {**FILES, "train/cat/big.png": _image(0, (64, 64, 3))})
  cut = tmp_path / "cut.tar.gz"
  cut.write_bytes(whole.read_bytes()[: len(whole.read_bytes()) // 2])
  with pytest.raises(ValueError, match=r"cut\.tar\.gz: (not a readable tar|damaged)"):
    image_folder.load_image_folder(cut, "train")
  with pytest.raises(FileNotFoundError, match="does not exist"):
    image_folder.load_image_folder(tmp_path / "nowhere.tar", "train")
  with pytest.raises(ValueError, match=r"class folders \['dog'\] of train/ are not in"):
    image_folder.load_image_folder(whole, "train", classes=["cat"])


@pytest.mark.skipif(not os.path.isfile(SHARED), reason="no ../shared/data/cifar10_jpeg here")
def test_the_shared_cifar10_jpeg_archive_has_the_readme_s_counts():
  """README: 50,000 train and 10,000 test images, 5,000 / 1,000 a class, CIFAR-10's label
  order sorted (names only: decoding all takes about 40 s)."""
  counts = {}
  with tarfile.open(SHARED) as tar:
    for member in tar:
      parts = member.name.split("/")
      if member.isfile() and len(parts) == 3:
        counts[(parts[0], parts[1])] = counts.get((parts[0], parts[1]), 0) + 1
  classes = sorted({c for _, c in counts})
  assert classes == [
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"
  ]  # fmt: skip
  assert {counts["train", c] for c in classes} == {5000}
  assert {counts["test", c] for c in classes} == {1000}
