"""Omniglot from the upstream zips (issue 47): small archives written here in the upstream
layout, damaged ones refused in one line, and the shared copy's counts against its README
whenever ``../shared/data/omniglot`` is present."""

import io
import os
import zipfile

import numpy as np
import pytest
from PIL import Image

from fedco.data import omniglot as om
from tests import helpers

SHARED = str(helpers.SHARED_DATA / "omniglot")


def _png(stroke_rows=(), mode="1") -> bytes:
  """A 105x105 upstream drawing: white, with black strokes on ``stroke_rows``."""
  pixels = np.full((105, 105), 255, np.uint8)
  for r in stroke_rows:
    pixels[r, 10:95] = 0
  out = io.BytesIO()
  Image.fromarray(pixels).convert(mode).save(out, "PNG")
  return out.getvalue()


def _write(folder, root, files):
  with zipfile.ZipFile(os.path.join(folder, root + ".zip"), "w") as z:
    z.writestr(f"{root}/", b"")
    for name, data in files.items():
      z.writestr(f"{root}/{name}", data)


def _folder(tmp_path, background=None, evaluation=None):
  _write(
    tmp_path,
    "images_background",
    background
    or {
      "Latin/character02/0102_01.png": _png(range(0, 105)),  # all strokes
      "Latin/character01/0101_02.png": _png(),
      "Latin/character01/0101_01.png": _png(range(50, 56)),
      "Greek/character01/0201_03.png": _png(),
    },
  )
  _write(
    tmp_path,
    "images_evaluation",
    evaluation or {"ULOG/character01/0301_20.png": _png(mode="L")},
  )
  return tmp_path


def test_fields_order_and_ids_follow_the_upstream_layout(tmp_path):
  data = om.load_omniglot_zips(_folder(tmp_path))
  names = [data.alphabet_names[a] for a in data.alphabet]
  assert names == ["Greek", "Latin", "Latin", "Latin", "ULOG"]  # sorted within an archive
  assert data.drawer.tolist() == [3, 1, 2, 1, 20]
  assert data.character.tolist() == [0, 1, 1, 2, 3]  # (alphabet, character folder)
  assert data.background.tolist() == [True, True, True, True, False]
  assert data.alphabet_names == om.ALPHABETS
  assert data.alphabet.tolist() == [om.ALPHABETS.index(n) for n in names]
  assert data.images.shape == (5, 28, 28, 1) and data.images.dtype == np.float32


def test_strokes_are_one_and_resized_as_the_tfds_path(tmp_path):
  data = om.load_omniglot_zips(_folder(tmp_path), image_size=14)
  blank, band, full = data.images[2, ..., 0], data.images[1, ..., 0], data.images[3, ..., 0]
  assert blank.max() == 0.0 and full.mean() > 0.7  # white is 0, strokes 1
  expected = om._to_28(np.asarray(Image.open(io.BytesIO(_png(range(50, 56)))).convert("L")), 14)
  np.testing.assert_array_equal(band, np.multiply(expected, 1.0 / 255.0, dtype=np.float32))
  assert band[7].max() > 0.5 and band[0].max() == 0.0


def test_missing_folder_or_archive_is_named(tmp_path):
  with pytest.raises(FileNotFoundError, match="is not a folder"):
    om.load_omniglot_zips(tmp_path / "nowhere")
  _write(tmp_path, "images_background", {"Latin/character01/0101_01.png": _png()})
  with pytest.raises(FileNotFoundError, match=r"images_evaluation\.zip: missing"):
    om.load_omniglot_zips(tmp_path)


@pytest.mark.parametrize(
  "damage, message",
  [
    ({"Latin/character01/0101_01.png": b"not a png"}, "is not a readable PNG"),
    ({"Latin/character01/0101_01.png": _png()[:60]}, "is not a readable PNG"),
    ({"Latin/0101_01.png": _png()}, "is not images_background/<Alphabet>"),
    ({"Latin/character01/0101.png": _png()}, "is not images_background/<Alphabet>"),
    ({"Klingon/character01/0101_01.png": _png()}, "unknown alphabet 'Klingon'"),
  ],
)
def test_damaged_archives_are_one_line_naming_file_and_entry(tmp_path, damage, message):
  _folder(tmp_path, background=damage)
  with pytest.raises(ValueError, match=message) as raised:
    om.load_omniglot_zips(tmp_path)
  assert "images_background.zip" in str(raised.value) and "\n" not in str(raised.value)


def test_a_file_that_is_not_a_zip_and_an_empty_archive(tmp_path):
  _folder(tmp_path)
  (tmp_path / "images_evaluation.zip").write_bytes(b"PK\x03\x04 truncated")
  with pytest.raises(ValueError, match=r"images_evaluation\.zip: not a readable zip archive"):
    om.load_omniglot_zips(tmp_path)
  _write(tmp_path, "images_evaluation", {})
  with pytest.raises(ValueError, match="holds no images"):
    om.load_omniglot_zips(tmp_path)


def test_bad_image_size_is_refused(tmp_path):
  with pytest.raises(ValueError, match="image_size must be an integer >= 4"):
    om.load_omniglot_zips(_folder(tmp_path), image_size=2)


@pytest.mark.skipif(not os.path.isdir(SHARED), reason="no ../shared/data/omniglot here")
def test_the_shared_copy_has_the_readme_s_counts_and_the_vinyals_split():
  """README: 30 + 20 alphabets, 964 + 659 characters, 19,280 + 13,180 drawings, 20 drawers;
  the Vinyals split by name gives 33 / 5 / 12 (read from the file names: no decoding)."""
  sizes, characters, alphabets = [], set(), set()
  for root in om.ZIPS:
    path = os.path.join(SHARED, root + ".zip")
    with zipfile.ZipFile(path) as z:
      entries = om._zip_entries(z.namelist(), path, root)
    sizes.append(len(entries))
    characters |= {(a, c) for a, c, _, _ in entries}
    alphabets |= {a for a, _, _, _ in entries}
    assert {d for _, _, d, _ in entries} == set(range(1, 21))
  assert sizes == [19280, 13180] and len(characters) == 1623 and alphabets == set(om.ALPHABETS)
  train = set(om.ALPHABETS) - set(om.VINYALS_VAL) - set(om.VINYALS_TEST)
  assert (len(train), len(om.VINYALS_VAL), len(om.VINYALS_TEST)) == (33, 5, 12)
  with zipfile.ZipFile(os.path.join(SHARED, "images_evaluation.zip")) as z:
    name = entries[0][3]
    image = om._read_png(z, "images_evaluation.zip", name, 28)
  assert image.shape == (28, 28) and 0 < (image > 127).mean() < 0.5  # strokes, mostly blank


def test_e4_reads_the_zips_where_its_data_dir_holds_them(tmp_path):
  import ml_collections  # pylint: disable=g-import-not-at-top

  from experiments import omniglot as e4  # pylint: disable=g-import-not-at-top

  config = ml_collections.ConfigDict({"data_dir": str(_folder(tmp_path))})
  data = e4.load(config)
  assert data.drawer is not None and data.images.shape == (5, 28, 28, 1)
  config.data_dir = str(tmp_path / "empty")
  os.mkdir(config.data_dir)
  with pytest.raises(FileNotFoundError, match="holds no upstream images_background.zip"):
    e4.load(config)
