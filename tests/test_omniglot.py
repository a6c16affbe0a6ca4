"""Few-shot Omniglot (fedco.data.omniglot), paired batches, and E4 (experiments.omniglot).

The loader runs under ``tfds.testing.mock_data`` (random records with the real feature
shapes; the train and test splits hold the same records, alphabets and labels are drawn
independently, so every mock character has two drawings). The task structure (rotations as
classes, labels, shots) is checked on a small synthetic :class:`OmniglotData` whose images
are noise, so every rotated drawing identifies its character, drawing and rotation.
"""

import dataclasses
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow_datasets as tfds

import fedco
from experiments import omniglot as e4
from experiments.configs import omniglot as e4_config
from fedco.data import omniglot as om
from fedco.experiment import outputs, runner
from tests import helpers

MOCK_EXAMPLES = 300
QUIET = runner.Options(progress=False)


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
  assert small[0].max() == 0 and small[-1].max() == 0  # background -> 0
  assert small[12:16].min() >= 240  # stroke -> about 255 (1)


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
  few = mock._replace(
    **{
      k: getattr(mock, k)[mock.alphabet < 10]
      for k in ("images", "character", "alphabet", "background")
    }
  )
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


def _synthetic(drawings=(4, 4, 4, 4, 4, 2, 4), owner=(0, 0, 0, 1, 1, 1, 2)):
  """Alphabet 0: characters 0-2; alphabet 1: characters 3-5 (5 has 2 drawings);
  alphabet 2: character 6 (by default). Noise images, so each rotated drawing is unique."""
  owner = np.asarray(owner)
  character = np.repeat(np.arange(len(drawings)), drawings).astype(np.int32)
  rng = np.random.default_rng(0)
  u8 = rng.integers(0, 256, (character.size, 28, 28, 1)).astype(np.uint8)
  data = om.OmniglotData(
    u8 / np.float32(255),
    character,
    owner[character].astype(np.int32),
    np.ones(character.size, bool),
    om.ALPHABETS,
  )
  lookup = {
    np.rot90(u8[r], k, axes=(0, 1)).tobytes(): (r, k)
    for r in range(character.size)
    for k in range(4)
  }
  return data, lookup


def test_rotations_are_classes_and_tasks_have_k_shots_and_q_queries():
  data, lookup = _synthetic()
  classes = om.alphabet_classes(data, 1, shots=1, query=2)
  assert sorted(map(tuple, classes.tolist())) == [(c, k) for c in (3, 4) for k in range(4)]
  ways, shots, query, t = 3, 1, 2, 2
  fed = om.federated(
    data,
    [0, 1],
    seed=0,
    ways=ways,
    shots=shots,
    query=query,
    tasks_per_episode=t,
    episodes_per_client=20,
  )
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
        for x, y in zip(
          np.concatenate([ep["support_x"][e, s], ep["query_x"][e, s]]), np.concatenate([sy, qy])
        ):
          row, rot = lookup[x.tobytes()]
          seen.setdefault(int(y), []).append((int(data.character[row]), rot, row))
        label_classes = {y: {(c, r) for c, r, _ in v} for y, v in seen.items()}
        assert all(len(v) == 1 for v in label_classes.values())  # one class per label
        assert len({next(iter(v)) for v in label_classes.values()}) == ways  # distinct
        for v in seen.values():
          assert len({row for _, _, row in v}) == shots + query  # distinct drawings
          assert all(data.alphabet[row] == alphabet for _, _, row in v)
          rotations.update(r for _, r, _ in v)
  assert rotations == {0, 1, 2, 3}
  # labels are shuffled per task: class of label 0 varies
  ep = jax.tree.map(np.asarray, fed.client(0))
  first = {lookup[ep["support_x"][e, s, 0].tobytes()] for e in range(20) for s in range(t)}
  assert len(first) > 3


def test_evaluation_episode_and_too_small_alphabets():
  data, lookup = _synthetic()
  ev = om.evaluation_episode(data, [0, 1], seed=3, num_tasks=12, ways=2, shots=1, query=2, stream=1)
  assert ev["support_x"].shape == (12, 2, 28, 28, 1) and ev["query_y"].shape == (12, 4)
  assert set(ev["alphabet"].tolist()) == {0, 1}
  np.testing.assert_allclose(ev["task_weight"].sum(), 1.0, rtol=1e-6)
  for i in range(12):
    rows = [lookup[x.tobytes()][0] for x in ev["query_x"][i]]
    assert set(data.alphabet[rows].tolist()) == {ev["alphabet"][i]}
  again = om.evaluation_episode(
    data, [0, 1], seed=3, num_tasks=12, ways=2, shots=1, query=2, stream=1
  )
  other = om.evaluation_episode(
    data, [0, 1], seed=3, num_tasks=12, ways=2, shots=1, query=2, stream=2
  )
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
  fed = om.federated(
    mock, split.train, seed=0, ways=2, shots=1, query=1, tasks_per_episode=2, episodes_per_client=6
  )
  assert fed.num_clients == 3
  qy = np.asarray(fed.examples["query_y"])
  assert qy.shape == (18, 2, 2) and set(np.unique(qy).tolist()) == {0, 1}
  for y in (qy, np.asarray(fed.examples["support_y"])):
    assert np.all((y == 0).sum(-1) == 1) and np.all((y == 1).sum(-1) == 1)


# ---- paired batches ----------------------------------------------------------------------


def test_paired_batches_score_the_outer_on_the_inner_sample():
  # g(x; e) = x + id_e and f(y; e') = (y - id_e')^2 / 2: J^T grad f = x + id_e - id_e', which
  # is exactly x when the outer example is the inner one, so x shrinks by (1 - lr) per step
  problem = fedco.problems.local_inner(
    lambda x, e: x + e["id"], lambda y, e: 0.5 * jnp.sum((y - e["id"]) ** 2), outer_uses_data=True
  )
  data = fedco.FederatedData.from_clients(
    [{"id": np.arange(k, k + 9, dtype=np.float32)[:, None]} for k in range(3)]
  )
  kwargs = dict(rounds=2, batch_size=1, evaluate=False, seed=1)
  paired = fedco.simulate(
    problem, fedco.comfedl(0.5, 3), data, jnp.ones(1), paired_batches=True, **kwargs
  )
  np.testing.assert_allclose(paired.params, 0.5**6, rtol=1e-6)
  unpaired = fedco.simulate(problem, fedco.comfedl(0.5, 3), data, jnp.ones(1), **kwargs)
  assert abs(float(unpaired.params[0]) - 0.5**6) > 1e-3
  with pytest.raises(ValueError, match="outer_batch_size must equal batch_size"):
    fedco.Simulator(
      problem, fedco.comfedl(0.5, 3), data, batch_size=1, outer_batch_size=2, paired_batches=True
    )
  with pytest.raises(ValueError, match="paired_batches must be a bool"):
    fedco.Simulator(problem, fedco.comfedl(0.5, 3), data, paired_batches=1)


# ---- E4 ----------------------------------------------------------------------------------


def _tiny(**changes):
  """A tiny E4 config: 2-way 1-shot on a random 3/2/2 alphabet split of the mock data."""
  config = e4_config.get_config()
  config.alphabet_split, config.split_sizes = "random", (3, 2, 2)
  config.ways, config.shots, config.query, config.tasks_per_episode = 2, 1, 1, 1
  config.rounds, config.local_steps, config.eval_every, config.filters = 2, 2, 1, 8
  config.episodes_per_client, config.val_tasks, config.test_tasks = 4, 4, 3
  config.seeds = (0,)
  for key, value in changes.items():
    setattr(config, key, value)
  return config


def test_task_maml_normalises_a_task_as_one_batch():
  model, meta = e4.make_model(_tiny(ways=3, filters=4))
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


@pytest.mark.compile_optimized  # XLA at level 0 miscompiles im2col backward passes
def test_e4_end_to_end_with_tiny_settings(tmp_path):
  """One method keeps the test fast (each is one XLA compilation of a second-order MAML
  step through the CNN); 3 rounds with evaluation every 2 and at the last round, whose
  metrics are the finals: finite, and nothing is reported as diverged."""
  config = _tiny(rounds=3, eval_every=2)
  for label in ("comfedl", "local_scgd"):
    del config.methods[label]
  with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES):
    summary = runner.train_and_evaluate(config, str(tmp_path), QUIET)
  for name in ("config.json", "metrics.jsonl", "metrics.csv", "summary.json", "curves.png"):
    assert os.path.exists(tmp_path / name), name
  records = outputs.read_jsonl(tmp_path / "metrics.jsonl")  # streamed by the runtime
  assert [r["round"] for r in records] == [1, 2, 3]
  for r in records:
    assert r["method"] == "local_scgdm" and r["seed"] == 0
    assert np.isfinite(r["train_loss"]) and r["train_loss"] > 0
    assert 0 <= r["val_acc"] <= 1 and 0 <= r["train_acc"] <= 1
  written = json.loads((tmp_path / "summary.json").read_text())
  entry = written["methods"]["local_scgdm"]
  final = entry["per_seed"]["0"]
  assert entry["diverged_seeds"] == [] and "diverged" not in final
  assert final["round"] == 3 and final["iteration"] == 6
  assert final["val_acc"] == pytest.approx(records[-1]["val_acc"])
  assert entry["val_acc"]["mean"] == pytest.approx(final["val_acc"])
  assert 0 <= final["test_acc"] <= 1
  assert [row["method"] for row in written["table"]] == ["local_scgdm"]
  assert "note" not in written["table"][0]
  assert written["setting"] == "2-way 1-shot" and summary["wall_seconds"] > 0
  assert len(written["alphabets"]["train"]) == 3
  saved = json.loads((tmp_path / "config.json").read_text())
  assert saved["inner_lr"] == 0.4 and saved["experiment"] == "omniglot"


@pytest.mark.compile_optimized  # trains the CNN (decision 80)
def test_e4_client_chunk_runs_clients_a_chunk_at_a_time_with_equal_results(tmp_path, monkeypatch):
  """``--config.client_chunk`` (20-way's memory): the training clients run a chunk at a time
  (a chunk above the 3 clients is all of them), and the rows equal the vmapped run's up to
  round-off. Noise images of 6 drawings a character, 2-shot 3-query tasks: the mock data's
  2-image sets make batch norm amplify round-off (a channel's two values nearly equal)."""
  drawings = np.full(21, 6)  # 7 alphabets of 3 characters
  data, _ = _synthetic(drawings, owner=np.repeat(np.arange(7), 3))
  monkeypatch.setattr(om, "load_omniglot", lambda data_dir: data)
  rows = {}
  for chunk in (0, 2):
    config = _tiny(rounds=2, eval_every=1, client_chunk=chunk, test_tasks=0, shots=2, query=3)
    for label in ("comfedl", "local_scgd"):
      del config.methods[label]
    runner.train_and_evaluate(config, str(tmp_path / str(chunk)), QUIET)
    rows[chunk] = outputs.read_jsonl(tmp_path / str(chunk) / "metrics.jsonl")
  assert [r["round"] for r in rows[2]] == [1, 2]
  for a, b in zip(rows[0], rows[2]):
    for key in ("train_loss", "train_acc", "val_loss", "val_acc"):
      assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-5), key
  assert rows[0][1]["train_loss"] != rows[0][0]["train_loss"]  # it trained
  setup = e4.setup(_tiny())
  [method] = [m for m in e4.methods(_tiny(), setup) if m.label == "comfedl"]
  for chunk, expected in ((0, None), (2, 2), (5, 3)):
    config = _tiny(client_chunk=chunk)
    run = e4.build(config, method, 0, e4.prepare(config, 0, setup))
    assert run.simulate.get("client_chunk") == expected
  assert e4_config.get_config().client_chunk == 0  # default: every client at once


def test_e4_figure_labels_every_axis_with_integer_ticks():
  records = [
    {
      "round": r,
      "iteration": 2 * r,
      "method": m,
      "seed": s,
      "train_loss": 1.0 / r + 0.01 * s,
      "val_acc": 0.5,
    }  # every method coincides
    for m in ("local_scgdm", "comfedl", "local_scgd")
    for s in (0, 1)
    for r in (1, 2)
  ]
  fig = e4.figure(records, _tiny(), ["local_scgdm", "comfedl", "local_scgd"])
  assert len(fig.axes) == 2
  for ax in fig.axes:
    assert ax.get_xlabel().startswith("meta-iteration") and ax.get_ylabel()
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
    styles = {(line.get_linestyle(), line.get_marker()) for line in ax.get_lines()}
    assert len(styles) == 3  # coinciding methods stay distinguishable


def test_e4_defaults_are_the_paper_settings():
  config = e4_config.get_config()
  assert (config.ways, config.shots, config.query, config.inner_lr) == (5, 1, 15, 0.4)
  assert config.alphabet_split == "vinyals" and tuple(config.split_sizes) == (33, 5, 12)
  assert config.filters == 64 and config.rotations and config.batch_size == 1
  assert (config.rounds, config.local_steps, config.learning_rate) == (1000, 5, 0.1)
  assert e4.check(config) is None
  methods = {m.label: m for m in e4.methods(config, None)}
  assert set(methods) == {"local_scgdm", "comfedl", "local_scgd"}
  for label, method in methods.items():
    alg = method.build()
    assert alg.name == label and alg.plan.local_steps == 5
  assert methods["local_scgdm"].learning_rate == 1.0
  assert methods["local_scgdm"].kwargs == {"beta": 0.1, "alpha": 0.9, "gamma": 0.99}
  assert methods["comfedl"].learning_rate == 0.1 and methods["comfedl"].kwargs == {}
  assert methods["local_scgd"].learning_rate == 0.1
  assert methods["local_scgd"].kwargs == {"gamma": 0.99}
  assert methods["local_scgdm"].build().plan.every_round == ("u", "m")
  # a method with its own local_steps keeps the meta-iterations and evaluation points
  own = dataclasses.replace(methods["comfedl"], local_steps=10)
  assert runner.same_iterations(config, own) == {"rounds": 500, "eval_every": 5}
  assert methods["comfedl"].settings()["rounds"] == 1000


@pytest.mark.parametrize(
  "changes,field",
  [
    (dict(ways=1), "--config.ways"),
    (dict(shots=0), "--config.shots"),
    (dict(shots=5, query=16), r"--config.shots \+ --config.query"),
    (dict(tasks_per_episode=0), "--config.tasks_per_episode"),
    (dict(inner_lr=0.0), "--config.inner_lr"),
    (dict(eval_inner_steps=-1), "--config.eval_inner_steps"),
    (dict(filters=0), "--config.filters"),
    (dict(batch_size=2), "--config.batch_size"),
    (dict(alphabet_split="background"), "--config.alphabet_split"),
    (dict(split_sizes=(3, 2)), "--config.split_sizes"),
    (dict(split_sizes=(3, 2, 2)), "--config.split_sizes"),
    (dict(seeds=(0, 0)), "--config.seeds"),
    (dict(test_tasks=-1), "--config.test_tasks"),
    (dict(client_chunk=-1), "--config.client_chunk"),
    (dict(local_steps=0), "--config.local_steps"),
  ],
)
def test_bad_fields_name_the_field(tmp_path, changes, field):
  config = e4_config.get_config()
  for key, value in changes.items():
    setattr(config, key, value)
  _refused(config, tmp_path, field)  # before the data is read


@pytest.mark.parametrize(
  "label,key,value,field",
  [
    ("local_scgdm", "gamma", 1.0, "--config.methods.local_scgdm.gamma"),
    ("local_scgdm", "learning_rate", 2.0, "--config.methods.local_scgdm"),
    ("local_scgd", "gamma", 1.5, "--config.methods.local_scgd.gamma"),
    ("comfedl", "local_steps", 3, "--config.methods.comfedl.local_steps must divide"),
  ],
)
def test_bad_method_fields_name_the_field(tmp_path, monkeypatch, mock, label, key, value, field):
  config = _tiny()
  config.methods[label][key] = value
  monkeypatch.setattr(om, "load_omniglot", lambda data_dir: mock)  # read once per module
  _refused(config, tmp_path, field)


def _refused(config, tmp_path, field):
  with pytest.raises(ValueError, match=field) as err:
    runner.train_and_evaluate(config, str(tmp_path / "out"), QUIET)
  assert "\n" not in str(err.value)
  assert not (tmp_path / "out").exists()  # refused before anything was written


def test_missing_omniglot_is_one_line_naming_the_field(tmp_path):
  with pytest.raises(FileNotFoundError) as err:
    runner.train_and_evaluate(_tiny(data_dir=str(tmp_path / "empty")), str(tmp_path / "out"), QUIET)
  assert "\n" not in str(err.value) and "--config.data_dir" in str(err.value)
  assert not (tmp_path / "out").exists()  # refused before anything was written


def test_the_driver_runs_the_omniglot_config_and_reports_errors_in_one_line(tmp_path):
  run = lambda *args: helpers.run(
    [
      sys.executable,
      "-m",
      "experiments.main",
      "--config=experiments/configs/omniglot.py",
      f"--workdir={tmp_path}",
      *args,
    ],
    cwd=helpers.ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  missing = run(f"--config.data_dir={tmp_path / 'empty'}")
  assert missing.returncode == 1 and "Traceback" not in missing.stderr
  last = missing.stderr.strip().splitlines()[-1]
  assert last.startswith("error: TFDS omniglot") and "--config.data_dir" in last
  bad = run("--config.alphabet_split=background")
  assert bad.returncode == 1
  assert bad.stderr.strip().splitlines()[-1].startswith("error: --config.alphabet_split")
