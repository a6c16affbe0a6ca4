r"""Few-shot Omniglot (paper 003 Sec. 5.2, SPEC E4) as federated MAML episodes.

Data
----
:func:`load_omniglot` reads TFDS ``omniglot`` (1623 characters of 50 alphabets, 20 drawings
each) from BOTH its ``train`` split (``images_background``, 30 alphabets, 964 characters) and
its ``test`` split (``images_evaluation``, 20 alphabets, 659 characters) through
``tfds.data_source(..., download=False)``, like :mod:`fedco.data.sources` (no TensorFlow at
run time; a missing or ``tfrecord``-only data set is a ``FileNotFoundError`` that says how to
prepare it: ``tfds build omniglot --file_format=array_record``). Each 105x105 image (black
strokes on white, stored as RGB) is reduced to its first channel, resized to 28x28 with
PIL's Lanczos filter (as MAML's reference code does) and inverted, so strokes are 1 and the
background 0. Characters are numbered ``0..C-1`` over both splits by their ``(alphabet,
label)`` pair (TFDS's ``label`` is already unique over the 1623 characters; the pair also
keeps mock data, whose labels and alphabets are drawn independently, consistent).

Alphabet split (:func:`split_alphabets`)
----------------------------------------
* ``"vinyals"`` (the default, SPEC E4 "33 train / 5 val / 12 test alphabets, Vinyals
  split"): the alphabet-level reading of Vinyals et al. (2016)'s character split as
  distributed with the prototypical-networks code: validation = the 5 background alphabets
  Armenian, Bengali, Early_Aramaic, Hebrew and Mkhedruli_(Georgian) (172 characters); test =
  the 12 evaluation alphabets Kannada, Keble, Malayalam, Manipuri, Mongolian,
  Old_Church_Slavonic_(Cyrillic), Oriya, Sylheti, Syriac_(Serto), Tengwar, Tibetan and ULOG;
  training = the other 33 (25 background alphabets and the evaluation alphabets Angelic,
  Atemayar_Qelisayer, Atlantean, Aurek-Besh, Avesta, Ge_ez, Glagolitic and Gurmukhi).
  Vinyals' character split puts four Gurmukhi characters in its test set; at the alphabet
  level (one client per alphabet) Gurmukhi is wholly a training alphabet, which gives
  paper 003's 33/5/12. Alphabets are identified by name through TFDS's ``alphabet``
  ClassLabel, whose ids are the 50 names sorted (:data:`ALPHABETS`); data sets without real
  names (mock data) use those ids.
* ``"random"``: a seeded permutation of the alphabet ids present in the data, cut into
  ``sizes = (train, val, test)`` (alphabets beyond their sum are unused). Tests use it with
  small sizes.

Both raise ``ValueError`` naming the counts when the data has too few alphabets.

Tasks and episodes
------------------
A class is a ``(character, rotation)`` pair, the rotation a multiple of 90 degrees
(``rotations=True``, paper 003: "we augment the characters by performing rotation
operations"), so an alphabet of ``c`` usable characters has ``4c`` classes. A character is
usable when it has at least ``shots + query`` drawings (every real character has 20, so
``shots + query <= 20``: 5-shot with 15 queries uses all of them); others are skipped. An
``N``-way ``K``-shot task draws ``N`` distinct classes of ONE alphabet, uniformly, in a random
order that is also the label assignment (labels ``0..N-1`` are shuffled per task), and for
each class ``K + Q`` distinct drawings of its character, rotated: ``K`` support and ``Q``
query images. An alphabet with fewer than ``N`` classes raises ``ValueError`` naming it
(the experiment has one client per training alphabet, so dropping one would silently
change the federation; real Omniglot's smallest alphabets have 14 characters, 56 classes).

An **episode** (the example of :mod:`fedco.problems.maml`) holds ``T = tasks_per_episode``
tasks: ``support_x uint8 [T, N*K, 28, 28, 1]``, ``support_y int32 [T, N*K]``,
``query_x uint8 [T, N*Q, 28, 28, 1]``, ``query_y int32 [T, N*Q]`` (images ordered by label)
and ``task_weight float32 [T] = 1/T``. Unlike the sinusoid tasks (:mod:`fedco.data.sinusoid`),
whose slots are fixed task identities, the ``T`` slots of an Omniglot episode are ``T``
independent random tasks of the client's alphabet: the episode IS one meta-batch, so a step
uses one episode (``batch_size=1``), its support sets for the inner map and ITS OWN query
sets for the outer, which needs ``simulate(..., paired_batches=True)`` (otherwise the
runtime draws the outer episode independently and would score the adapted parameters of one
task on the query set of another). Local-SCGD(M)'s tracker ``u`` then keeps one memory per
slot, each averaging adapted parameters over random tasks: paper 003's single inner state
per client ("MOML is ignored due to its requirement of keeping an inner state for each
task"), ``T`` times over.

Images are stored as ``uint8`` (255 = stroke): episodes hold many images (33 clients x 256
episodes x 80 images is 0.5 GB at 5-way 1-shot, 2.7 GB at 20-way 5-shot; four times that in
float32), and fedco refuses float16. The model wrapper divides by 255 (see
``experiments/omniglot.py``).

Clients have a finite pool of ``episodes_per_client`` pre-drawn episodes (the runtime
gathers rows by index); everything is a function of ``seed``.
"""

from __future__ import annotations

import os
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from fedco.data import sources
from fedco.data.federated import FederatedData

NAME = "omniglot"
IMAGE_SIZE = 28
ROTATIONS = 4  # multiples of 90 degrees
SPLITS = ("vinyals", "random")

BACKGROUND_ALPHABETS = (
  "Alphabet_of_the_Magi",
  "Anglo-Saxon_Futhorc",
  "Arcadian",
  "Armenian",
  "Asomtavruli_(Georgian)",
  "Balinese",
  "Bengali",
  "Blackfoot_(Canadian_Aboriginal_Syllabics)",
  "Braille",
  "Burmese_(Myanmar)",
  "Cyrillic",
  "Early_Aramaic",
  "Futurama",
  "Grantha",
  "Greek",
  "Gujarati",
  "Hebrew",
  "Inuktitut_(Canadian_Aboriginal_Syllabics)",
  "Japanese_(hiragana)",
  "Japanese_(katakana)",
  "Korean",
  "Latin",
  "Malay_(Jawi_-_Arabic)",
  "Mkhedruli_(Georgian)",
  "N_Ko",
  "Ojibwe_(Canadian_Aboriginal_Syllabics)",
  "Sanskrit",
  "Syriac_(Estrangelo)",
  "Tagalog",
  "Tifinagh",
)
EVALUATION_ALPHABETS = (
  "Angelic",
  "Atemayar_Qelisayer",
  "Atlantean",
  "Aurek-Besh",
  "Avesta",
  "Ge_ez",
  "Glagolitic",
  "Gurmukhi",
  "Kannada",
  "Keble",
  "Malayalam",
  "Manipuri",
  "Mongolian",
  "Old_Church_Slavonic_(Cyrillic)",
  "Oriya",
  "Sylheti",
  "Syriac_(Serto)",
  "Tengwar",
  "Tibetan",
  "ULOG",
)
# TFDS's ``alphabet`` ClassLabel: the 50 directory names, sorted.
ALPHABETS = tuple(sorted(BACKGROUND_ALPHABETS + EVALUATION_ALPHABETS))
VINYALS_VAL = ("Armenian", "Bengali", "Early_Aramaic", "Hebrew", "Mkhedruli_(Georgian)")
VINYALS_TEST = (
  "Kannada",
  "Keble",
  "Malayalam",
  "Manipuri",
  "Mongolian",
  "Old_Church_Slavonic_(Cyrillic)",
  "Oriya",
  "Sylheti",
  "Syriac_(Serto)",
  "Tengwar",
  "Tibetan",
  "ULOG",
)
VINYALS_TRAIN = tuple(a for a in ALPHABETS if a not in VINYALS_VAL + VINYALS_TEST)
VINYALS_SIZES = (len(VINYALS_TRAIN), len(VINYALS_VAL), len(VINYALS_TEST))  # (33, 5, 12)


class OmniglotData(NamedTuple):
  """All of Omniglot as host arrays (row ``i`` is one drawing).

  Attributes:
    images: ``float32 [n, 28, 28, 1]`` in [0, 1], strokes 1.
    character: ``int32 [n]``, ``0..C-1``, unique over both TFDS splits.
    alphabet: ``int32 [n]``, TFDS's alphabet id in ``0..49`` (an index of ``alphabet_names``).
    background: ``bool [n]``, the drawing comes from the ``train`` (background) split.
    alphabet_names: the names of the alphabet ids (:data:`ALPHABETS` unless the data set's
      metadata says otherwise).
    drawer: ``int32 [n]``, the drawer (1..20) of each drawing, from the upstream file names
      (:func:`load_omniglot_zips`); ``None`` from TFDS, which does not keep it.
  """

  images: np.ndarray
  character: np.ndarray
  alphabet: np.ndarray
  background: np.ndarray
  alphabet_names: Tuple[str, ...]
  drawer: Optional[np.ndarray] = None


class AlphabetSplit(NamedTuple):
  """Alphabet ids of the training (one client each), validation and test alphabets."""

  train: Tuple[int, ...]
  val: Tuple[int, ...]
  test: Tuple[int, ...]


# ---- loading -----------------------------------------------------------------------------


def _to_28(image: np.ndarray, size: int) -> np.ndarray:
  """One TFDS drawing (``[105, 105, 3]`` uint8, black on white) -> ``uint8 [size, size]``,
  strokes 255."""
  from PIL import Image  # pylint: disable=g-import-not-at-top

  gray = np.asarray(image)
  if gray.ndim == 3:
    gray = gray[..., 0]
  # Pillow adds its module-level resampling constants dynamically (typed: Image.Resampling)
  small = Image.fromarray(np.ascontiguousarray(gray, dtype=np.uint8)).resize(
    (size, size),
    Image.LANCZOS,  # type: ignore[attr-defined]
  )
  return 255 - np.asarray(small, np.uint8)


def _read_split(source, size: int):
  """``(images uint8 [n, size, size], label int64 [n], alphabet int64 [n])`` of one split.

  Reads through :func:`fedco.data.sources.iter_records` (chunks, with the fallback that
  ``tfds.testing.mock_data``'s source needs); images are reduced as they are read (the raw
  105x105x3 images of one split would take 0.7 GB).
  """
  n = len(source)
  images = np.empty((n, size, size), np.uint8)
  labels = np.empty((n,), np.int64)
  alphabets = np.empty((n,), np.int64)
  for i, record in sources.iter_records(source):
    images[i] = _to_28(record["image"], size)
    labels[i] = record["label"]
    alphabets[i] = record["alphabet"]
  return images, labels, alphabets


def _alphabet_names(source) -> Optional[Tuple[str, ...]]:
  """The alphabet ClassLabel's names, or ``None`` when the source has no real names (a plain
  list, or mock data without metadata, whose names are ``'0'..'49'``)."""
  try:
    names = tuple(source.dataset_info.features["alphabet"].names)
  except (AttributeError, KeyError, TypeError):
    return None
  if not names or names == tuple(str(i) for i in range(len(names))):
    return None
  return names


def load_omniglot(
  data_dir: Union[str, os.PathLike, None] = None, *, image_size: int = IMAGE_SIZE
) -> OmniglotData:
  """Both TFDS splits of ``omniglot``, as 28x28 float images with strokes 1.

  Reads TFDS ``omniglot`` (1623 characters of 50 alphabets, 20 drawings each) from its
  ``train`` (background, 964 characters) and ``test`` (evaluation, 659 characters) splits
  with ``tfds.data_source(..., download=False)``: no TensorFlow at run time and nothing
  downloaded, so the data set must be prepared beforehand (``tfds build omniglot
  --file_format=array_record``, see :mod:`fedco.data.sources`). Each 105x105 drawing (black
  strokes on white) is reduced to its first channel, resized to ``image_size`` with PIL's
  Lanczos filter (as MAML's reference code does) and inverted, so strokes are 1 and the
  background 0. Characters are numbered over both splits by their ``(alphabet, label)`` pair.
  Then :func:`fedco.data.omniglot.split_alphabets` and :func:`fedco.data.omniglot.federated`
  make the SPEC E4 clients (one per training alphabet) of few-shot episodes.

  Args:
    data_dir: the TFDS data directory holding ``omniglot`` prepared as ``array_record``;
      ``None`` uses ``TFDS_DATA_DIR`` or ``~/tensorflow_datasets``.
    image_size: side of the resized images, an integer ``>= 4`` (default 28, as in MAML).

  Returns:
    :class:`~fedco.data.omniglot.OmniglotData`, rows of the ``train`` split first, then
    ``test``: ``images`` ``float32 [n, image_size, image_size, 1]`` in [0, 1],
    ``character`` ``int32 [n]`` in ``0..C-1``, ``alphabet`` ``int32 [n]`` (TFDS's alphabet
    id, an index of ``alphabet_names``), ``background`` ``bool [n]`` (from the ``train``
    split) and ``alphabet_names``.

  Raises:
    FileNotFoundError: the data set is not prepared in ``array_record`` format under
      ``data_dir``; the message says how to prepare it.
    ValueError: a bad ``image_size``.

  Examples:
    Offline, under ``tfds.testing.mock_data`` (random drawings with the real feature shapes,
    3 per split; with real data, pass ``data_dir`` instead):

    >>> import tensorflow_datasets as tfds
    >>> import fedco
    >>> with tfds.testing.mock_data(num_examples=3):
    ...   data = fedco.data.load_omniglot()
    >>> data.images.shape, data.images.dtype, data.background.tolist()
    ((6, 28, 28, 1), dtype('float32'), [True, True, True, False, False, False])
    >>> len(data.alphabet_names), data.character.shape
    (50, (6,))
  """
  image_size = _check_count("image_size", image_size, 4)
  data_dir = None if data_dir is None else os.fspath(data_dir)
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  from fedco.data.sources import open_source  # pylint: disable=g-import-not-at-top

  parts, names = [], None
  for split in ("train", "test"):
    source = open_source(tfds, NAME, split, data_dir)
    names = names or _alphabet_names(source)
    parts.append(_read_split(source, image_size))
  images = np.concatenate([p[0] for p in parts])
  labels = np.concatenate([p[1] for p in parts])
  alphabets = np.concatenate([p[2] for p in parts]).astype(np.int32)
  background = np.repeat([True, False], [len(parts[0][1]), len(parts[1][1])])
  pairs = np.stack([alphabets.astype(np.int64), labels], 1)
  _, character = np.unique(pairs, axis=0, return_inverse=True)
  names = names or ALPHABETS
  if alphabets.min() < 0 or alphabets.max() >= len(names):
    raise ValueError(
      f"alphabet ids must lie in [0, {len(names)}), got [{alphabets.min()}, {alphabets.max()}]"
    )
  return OmniglotData(
    np.multiply(images, 1.0 / 255.0, dtype=np.float32)[..., None],
    character.reshape(-1).astype(np.int32),
    alphabets,
    background,
    tuple(names),
  )


ZIPS = ("images_background", "images_evaluation")  # the upstream archives, in this order


def _zip_entries(names, path: str, root: str):
  """``[(alphabet, character, drawer, entry name)]`` of the PNGs among an upstream archive's
  entry ``names``, sorted; an entry outside the layout is one ``ValueError`` naming the
  archive and the entry."""
  entries = []
  for name in names:
    if name.endswith("/"):
      continue
    parts = name.split("/")
    stem = parts[-1][:-4] if parts[-1].lower().endswith(".png") else ""
    number, underscore, drawer = stem.rpartition("_")
    well_named = underscore and number.isdigit() and drawer.isdigit()
    if len(parts) != 4 or parts[0] != root or not well_named:
      raise ValueError(
        f"{path}: entry {name!r} is not {root}/<Alphabet>/characterNN/XXXX_YY.png "
        "(the upstream Omniglot layout)"
      )
    if parts[1] not in ALPHABETS:
      raise ValueError(f"{path}: entry {name!r} names an unknown alphabet {parts[1]!r}")
    entries.append((parts[1], parts[2], int(drawer), name))
  if not entries:
    raise ValueError(f"{path}: holds no images (expected {root}/<Alphabet>/characterNN/*.png)")
  return sorted(entries)


def _read_png(archive, path: str, name: str, size: int) -> np.ndarray:
  """One upstream drawing (105x105, black strokes on white) -> ``uint8 [size, size]``,
  strokes 255."""
  from fedco.data.image_folder import decode_image  # pylint: disable=g-import-not-at-top

  gray = decode_image(archive.read(name), f"{path}: entry {name!r} is not a readable PNG", "L")
  return _to_28(gray, size)


def load_omniglot_zips(
  folder: Union[str, os.PathLike], *, image_size: int = IMAGE_SIZE
) -> OmniglotData:
  """Omniglot from the upstream zips ``images_background.zip`` and ``images_evaluation.zip``.

  The layout of the upstream repository's ``python/`` folder (brendenlake/omniglot):
  ``images_background/<Alphabet>/characterNN/XXXX_YY.png``, ``YY`` the drawer; the project
  ships them in ``../shared/data/omniglot`` (32,460 drawings, pixel-exact, re-encoded PNGs:
  read the pixels, not upstream's md5 sums). Every drawing is reduced exactly as
  :func:`load_omniglot` reduces TFDS's (first channel, PIL's Lanczos resize to
  ``image_size``, inverted so strokes are 1), so E4 runs unchanged on either source. Rows
  are the background archive's then the evaluation archive's, each sorted by alphabet,
  character folder and drawer; characters are numbered ``0..C-1`` over both archives by
  ``(alphabet, character folder)`` in that order; ``alphabet`` is the index in
  :data:`ALPHABETS` (TFDS's ids: the 50 names sorted); ``drawer`` is kept.

  Args:
    folder: the folder holding both zips.
    image_size: side of the resized images, an integer ``>= 4`` (default 28, as in MAML).

  Returns:
    :class:`~fedco.data.omniglot.OmniglotData` with ``drawer`` set.

  Raises:
    FileNotFoundError: ``folder`` or one of the two zips is missing (the message names it).
    ValueError: a bad ``image_size``; an archive that is not a zip, an entry outside the
      layout or of an unknown alphabet, or a PNG that does not decode (one line naming the
      archive and the entry).

  Examples:
    Two tiny archives in the upstream layout (one character, two drawers each):

    >>> import os, tempfile, zipfile, io
    >>> import numpy as np
    >>> from PIL import Image
    >>> folder = tempfile.mkdtemp()
    >>> def png():
    ...   out = io.BytesIO()
    ...   Image.fromarray(np.full((105, 105), 255, np.uint8)).save(out, "PNG")
    ...   return out.getvalue()
    >>> for root, alphabet in (("images_background", "Latin"), ("images_evaluation", "ULOG")):
    ...   with zipfile.ZipFile(os.path.join(folder, root + ".zip"), "w") as z:
    ...     for drawer in (1, 2):
    ...       z.writestr(f"{root}/{alphabet}/character01/0001_{drawer:02d}.png", png())
    >>> from fedco.data import omniglot
    >>> data = omniglot.load_omniglot_zips(folder)
    >>> data.images.shape, data.character.tolist(), data.drawer.tolist()
    ((4, 28, 28, 1), [0, 0, 1, 1], [1, 2, 1, 2])
    >>> [data.alphabet_names[a] for a in data.alphabet], data.background.tolist()
    (['Latin', 'Latin', 'ULOG', 'ULOG'], [True, True, False, False])
  """
  image_size = _check_count("image_size", image_size, 4)
  import zipfile  # pylint: disable=g-import-not-at-top

  folder = os.fspath(folder)
  if not os.path.isdir(folder):
    raise FileNotFoundError(
      f"folder={folder!r} is not a folder (it should hold {ZIPS[0]}.zip and {ZIPS[1]}.zip)"
    )
  images, keys, drawers, background = [], [], [], []
  for root in ZIPS:
    path = os.path.join(folder, root + ".zip")
    if not os.path.isfile(path):
      raise FileNotFoundError(f"{path}: missing (Omniglot's upstream {root}.zip belongs there)")
    try:
      archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
      raise ValueError(f"{path}: not a readable zip archive ({e})") from None
    with archive:
      for alphabet, character, drawer, name in _zip_entries(archive.namelist(), path, root):
        images.append(_read_png(archive, path, name, image_size))
        keys.append((ALPHABETS.index(alphabet), character))
        drawers.append(drawer)
        background.append(root == ZIPS[0])
  order = {key: i for i, key in enumerate(dict.fromkeys(keys))}
  stacked = np.stack(images)
  return OmniglotData(
    np.multiply(stacked, 1.0 / 255.0, dtype=np.float32)[..., None],
    np.array([order[k] for k in keys], np.int32),
    np.array([k[0] for k in keys], np.int32),
    np.array(background, bool),
    ALPHABETS,
    np.array(drawers, np.int32),
  )


# ---- the alphabet split ------------------------------------------------------------------


def _check_count(name, value, minimum):
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
    raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
  return int(value)


def split_alphabets(
  data: OmniglotData, split: str = "vinyals", *, sizes: Sequence[int] = VINYALS_SIZES, seed: int = 0
) -> AlphabetSplit:
  """Training, validation and test alphabets (see the module docstring for the rules).

  Args:
    data: from :func:`load_omniglot`.
    split: ``"vinyals"`` (fixed names, 33/5/12) or ``"random"`` (seeded, ``sizes``).
    sizes: ``(train, val, test)`` alphabet counts for ``"random"`` (train >= 1, val >= 1,
      test >= 0); ``"vinyals"`` accepts only its own ``(33, 5, 12)``.
    seed: the ``"random"`` permutation's seed.

  Raises:
    ValueError: unknown ``split``, bad ``sizes``, or the data lacks the alphabets the split
      needs (the message names the counts or the missing alphabets).
  """
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
  try:
    sizes = tuple(int(s) for s in sizes)
  except (TypeError, ValueError):
    raise ValueError(f"sizes must be three integers (train, val, test), got {sizes!r}") from None
  if len(sizes) != 3:
    raise ValueError(f"sizes must be three integers (train, val, test), got {sizes!r}")
  for name, value, low in zip(("train", "val", "test"), sizes, (1, 1, 0)):
    _check_count(f"sizes[{name}]", value, low)
  present = np.unique(np.asarray(data.alphabet))
  if split == "vinyals":
    if sizes != VINYALS_SIZES:
      raise ValueError(
        f"the vinyals split has sizes {VINYALS_SIZES}, got sizes={sizes}; use "
        f"split='random' for other sizes"
      )
    index = {name: i for i, name in enumerate(data.alphabet_names)}
    groups = (VINYALS_TRAIN, VINYALS_VAL, VINYALS_TEST)
    missing = [a for g in groups for a in g if a not in index or index[a] not in present]
    if missing:
      raise ValueError(
        f"the vinyals split needs all {sum(VINYALS_SIZES)} alphabets; the data "
        f"has {present.size} ({len(missing)} missing: {missing[:5]}"
        f"{' ...' if len(missing) > 5 else ''})"
      )
    return AlphabetSplit(*(tuple(sorted(index[a] for a in g)) for g in groups))
  need = sum(sizes)
  if present.size < need:
    raise ValueError(
      f"a random split into {sizes[0]} train / {sizes[1]} val / {sizes[2]} test "
      f"alphabets needs {need} alphabets; the data has {present.size}"
    )
  order = present[np.random.default_rng([seed, 11]).permutation(present.size)]
  a, b = sizes[0], sizes[0] + sizes[1]
  return AlphabetSplit(
    *(tuple(sorted(int(i) for i in part)) for part in (order[:a], order[a:b], order[b:need]))
  )


# ---- classes, tasks and episodes ---------------------------------------------------------


class _Bank(NamedTuple):
  """Images in every rotation and each character's rows."""

  rotated: np.ndarray  # uint8 [n, R, H, W, 1]
  rows: Dict[int, np.ndarray]  # character -> rows of its drawings
  alphabet_chars: Dict[int, np.ndarray]  # alphabet -> its characters (sorted)


def _bank(data: OmniglotData, rotations: bool) -> _Bank:
  images = np.round(np.asarray(data.images) * 255.0).astype(np.uint8)
  rotated = np.stack(
    [np.rot90(images, k, axes=(1, 2)) for k in range(ROTATIONS if rotations else 1)], axis=1
  )
  character = np.asarray(data.character)
  order = np.argsort(character, kind="stable")
  chars, starts = np.unique(character[order], return_index=True)
  rows = dict(zip(chars.tolist(), np.split(order, starts[1:])))
  alphabet_of = {int(c): int(data.alphabet[r[0]]) for c, r in rows.items()}
  per_alphabet: Dict[int, List[int]] = {}
  for c in sorted(rows):
    per_alphabet.setdefault(alphabet_of[c], []).append(c)
  return _Bank(rotated, rows, {a: np.asarray(c) for a, c in per_alphabet.items()})


def alphabet_classes(
  data_or_bank, alphabet: int, *, shots: int, query: int, rotations: bool = True
) -> np.ndarray:
  """``int [c, 2]``: the ``(character, rotation)`` classes of one alphabet whose characters
  have at least ``shots + query`` drawings (rotation ``r`` is ``r * 90`` degrees)."""
  bank = data_or_bank if isinstance(data_or_bank, _Bank) else _bank(data_or_bank, rotations)
  chars = bank.alphabet_chars.get(int(alphabet), np.zeros((0,), np.int64))
  usable = [c for c in chars.tolist() if bank.rows[c].size >= shots + query]
  r = bank.rotated.shape[1]
  return np.asarray([(c, k) for c in usable for k in range(r)], np.int64).reshape(-1, 2)


def _draw_tasks(
  rng: np.random.Generator,
  bank: _Bank,
  classes: np.ndarray,
  count: int,
  *,
  ways: int,
  shots: int,
  query: int,
):
  """``count`` tasks of one class table: uint8 support/query images and int32 labels."""
  h, w = bank.rotated.shape[2:4]
  sx = np.empty((count, ways * shots, h, w, 1), np.uint8)
  qx = np.empty((count, ways * query, h, w, 1), np.uint8)
  sy = np.repeat(np.arange(ways, dtype=np.int32), shots)
  qy = np.repeat(np.arange(ways, dtype=np.int32), query)
  for t in range(count):
    picked = classes[rng.choice(len(classes), ways, replace=False)]  # order = labels
    for label, (char, rot) in enumerate(picked.tolist()):
      rows = rng.choice(bank.rows[char], shots + query, replace=False)
      imgs = bank.rotated[rows, rot]
      sx[t, label * shots : (label + 1) * shots] = imgs[:shots]
      qx[t, label * query : (label + 1) * query] = imgs[shots:]
  return (
    sx,
    np.broadcast_to(sy, (count, sy.size)).copy(),
    qx,
    np.broadcast_to(qy, (count, qy.size)).copy(),
  )


def _check_task_args(ways, shots, query, tasks):
  for name, value in (
    ("ways", ways),
    ("shots", shots),
    ("query", query),
    ("tasks_per_episode", tasks),
  ):
    _check_count(name, value, 1)
  if ways < 2:
    raise ValueError(f"ways must be an integer >= 2, got {ways!r}")


def _class_tables(bank, data, alphabets, *, ways, shots, query, rotations):
  tables = []
  for a in alphabets:
    table = alphabet_classes(bank, a, shots=shots, query=query, rotations=rotations)
    if len(table) < ways:
      chars = bank.alphabet_chars.get(int(a), np.zeros(0))
      raise ValueError(
        f"alphabet {data.alphabet_names[a]!r} (id {a}) has {len(table)} classes with at "
        f"least shots + query = {shots + query} drawings ({len(chars)} characters"
        f"{' x 4 rotations' if rotations else ''}); a {ways}-way task needs {ways}"
      )
    tables.append(table)
  return tables


def client_episodes(
  rng: np.random.Generator,
  bank: _Bank,
  classes: np.ndarray,
  count: int,
  *,
  ways: int,
  shots: int,
  query: int,
  tasks_per_episode: int,
) -> Dict[str, np.ndarray]:
  """``count`` episodes of ``tasks_per_episode`` independent tasks of one class table."""
  t = tasks_per_episode
  sx, sy, qx, qy = _draw_tasks(rng, bank, classes, count * t, ways=ways, shots=shots, query=query)
  split = lambda a: a.reshape((count, t) + a.shape[1:])
  return {
    "support_x": split(sx),
    "support_y": split(sy),
    "query_x": split(qx),
    "query_y": split(qy),
    "task_weight": np.full((count, t), 1.0 / t, np.float32),
  }


def federated(
  data: OmniglotData,
  alphabets: Sequence[int],
  seed: int = 0,
  *,
  ways: int = 5,
  shots: int = 1,
  query: int = 15,
  tasks_per_episode: int = 1,
  episodes_per_client: int = 256,
  rotations: bool = True,
) -> FederatedData:
  """One client per alphabet in ``alphabets``, each with ``episodes_per_client`` episodes.

  Raises:
    ValueError: bad sizes, or an alphabet with fewer than ``ways`` usable classes.
  """
  _check_task_args(ways, shots, query, tasks_per_episode)
  _check_count("episodes_per_client", episodes_per_client, 1)
  if len(alphabets) == 0:
    raise ValueError("alphabets must name at least one training alphabet")
  bank = _bank(data, rotations)
  tables = _class_tables(
    bank, data, alphabets, ways=ways, shots=shots, query=query, rotations=rotations
  )
  rng = np.random.default_rng([seed, 12])
  clients = [
    client_episodes(
      rng,
      bank,
      table,
      episodes_per_client,
      ways=ways,
      shots=shots,
      query=query,
      tasks_per_episode=tasks_per_episode,
    )
    for table in tables
  ]
  return FederatedData.from_clients(clients)


def evaluation_episode(
  data: OmniglotData,
  alphabets: Sequence[int],
  seed: int = 0,
  *,
  num_tasks: int = 100,
  ways: int = 5,
  shots: int = 1,
  query: int = 15,
  rotations: bool = True,
  stream: int = 0,
) -> Dict[str, np.ndarray]:
  """``num_tasks`` fresh tasks as ONE episode (slots = tasks, uniform weights): each task
  picks one of ``alphabets`` uniformly, then ``ways`` of its classes. Also returns
  ``alphabet int32 [num_tasks]``. ``stream`` separates the draws of different sets (say
  validation 1, test 2) made with one ``seed``."""
  _check_task_args(ways, shots, query, 1)
  _check_count("num_tasks", num_tasks, 1)
  if len(alphabets) == 0:
    raise ValueError("alphabets must name at least one alphabet")
  bank = _bank(data, rotations)
  tables = _class_tables(
    bank, data, alphabets, ways=ways, shots=shots, query=query, rotations=rotations
  )
  rng = np.random.default_rng([seed, 13, stream])
  which = rng.integers(0, len(tables), num_tasks)
  h, w = bank.rotated.shape[2:4]
  out: Dict[str, np.ndarray] = {
    "support_x": np.empty((num_tasks, ways * shots, h, w, 1), np.uint8),
    "support_y": np.empty((num_tasks, ways * shots), np.int32),
    "query_x": np.empty((num_tasks, ways * query, h, w, 1), np.uint8),
    "query_y": np.empty((num_tasks, ways * query), np.int32),
  }
  for i, a in enumerate(which.tolist()):
    parts = _draw_tasks(rng, bank, tables[a], 1, ways=ways, shots=shots, query=query)
    for key, part in zip(("support_x", "support_y", "query_x", "query_y"), parts):
      out[key][i] = part[0]
  out["task_weight"] = np.full((num_tasks,), 1.0 / num_tasks, np.float32)
  out["alphabet"] = np.asarray(alphabets, np.int32)[which]
  return out
