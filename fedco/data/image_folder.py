r"""Image folders: ``split/<class>/<file>`` images in a folder or a ``.tar(.gz)`` archive.

The layout users keep their own images in, and the one ``../shared/data/cifar10_jpeg``
ships CIFAR-10 in (``cifar10_jpeg.tar.gz``: ``train/airplane/0000.jpg``, ...; **lossy**
JPEG, so numbers on it are "CIFAR-10 (JPEG)"). :func:`load_image_folder` reads one split
into the arrays :func:`fedco.data.load_tfds` gives, and :func:`fedco.data.load` reads a
TFDS name's ``train`` and ``test`` splits from such a folder or archive when its
``data_dir`` is one.
"""

from __future__ import annotations

import io
import os
import tarfile
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

Arrays = Dict[str, np.ndarray]
ARCHIVES = (".tar", ".tar.gz", ".tgz")


def is_image_folder(path: Union[str, os.PathLike, None]) -> bool:
  """Whether ``path`` is a ``.tar(.gz)`` archive or a folder with a ``train`` subfolder.

  Args:
    path: a path, or ``None``.

  Returns:
    ``True`` for an existing archive named ``*.tar``, ``*.tar.gz`` or ``*.tgz``, or a
    folder holding ``train/``; ``False`` otherwise (a TFDS data directory, say).

  Examples:
    >>> import tempfile
    >>> from fedco.data import image_folder
    >>> image_folder.is_image_folder(tempfile.mkdtemp())
    False
  """
  if path is None:
    return False
  path = os.fspath(path)
  if os.path.isfile(path):
    return path.endswith(ARCHIVES)
  return os.path.isdir(os.path.join(path, "train"))


def _split_class(name: str) -> Optional[Tuple[str, str]]:
  """``(split, class)`` of an archive member named ``split/<class>/<file>``, else ``None``."""
  parts = name.strip("/").split("/")
  return (parts[0], parts[1]) if len(parts) == 3 else None


def _members(path: str, splits: Sequence[str]) -> Iterator[Tuple[str, str, str, bytes]]:
  """``(split, class, name, bytes)`` of every file under ``splits`` of a folder or archive,
  in one pass over an archive."""
  if os.path.isdir(path):
    for split in splits:
      root = os.path.join(path, split)
      for cls in sorted(os.listdir(root)) if os.path.isdir(root) else ():
        folder = os.path.join(root, cls)
        if os.path.isdir(folder):
          for name in sorted(os.listdir(folder)):
            with open(os.path.join(folder, name), "rb") as f:
              yield split, cls, f"{split}/{cls}/{name}", f.read()
    return
  try:
    archive = tarfile.open(path)
  except (tarfile.TarError, OSError, EOFError) as e:
    raise ValueError(f"{path}: not a readable tar archive ({e})") from None
  with archive:
    try:
      for member in archive:
        where = _split_class(member.name) if member.isfile() else None
        if where is not None and where[0] in splits:
          data = archive.extractfile(member)
          yield where[0], where[1], member.name, data.read() if data is not None else b""
    except (tarfile.TarError, OSError, EOFError, ValueError) as e:  # zlib errors too
      raise ValueError(f"{path}: damaged archive ({e})") from None


def decode_image(data: bytes, where: str, mode: Optional[str] = None) -> np.ndarray:
  """One encoded image (JPEG, PNG, ... as Pillow reads them) as a ``uint8`` array.

  Args:
    data: the file's bytes.
    where: what the error names (``"<archive>: <entry> is not a readable image"``).
    mode: a Pillow mode to convert to (``"L"``: grey); ``None`` keeps grey and RGB images
      as stored and converts the others to RGB.

  Returns:
    ``uint8 [H, W]`` for grey images, ``uint8 [H, W, 3]`` for RGB.

  Raises:
    ValueError: ``"{where} (<Pillow's reason>)"`` when the bytes do not decode.

  Examples:
    >>> from fedco.data import image_folder
    >>> image_folder.decode_image(b"garbage", "x.png is not a readable image")
    Traceback (most recent call last):
    ...
    ValueError: x.png is not a readable image (cannot identify image file <_io.BytesIO object at ...>)
  """
  from PIL import Image, UnidentifiedImageError  # pylint: disable=g-import-not-at-top

  image: Image.Image
  try:
    with Image.open(io.BytesIO(data)) as image:
      if mode is not None:
        image = image.convert(mode)
      elif image.mode not in ("L", "RGB"):
        image = image.convert("RGB")
      return np.asarray(image, np.uint8)
  except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
    raise ValueError(f"{where} ({e})") from None


Row = Tuple[str, str, np.ndarray]  # (class, name, image)


def _read(path: str, splits: Sequence[str]) -> Dict[str, List[Row]]:
  """Every split's decoded images, read in one pass."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"path={path!r} does not exist (a folder or .tar(.gz) of images)")
  rows: Dict[str, List[Row]] = {split: [] for split in splits}
  for split, cls, name, data in _members(path, splits):
    rows[split].append((cls, name, decode_image(data, f"{path}: {name} is not a readable image")))
  return rows


def _arrays(path: str, split: str, rows: List[Row], classes: Optional[Sequence[str]]) -> Arrays:
  """One split's rows as ``{"x", "y"}``, sorted by class and name, labels numbering
  ``classes`` (``None``: the split's sorted)."""
  if not rows:
    raise ValueError(f"{path}: no images under {split}/<class>/ (split={split!r})")
  rows = sorted(rows, key=lambda r: (r[0], r[1]))
  found = sorted({r[0] for r in rows})
  order = list(classes) if classes is not None else found
  unknown = [c for c in found if c not in order]
  if unknown:
    raise ValueError(f"{path}: class folders {unknown} of {split}/ are not in classes={order}")
  shape = rows[0][2].shape
  for _, name, image in rows:
    if image.shape != shape:
      raise ValueError(f"{path}: {name} is {image.shape}, the first image {shape}")
  images = np.stack([r[2] for r in rows])
  if images.ndim == 3:
    images = images[..., None]
  labels = np.array([order.index(r[0]) for r in rows], np.int32)
  return {"x": np.multiply(images, 1.0 / 255.0, dtype=np.float32), "y": labels}


def load_image_folder(
  path: Union[str, os.PathLike], split: str, *, classes: Optional[Sequence[str]] = None
) -> Arrays:
  """One split of an image folder: ``split/<class>/<file>`` in a folder or ``.tar(.gz)``.

  Every image is decoded with Pillow (JPEG, PNG, ...), kept as stored (grey images as one
  channel, others as RGB), and scaled to ``[0, 1]`` as :func:`fedco.data.load_tfds` scales
  TFDS's. Rows are sorted by class, then file name. Labels number ``classes`` in the order
  given; by default the split's class folders sorted by name (CIFAR-10's folders sorted
  are its label order: airplane, automobile, bird, cat, deer, dog, frog, horse, ship,
  truck).

  Args:
    path: a folder holding ``split/`` or a ``.tar``, ``.tar.gz`` or ``.tgz`` archive of it.
    split: the top-level folder to read, e.g. ``"train"`` or ``"test"``.
    classes: the class folder names in label order (``None``: the split's sorted).

  Returns:
    ``{"x": float32 [N, H, W, C] in [0, 1], "y": int32 [N]}``.

  Raises:
    FileNotFoundError: ``path`` does not exist.
    ValueError: no images under ``split/``; a class folder outside ``classes``; images of
      different shapes; an archive or image that does not read (one line naming the file).

  Examples:
    >>> import os, tempfile
    >>> import numpy as np
    >>> from PIL import Image
    >>> from fedco.data import image_folder
    >>> root = tempfile.mkdtemp()
    >>> for cls, value in (("cat", 0), ("dog", 255)):
    ...   os.makedirs(os.path.join(root, "train", cls))
    ...   image = Image.fromarray(np.full((4, 4, 3), value, np.uint8))
    ...   image.save(os.path.join(root, "train", cls, "0000.png"))
    >>> data = image_folder.load_image_folder(root, "train")
    >>> data["x"].shape, data["y"].tolist(), float(data["x"][1].max())
    ((2, 4, 4, 3), [0, 1], 1.0)
  """
  path = os.fspath(path)
  return _arrays(path, split, _read(path, (split,))[split], classes)


def load_image_folders(
  path: Union[str, os.PathLike], splits: Sequence[str] = ("train", "test")
) -> Tuple[List[str], Dict[str, Arrays]]:
  """Several splits of an image folder, read in one pass, with one label order.

  As :func:`load_image_folder` for each split, with the labels numbering the class folders
  found under any of ``splits``, sorted (so a class missing from one split keeps its id).
  An archive is read once (a ``.tar.gz`` is decompressed once, not once per split).

  Args:
    path: a folder holding the splits or a ``.tar``, ``.tar.gz`` or ``.tgz`` archive of them.
    splits: the top-level folders to read.

  Returns:
    ``(classes, {split: {"x": float32 [N, H, W, C], "y": int32 [N]}})``.

  Raises:
    FileNotFoundError: ``path`` does not exist.
    ValueError: as :func:`load_image_folder`, for any split.

  Examples:
    >>> import os, tempfile
    >>> import numpy as np
    >>> from PIL import Image
    >>> from fedco.data import image_folder
    >>> root = tempfile.mkdtemp()
    >>> for folder in ("train/cat", "train/dog", "test/dog"):
    ...   os.makedirs(os.path.join(root, folder))
    ...   Image.fromarray(np.zeros((2, 2), np.uint8)).save(os.path.join(root, folder, "0.png"))
    >>> classes, data = image_folder.load_image_folders(root)
    >>> classes, data["train"]["y"].tolist(), data["test"]["y"].tolist()
    (['cat', 'dog'], [0, 1], [1])
  """
  path = os.fspath(path)
  rows = _read(path, splits)
  classes = sorted({r[0] for split in splits for r in rows[split]})
  return classes, {split: _arrays(path, split, rows[split], classes) for split in splits}
