"""Few-shot Omniglot (fedco.data.omniglot), paired batches, and E4 (experiments.omniglot).

The loader runs under ``tfds.testing.mock_data`` (random records with the real feature
shapes; the train and test splits hold the same records, alphabets and labels are drawn
independently, so every mock character has two drawings). The task structure (rotations as
classes, labels, shots) is checked on a small synthetic :class:`OmniglotData` whose images
are noise, so every rotated drawing identifies its character, drawing and rotation.
"""

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow_datasets as tfds

import fedco
from experiments import common
from experiments import omniglot as e4
from fedco.data import omniglot as om

MOCK_EXAMPLES = 300


@pytest.fixture(scope="module")
def mock():
  with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES):
    return om.load_omniglot("/nonexistent/mock_data/ignores/it")


# ---- loading ---------------------------------------------------------------------------

def test_loader_reads_both_splits_as_28x28_floats(mock):
  n = 2 * MOCK_EXAMPLES
  assert mock.images.shape == (n, 28, 28, 1) and mock.images.dtype == np.float32
  assert 0.0 <= mock.images.min() and mock.images.max() <= 1.0
  assert mock.character.dtype == np.int32 and mock.alphabet.dtype == np.int32
  np.testing.assert_array_equal(mock.background, np.arange(n) < MOCK_EXAMPLES)
  # characters are numbered 0..C-1 over both splits; mock's splits repeat the same records
  chars = np.unique(mock.character)
  np.testing.assert_array_equal(chars, np.arange(chars.size))
  np.testing.assert_array_equal(mock.character[:MOCK_EXAMPLES], mock.character[MOCK_EXAMPLES:])
  for c in chars[:50]:  # a character belongs to one alphabet
    assert np.unique(mock.alphabet[mock.character == c]).size == 1
  assert mock.alphabet_names == om.ALPHABETS and len(om.ALPHABETS) == 50
  assert "tensorflow" not in sys.modules


def test_images_are_inverted_so_strokes_are_one():
  image = np.full((105, 105, 3), 255, np.uint8)
  image[40:65] = 0  # a black horizontal bar on white
  small = om._to_28(image, 28)
  assert small.shape == (28, 28) and small.dtype == np.uint8
  assert small[0].max() == 0 and small[-1].max() == 0      # background -> 0
  assert small[12:16].min() >= 240                          # stroke -> about 255 (1)


def test_missing_data_dir_raises_file_not_found(tmp_path):
  with pytest.raises(FileNotFoundError, match="omniglot") as err:
    om.load_omniglot(tmp_path)
  assert str(tmp_path) in str(err.value) and "array_record" in str(err.value)


# ---- the alphabet split ------------------------------------------------------------------

def test_vinyals_split_is_33_5_12_by_name(mock):
  split = om.split_alphabets(mock)
  assert tuple(map(len, split)) == (33, 5, 12) == om.VINYALS_SIZES
  names = [{mock.alphabet_names[a] for a in part} for part in split]
  assert names[1] == set(om.VINYALS_VAL) and names[2] == set(om.VINYALS_TEST)
  assert names[1] <= set(om.BACKGROUND_ALPHABETS) and names[2] <= set(om.EVALUATION_ALPHABETS)
  assert set().union(*names) == set(om.ALPHABETS)
  assert "Gurmukhi" in names[0]
  few = mock._replace(**{k: getattr(mock, k)[mock.alphabet < 10]
                         for k in ("images", "character", "alphabet", "background")})
  with pytest.raises(ValueError, match="missing"):
    om.split_alphabets(few)


def test_random_split_is_seeded_disjoint_and_checked(mock):
  a = om.split_alphabets(mock, "random", sizes=(3, 2, 2), seed=0)
  assert tuple(map(len, a)) == (3, 2, 2)
  assert len(set(a.train) | set(a.val) | set(a.test)) == 7
  assert om.split_alphabets(mock, "random", sizes=(3, 2, 2), seed=0) == a
  assert om.split_alphabets(mock, "random", sizes=(3, 2, 2), seed=1) != a
  with pytest.raises(ValueError, match="needs 60 alphabets; the data has 50"):
    om.split_alphabets(mock, "random", sizes=(40, 10, 10))
  with pytest.raises(ValueError, match="vinyals split has sizes"):
    om.split_alphabets(mock, "vinyals", sizes=(3, 2, 2))
  with pytest.raises(ValueError, match="split must be one of"):
    om.split_alphabets(mock, "background")
  with pytest.raises(ValueError, match="sizes"):
    om.split_alphabets(mock, "random", sizes=(0, 1, 1))


# ---- classes, tasks and episodes ----------------------------------------------------------

def _synthetic(drawings=(4, 4, 4, 4, 4, 2, 4)):
  """Alphabet 0: characters 0-2; alphabet 1: characters 3-5 (5 has 2 drawings);
  alphabet 2: character 6. Noise images, so each rotated drawing is unique."""
  owner = np.array([0, 0, 0, 1, 1, 1, 2])
  character = np.repeat(np.arange(len(drawings)), drawings).astype(np.int32)
  rng = np.random.default_rng(0)
  u8 = rng.integers(0, 256, (character.size, 28, 28, 1)).astype(np.uint8)
  data = om.OmniglotData(u8 / np.float32(255), character, owner[character].astype(np.int32),
                         np.ones(character.size, bool), om.ALPHABETS)
  lookup = {np.rot90(u8[r], k, axes=(0, 1)).tobytes(): (r, k)
            for r in range(character.size) for k in range(4)}
  return data, lookup


def test_rotations_are_classes_and_tasks_have_k_shots_and_q_queries():
  data, lookup = _synthetic()
  classes = om.alphabet_classes(data, 1, shots=1, query=2)
  assert sorted(map(tuple, classes.tolist())) == [(c, k) for c in (3, 4) for k in range(4)]
  ways, shots, query, t = 3, 1, 2, 2
  fed = om.federated(data, [0, 1], seed=0, ways=ways, shots=shots, query=query,
                     tasks_per_episode=t, episodes_per_client=20)
  assert fed.num_clients == 2 and np.all(np.asarray(fed.counts) == 20)
  rotations = set()
  for k, alphabet in enumerate((0, 1)):
    ep = jax.tree.map(np.asarray, fed.client(k))
    assert ep["support_x"].shape == (20, t, ways * shots, 28, 28, 1)
    assert ep["query_x"].shape == (20, t, ways * query, 28, 28, 1)
    assert ep["support_x"].dtype == np.uint8
    np.testing.assert_allclose(ep["task_weight"], 1.0 / t)
    for e in range(20):
      for s in range(t):
        sy, qy = ep["support_y"][e, s], ep["query_y"][e, s]
        assert np.all(np.bincount(sy, minlength=ways) == shots)
        assert np.all(np.bincount(qy, minlength=ways) == query)
        assert 0 <= qy.min() and qy.max() < ways
        seen = {}
        for x, y in zip(np.concatenate([ep["support_x"][e, s], ep["query_x"][e, s]]),
                        np.concatenate([sy, qy])):
          row, rot = lookup[x.tobytes()]
          seen.setdefault(int(y), []).append((int(data.character[row]), rot, row))
        label_classes = {y: {(c, r) for c, r, _ in v} for y, v in seen.items()}
        assert all(len(v) == 1 for v in label_classes.values())  # one class per label
        assert len({next(iter(v)) for v in label_classes.values()}) == ways  # distinct
        for v in seen.values():
          assert len({row for _, _, row in v}) == shots + query       # distinct drawings
          assert all(data.alphabet[row] == alphabet for _, _, row in v)
          rotations.update(r for _, r, _ in v)
  assert rotations == {0, 1, 2, 3}
  # labels are shuffled per task: class of label 0 varies
  ep = jax.tree.map(np.asarray, fed.client(0))
  first = {lookup[ep["support_x"][e, s, 0].tobytes()] for e in range(20) for s in range(t)}
  assert len(first) > 3


def test_evaluation_episode_and_too_small_alphabets():
  data, lookup = _synthetic()
  ev = om.evaluation_episode(data, [0, 1], seed=3, num_tasks=12, ways=2, shots=1, query=2,
                             stream=1)
  assert ev["support_x"].shape == (12, 2, 28, 28, 1) and ev["query_y"].shape == (12, 4)
  assert set(ev["alphabet"].tolist()) == {0, 1}
  np.testing.assert_allclose(ev["task_weight"].sum(), 1.0, rtol=1e-6)
  for i in range(12):
    rows = [lookup[x.tobytes()][0] for x in ev["query_x"][i]]
    assert set(data.alphabet[rows].tolist()) == {ev["alphabet"][i]}
  again = om.evaluation_episode(data, [0, 1], seed=3, num_tasks=12, ways=2, shots=1, query=2,
                                stream=1)
  other = om.evaluation_episode(data, [0, 1], seed=3, num_tasks=12, ways=2, shots=1, query=2,
                                stream=2)
  np.testing.assert_array_equal(again["query_x"], ev["query_x"])
  assert not np.array_equal(other["query_x"], ev["query_x"])
  # alphabet 2 has one character: 4 classes with rotations, 1 without
  om.federated(data, [2], ways=4, shots=1, query=1, episodes_per_client=2)
  with pytest.raises(ValueError, match=r"alphabet 'Anglo-Saxon_Futhorc' \(id 2\) has 1 classes"):
    om.federated(data, [2], ways=2, shots=1, query=1, rotations=False, episodes_per_client=2)
  # character 5 has 2 drawings: unusable with shots + query = 3, so alphabet 1 has 2 chars
  assert len(om.alphabet_classes(data, 1, shots=1, query=2, rotations=False)) == 2
  with pytest.raises(ValueError, match="shots \\+ query = 3"):
    om.federated(data, [1], ways=3, shots=1, query=2, rotations=False, episodes_per_client=2)


def test_mock_episodes_have_labels_below_ways(mock):
  split = om.split_alphabets(mock, "random", sizes=(3, 2, 2))
  fed = om.federated(mock, split.train, seed=0, ways=2, shots=1, query=1, tasks_per_episode=2,
                     episodes_per_client=6)
  assert fed.num_clients == 3
  qy = np.asarray(fed.examples["query_y"])
  assert qy.shape == (18, 2, 2) and set(np.unique(qy).tolist()) == {0, 1}
  for y in (qy, np.asarray(fed.examples["support_y"])):
    assert np.all((y == 0).sum(-1) == 1) and np.all((y == 1).sum(-1) == 1)


# ---- paired batches ----------------------------------------------------------------------

def test_paired_batches_score_the_outer_on_the_inner_sample():
  # g(x; e) = x + id_e and f(y; e') = (y - id_e')^2 / 2: J^T grad f = x + id_e - id_e', which
  # is exactly x when the outer example is the inner one, so x shrinks by (1 - lr) per step
  problem = fedco.problems.local_inner(lambda x, e: x + e["id"],
                                       lambda y, e: 0.5 * jnp.sum((y - e["id"]) ** 2),
                                       outer_uses_data=True)
  data = fedco.FederatedData.from_clients(
      [{"id": np.arange(k, k + 9, dtype=np.float32)[:, None]} for k in range(3)])
  kwargs = dict(rounds=2, batch_size=1, evaluate=False, seed=1)
  paired = fedco.simulate(problem, fedco.comfedl(0.5, 3), data, jnp.ones(1),
                          paired_batches=True, **kwargs)
  np.testing.assert_allclose(paired.params, 0.5 ** 6, rtol=1e-6)
  unpaired = fedco.simulate(problem, fedco.comfedl(0.5, 3), data, jnp.ones(1), **kwargs)
  assert abs(float(unpaired.params[0]) - 0.5 ** 6) > 1e-3
  with pytest.raises(ValueError, match="outer_batch_size must equal batch_size"):
    fedco.Simulator(problem, fedco.comfedl(0.5, 3), data, batch_size=1, outer_batch_size=2,
                    paired_batches=True)
  with pytest.raises(ValueError, match="paired_batches must be a bool"):
    fedco.Simulator(problem, fedco.comfedl(0.5, 3), data, paired_batches=1)


# ---- E4 ----------------------------------------------------------------------------------

def test_task_maml_normalises_a_task_as_one_batch():
  config = e4.validate("unused", ways=3, filters=4)
  model, meta = e4.make_model(config)
  params = fedco.models.init_cnn(model, (28, 28, 1), 0)
  x = np.random.default_rng(0).integers(0, 256, (6, 28, 28, 1)).astype(np.uint8)
  x[:3] = 0
  x[:3, 5:20, 10:14] = 255  # three bars among three noise images: very different statistics
  y = np.arange(6) % 3
  logits = model.apply(params, x / np.float32(255))  # uint8 -> [0, 1] in the wrapper
  np.testing.assert_allclose(meta.apply_fn(params, x), logits, rtol=1e-5, atol=1e-6)
  expected = np.mean(jax.nn.logsumexp(logits, -1) - logits[np.arange(6), y])
  np.testing.assert_allclose(meta.task_loss(params, x, y), expected, rtol=1e-5)
  # MAML's default vmaps the model over single images (per-image statistics): different
  single = jax.vmap(lambda xi: meta.apply_fn(params, xi))(x)
  assert np.abs(np.asarray(single) - np.asarray(logits)).max() > 0.1


TINY = dict(alphabet_split="random", split_sizes=("3", "2", "2"), ways=2, shots=1, query=1,
            tasks_per_episode=1, rounds=2, local_steps=2, filters=8, episodes_per_client=4,
            val_tasks=4, test_tasks=3, eval_every=1, seeds=("0",), progress=False)


def test_e4_end_to_end_with_tiny_settings(tmp_path):
  # one algorithm keeps the test fast (each is one XLA compilation of a second-order MAML
  # step through the CNN); the others are built with their settings below
  with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES):
    summary = e4.run(str(tmp_path), **TINY, algorithms=("local_scgdm",))
  for name in ("config.json", "metrics.jsonl", "summary.json", "curves.png"):
    assert os.path.exists(tmp_path / name), name
  records = common.read_jsonl(tmp_path / "metrics.jsonl")
  assert [(r["round"], r["iteration"]) for r in records] == [(1, 2), (2, 4)]
  for r in records:
    assert r["algorithm"] == "local_scgdm" and r["seed"] == 0
    assert np.isfinite(r["train_loss"]) and r["train_loss"] > 0
    assert 0 <= r["val_acc"] <= 1 and 0 <= r["train_acc"] <= 1
  written = json.loads((tmp_path / "summary.json").read_text())
  entry = written["algorithms"]["local_scgdm"]
  assert entry["diverged_seeds"] == []
  assert entry["val_acc"]["mean"] == pytest.approx(entry["per_seed"]["0"]["val_acc"])
  assert 0 <= entry["per_seed"]["0"]["test_acc"] <= 1
  assert written["setting"] == "2-way 1-shot" and summary["wall_seconds"] > 0
  config = json.loads((tmp_path / "config.json").read_text())
  assert config["inner_lr"] == 0.4 and len(config["alphabets"]["train"]) == 3


def test_e4_defaults_are_the_paper_settings(tmp_path):
  config = e4.validate(str(tmp_path))
  assert (config["ways"], config["shots"], config["query"], config["inner_lr"]) == (5, 1, 15, 0.4)
  assert config["alphabet_split"] == "vinyals" and config["split_sizes"] == (33, 5, 12)
  assert config["filters"] == 64 and config["rotations"]
  specs = {s["algorithm"]: s for s in e4.runs(config)}
  names = {"local_scgdm": "local_scgdm", "local_bsgd": "comfedl", "local_scgd": "local_scgd"}
  assert set(specs) == set(names)
  for label, spec in specs.items():
    alg = e4.make_algorithm(spec, config)
    assert alg.name == names[label] and alg.plan.local_steps == 5
  assert specs["local_scgdm"] == {"label": "local_scgdm", "algorithm": "local_scgdm", "p": 5,
                                  "eta": 1.0, "beta": 0.1, "alpha": 0.9, "gamma": 0.99}
  assert specs["local_bsgd"]["bsgd_lr"] == 0.1
  assert (specs["local_scgd"]["scgd_lr"], specs["local_scgd"]["scgd_gamma"]) == (0.1, 0.99)
  assert e4.make_algorithm(specs["local_scgdm"], config).plan.every_round == ("u", "m")


@pytest.mark.parametrize("kwargs,flag", [
    (dict(algorithms=("local_scgdm", "local_moml")), "--algorithms"),
    (dict(ways=1), "--ways"),
    (dict(shots=0), "--shots"),
    (dict(shots=5, query=16), "--shots \\+ --query"),
    (dict(tasks_per_episode=0), "--tasks_per_episode"),
    (dict(inner_lr=0.0), "--inner_lr"),
    (dict(eval_inner_steps=-1), "--eval_inner_steps"),
    (dict(gamma=1.0), "--gamma"),
    (dict(alpha=0.9, eta=2.0), "--alpha"),
    (dict(scgd_gamma=1.5), "--scgd_gamma"),
    (dict(filters=0), "--filters"),
    (dict(alphabet_split="background"), "--alphabet_split"),
    (dict(split_sizes=("3", "2")), "--split_sizes"),
    (dict(split_sizes=("3", "2", "x"), alphabet_split="random"), "--split_sizes"),
    (dict(split_sizes=("3", "2", "2")), "--split_sizes"),
    (dict(data_dir=""), "--data_dir"),
    (dict(seeds=("0", "0")), "--seeds"),
    (dict(rotations="yes"), "--rotations"),
    (dict(test_tasks=-1), "--test_tasks"),
])
def test_bad_flags_raise_naming_the_flag(tmp_path, kwargs, flag):
  with pytest.raises(ValueError, match=flag):
    e4.validate(str(tmp_path), **kwargs)
