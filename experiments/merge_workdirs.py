r"""Merge workdirs of one experiment run in parts (split by ``--methods`` or seeds across
processes, one process per workdir) into one results JSON: each run's final evaluated
metrics, and per method the mean, standard error and seeds over the runs that finished.
A source may also be a metrics file itself (``.jsonl`` or ``.csv``, a workdir's
``metrics.*`` or one kept in ``experiments/results/``).

    python -m experiments.merge_workdirs --out=experiments/results/e8_femnist_byzantine.json \
      --keys=heldout_acc_avg,heldout_acc_p10,heldout_acc_worst runs/a runs/b ...

A run counts as finished when its last evaluated round is the largest any run of its
algorithm reached (``--rounds=afl:2000,fedavg:100`` sets them instead: the label's first
``_``-separated word is the algorithm). Runs cut short are listed under ``incomplete``.
A label and seed found in several workdirs keeps the row of the latest round.
``--at_round=N`` takes each run's row at round ``N`` instead of its last (runs that never
evaluated round ``N`` are incomplete), so runs of different lengths compare at one round.
``--paired_with=<label>`` adds each label's difference from that label on the seeds both
finished: mean, standard error and how many seeds it is ahead on.
``--labels=a,b`` merges only those labels.
Runs a workdir's ``summary.json`` says diverged are left out of both and listed under
``diverged`` with their notes.
A key a run's rows lack is taken from its workdir's ``summary.json`` final
(``methods.<label>.per_seed.<seed>``, with its ``round``), which fills the row of that round:
metrics an experiment evaluates once at the end live only there (E4's ``test_acc``); a key
the rows hold keeps the rows' value.
``--curves=<png>`` draws each label's mean and standard error of the first key over the
rounds every one of its finished seeds evaluated (``--curve_keys=a,b``: a panel for each of
those keys instead).
``--markdown`` prints the table a guide quotes, under the mark ``docs/check_tables.py``
checks it by (decision 117; the mark names ``--out`` relative to the repository): each
key's mean +- standard error and, with ``--paired_with``, the first key's paired difference
in points.
``--setting=`` and ``--timing=`` record, in words, what was run and how long it took on
which machine; ``commands`` lists each finished workdir's run command (its ``summary.json``
``command``), then each ``--run_command`` (a run whose summary does not record one: a run
cut short, a kept metrics file), then this merge's own command line, so the JSON names
every command that made it.
``--figure=<png>`` draws a grouped bar chart of the first key for labels
``<algorithm>_<rule>_<attack>_<n>`` (the Byzantine grids' naming), with standard errors.
"""

from __future__ import annotations

import csv
import json
import os
import sys
from typing import Dict, List, Optional

import numpy as np
from absl import app, flags

from fedco.experiment import curves, outputs

flags.DEFINE_string("out", None, "The merged JSON to write.", required=True)
flags.DEFINE_list("keys", ["heldout_acc_avg"], "The metrics kept from each run's final row.")
flags.DEFINE_list("rounds", [], "algorithm:rounds of a finished run (default: the largest seen).")
flags.DEFINE_integer("at_round", None, "Take each run's row at this round, not its last.")
flags.DEFINE_string("paired_with", "", "A label every other label is compared with, seed by seed.")
flags.DEFINE_string("curves", "", "Each label's mean +- standard error of the first key by round.")
flags.DEFINE_list("curve_keys", [], "The keys --curves draws, a panel each (default: the first).")
flags.DEFINE_string("figure", "", "A grouped bar chart of the first key (Byzantine grids).")
flags.DEFINE_string("title", "", "The figure's title.")
flags.DEFINE_list("labels", [], "Merge only these labels (default: every label found).")
flags.DEFINE_string("setting", "", "What was run, in words (the paper's setting, data, rounds).")
flags.DEFINE_string(
  "timing", "", "How long the runs took, side by side with what, on which machine."
)
flags.DEFINE_multi_string("run_command", [], "A run's command its workdir's summary lacks.")
flags.DEFINE_bool("markdown", False, "Print the guide's table of the result, marked for checking.")
FLAGS = flags.FLAGS


def metrics_file(source: str) -> str:
  """A metrics file itself, or a workdir's ``metrics.jsonl`` (finished) or ``in_progress/metrics.jsonl``."""
  if os.path.isfile(source) and source.endswith((".jsonl", ".csv")):
    return source
  for path in ("metrics.jsonl", os.path.join("in_progress", "metrics.jsonl")):
    if os.path.exists(os.path.join(source, path)):
      return os.path.join(source, path)
  raise FileNotFoundError(
    f"{source}: neither a .jsonl/.csv metrics file nor a workdir with metrics.jsonl "
    "(nor in_progress/metrics.jsonl)"
  )


def _number(text: str):
  try:
    return int(text)
  except ValueError:
    try:
      return float(text)
    except ValueError:
      return text


def read_rows(path: str) -> List[dict]:
  """The metric rows of a ``.jsonl`` or ``.csv`` file (CSV cells read back as numbers)."""
  if path.endswith(".csv"):
    with open(path, newline="") as f:
      return [{k: _number(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]
  return outputs.read_jsonl(path)


def load(sources: List[str]) -> List[dict]:
  """Every metric row of the sources (workdirs or metrics files), in order, read once."""
  return [row for source in sources for row in read_rows(metrics_file(source))]


def only(records: List[dict], labels: List[str]) -> List[dict]:
  """The rows of ``labels`` (every row when empty); ``ValueError`` naming a label no
  source holds."""
  if not labels:
    return records
  found = {r["method"] for r in records}
  missing = [label for label in labels if label not in found]
  if missing:
    raise ValueError(f"labels={','.join(missing)}: not in the sources; labels: {sorted(found)}")
  return [r for r in records if r["method"] in labels]


def final_rows(
  rows: List[dict], keys: List[str], at_round: Optional[int] = None
) -> Dict[str, Dict[int, dict]]:
  """``{label: {seed: {"round", key...}}}``: each run's last evaluated row (or its row at
  ``at_round``; a run without one keeps its last, so it counts as incomplete)."""
  out: Dict[str, Dict[int, dict]] = {}
  for row in rows:
    if not all(k in row for k in keys):
      continue
    runs = out.setdefault(row["method"], {})
    kept = runs.get(row["seed"], {}).get("round", -1)
    if (kept != at_round and row["round"] >= kept) or row["round"] == at_round:
      runs[row["seed"]] = {"round": row["round"], **{k: row[k] for k in keys}}
  return out


def summarize(rows, keys, rounds: Dict[str, int], at_round: Optional[int] = None):
  """Finished runs' mean, standard error (``None`` with one seed) and seeds per label."""
  expected: Dict[str, int] = {}
  for label, runs in rows.items():
    algorithm = label.split("_")[0]
    top = max([expected.get(algorithm, 0)] + [r["round"] for r in runs.values()])
    expected[algorithm] = at_round if at_round is not None else rounds.get(algorithm, top)
  methods, incomplete = {}, []
  for label, runs in sorted(rows.items()):
    done = {s: r for s, r in sorted(runs.items()) if r["round"] == expected[label.split("_")[0]]}
    incomplete += [f"{label} seed {s}" for s in sorted(set(runs) - set(done))]
    if not done:
      continue
    entry = {"seeds": list(done), "per_seed": {str(s): r for s, r in done.items()}}
    for key in keys:
      entry[key] = outputs.mean_and_stderr([r[key] for r in done.values()])
    methods[label] = entry
  return methods, incomplete, expected


def paired(methods, reference: str, keys: List[str]) -> Dict[str, dict]:
  """Each label's difference from ``reference`` per key on the seeds both finished: mean,
  standard error (``None`` with one seed), the seeds and how many of them it is ahead on."""
  if reference not in methods:
    raise ValueError(f"paired_with={reference!r}: no finished runs; labels: {sorted(methods)}")
  base = methods[reference]["per_seed"]
  out = {}
  for label, entry in methods.items():
    seeds = [s for s in entry["per_seed"] if s in base]
    if label == reference or not seeds:
      continue
    out[label] = {"seeds": [int(s) for s in seeds]}
    for key in keys:
      diffs = [entry["per_seed"][s][key] - base[s][key] for s in seeds]
      out[label][key] = {**outputs.mean_and_stderr(diffs), "ahead": int(sum(d > 0 for d in diffs))}
  return out


def curve_rows(rows: List[dict], key: str, methods) -> List[dict]:
  """The rows :func:`fedco.experiment.curves` draws: each label's finished seeds
  (``methods`` from :func:`summarize`) at the rounds every one of them evaluated."""
  seen: Dict[tuple, set] = {}
  for r in rows:
    if key in r and r["method"] in methods:
      seen.setdefault((r["method"], r["round"]), set()).add(str(r["seed"]))
  complete = {at for at, seeds in seen.items() if set(methods[at[0]]["per_seed"]) <= seeds}
  return [
    r
    for r in rows
    if (r["method"], r["round"]) in complete and str(r["seed"]) in methods[r["method"]]["per_seed"]
  ]


def curve_figure(records: List[dict], methods, keys: List[str], title: str = ""):
  """A panel a key: each label's mean +- standard error over its finished seeds (``methods``
  from :func:`summarize`) at the rounds every one of them evaluated that key."""
  kept = {id(r) for key in keys for r in curve_rows(records, key, methods)}
  picked = [r for r in records if id(r) in kept]
  return curves(picked, list(methods), [(key, key) for key in keys], title=title, band="stderr")


def summaries(sources: List[str]) -> List[dict]:
  """The ``summary.json`` of each source that is a finished workdir, read once."""
  out = []
  for source in sources:
    path = os.path.join(source, "summary.json")
    if os.path.isfile(path):
      with open(path) as f:
        try:
          out.append(json.load(f))
        except json.JSONDecodeError as err:
          raise ValueError(f"{path}: not a JSON summary ({err})") from None
  return out


def per_seed_finals(found: List[dict]):
  """``(label, seed, final)`` for each ``methods.<label>.per_seed.<seed>`` entry of the
  workdirs' summaries (``found``) that is a dict: the one walk :func:`diverged_runs` and
  :func:`summary_rows` share."""
  for summary in found:
    for label, entry in summary.get("methods", {}).items():
      for seed, final in entry.get("per_seed", {}).items():
        if isinstance(final, dict):
          yield label, str(seed), final


def diverged_runs(found: List[dict]) -> Dict[str, Dict[str, str]]:
  """``{label: {seed: note}}``: the runs the workdirs' summaries (``found``) say diverged (a
  diverged run's last rows can sit at the round every run of its algorithm stopped at, so
  its metrics alone would pass it as finished)."""
  out: Dict[str, Dict[str, str]] = {}
  for label, seed, final in per_seed_finals(found):
    if "diverged" in final:
      out.setdefault(label, {})[seed] = final["diverged"]
  return out


def summary_rows(found: List[dict]) -> List[dict]:
  """The final rows the workdirs' summaries (``found``) record, one a run: each
  ``methods.<label>.per_seed.<seed>`` holding a ``round`` (diverged runs left out)."""
  return [
    {"method": label, "seed": int(seed), **final}
    for label, seed, final in per_seed_finals(found)
    if "round" in final and "diverged" not in final and seed.isdigit()
  ]


def with_summaries(records: List[dict], finals: List[dict]) -> List[dict]:
  """``records`` whose rows at a run's final round (its :func:`summary_rows` row's) gain the
  keys only the summary holds (the rows' own values kept), plus the finals no row matches."""
  at = {(r["method"], r["seed"], r["round"]): r for r in finals}
  matched = set()
  out = []
  for row in records:
    key = (row.get("method"), row.get("seed"), row.get("round"))
    if key in at:
      matched.add(key)
      row = {**at[key], **row}
    out.append(row)
  return out + [r for key, r in at.items() if key not in matched]


def without(rows: Dict[str, Dict[int, dict]], diverged) -> Dict[str, Dict[int, dict]]:
  """``rows`` (:func:`final_rows`) less the runs of ``diverged`` (:func:`diverged_runs`)."""
  return {
    label: {s: r for s, r in runs.items() if str(s) not in diverged.get(label, {})}
    for label, runs in rows.items()
  }


def machine_and_wall(found: List[dict]):
  """The last workdir's machine and the workdirs' wall seconds, summed (``found``: their
  summaries)."""
  machine, wall = None, 0.0
  for summary in found:
    machine, wall = summary.get("machine", machine), wall + summary.get("wall_seconds", 0.0)
  return machine, wall


def commands(found: List[dict], given: List[str]) -> List[str]:
  """The commands that made a merged JSON: each summary's (``found``) recorded ``command``
  once, in order, then ``given`` (``--run_command``), then this merge's own."""
  recorded = [s["command"] for s in found if isinstance(s.get("command"), str)]
  return list(dict.fromkeys(recorded + list(given))) + [outputs.command_line()]


def _quoted(entry: dict, scale: float, digits: int, sign: str = "") -> str:
  """``mean +- stderr`` at ``digits`` decimals (the mean alone when there is no error)."""
  text = f"{scale * entry['mean']:{sign}.{digits}f}"
  return text if entry["stderr"] is None else f"{text} +- {scale * entry['stderr']:.{digits}f}"


def markdown(out: str, result: dict, keys: List[str]) -> str:
  """The guide's table of ``result`` (written to ``out``) with its ``check_tables`` mark."""
  reference = result.get("paired_with")
  columns, head = list(keys), list(keys)
  if reference:
    columns.append(f"paired:{keys[0]}")
    head.append(f"{keys[0]} minus {reference}, points (ahead)")
  lines = [
    f"<!-- checked: {out} columns={','.join(columns)} -->",
    "| method | " + " | ".join(head) + " |",
    "| --- " * (len(head) + 1) + "|",
  ]
  for label, entry in result["methods"].items():
    cells = [_quoted(entry[key], 1, 3) for key in keys]
    pair = result.get("paired", {}).get(label)
    if reference:
      cells.append(
        f"{_quoted(pair[keys[0]], 100, 2, '+')} ({pair[keys[0]]['ahead']} of {len(pair['seeds'])})"
        if pair
        else ""
      )
    lines.append(f"| `{label}` | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def draw(methods, key, path, title):
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  parts = [label.split("_") for label in methods]
  algorithms = list(dict.fromkeys(p[0] for p in parts))
  rules = list(dict.fromkeys(p[1] for p in parts))
  attacks = list(dict.fromkeys("_".join(p[2:]) for p in parts))
  fig, axes = plt.subplots(1, len(algorithms), figsize=(5 * len(algorithms), 4), sharey=True)
  axes = np.atleast_1d(axes)
  width = 0.8 / len(attacks)
  for ax, algorithm in zip(axes, algorithms):
    for i, attack in enumerate(attacks):
      entries = [methods.get(f"{algorithm}_{rule}_{attack}", {}).get(key, {}) for rule in rules]
      means = [e.get("mean", np.nan) for e in entries]
      errors = [e.get("stderr") or 0.0 for e in entries]
      x = np.arange(len(rules)) + (i - (len(attacks) - 1) / 2) * width
      ax.bar(x, means, width, yerr=errors, label=attack, capsize=2)
    ax.set_xticks(np.arange(len(rules)))
    ax.set_xticklabels(rules)
    ax.set_title(algorithm)
  axes[0].set_ylabel(key)
  axes[0].legend(fontsize=8, loc="lower left")
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def main(argv):
  workdirs = argv[1:]
  if not workdirs:
    raise app.UsageError("give the workdirs to merge")
  rounds = {a: int(r) for a, r in (item.split(":") for item in FLAGS.rounds)}
  try:  # bad input is one line (exit status 1), never a traceback
    records = only(load(workdirs), FLAGS.labels)
    finished = summaries(workdirs)
    filled = only(with_summaries(records, summary_rows(finished)), FLAGS.labels)
    rows = final_rows(filled, FLAGS.keys, FLAGS.at_round)
    diverged = diverged_runs(finished)
    rows = without(rows, diverged)
    methods, incomplete, expected = summarize(rows, FLAGS.keys, rounds, FLAGS.at_round)
    pairs = paired(methods, FLAGS.paired_with, FLAGS.keys) if FLAGS.paired_with else None
  except (FileNotFoundError, ValueError) as e:
    sys.exit(f"error: {e}")
  machine, wall = machine_and_wall(finished)
  out = {
    "note": "each run's final evaluated metrics (its row at at_round, when given); mean and "
    "standard error over the seeds that finished; runs cut short are listed under incomplete; "
    "paired: each label minus paired_with on the seeds both finished",
    "rounds": expected,
    "methods": methods,
    "incomplete": incomplete,
    **({"diverged": diverged} if diverged else {}),
    **({"at_round": FLAGS.at_round} if FLAGS.at_round is not None else {}),
    **({"paired_with": FLAGS.paired_with, "paired": pairs} if pairs is not None else {}),
    "sources": [metrics_file(w) for w in workdirs],
    "wall_seconds_of_finished_workdirs": wall,
    "machine": machine,
    **({"setting": FLAGS.setting} if FLAGS.setting else {}),
    **({"timing": FLAGS.timing} if FLAGS.timing else {}),
    "commands": commands(finished, FLAGS.run_command),
  }
  with open(FLAGS.out, "w") as f:
    json.dump(out, f, indent=1)
  if FLAGS.figure:
    draw(methods, FLAGS.keys[0], FLAGS.figure, FLAGS.title)
  if FLAGS.curves:
    fig = curve_figure(records, methods, FLAGS.curve_keys or FLAGS.keys[:1], FLAGS.title)
    fig.savefig(FLAGS.curves, dpi=110)
  print(f"{len(methods)} methods, {len(incomplete)} runs incomplete -> {FLAGS.out}")
  if FLAGS.markdown:
    repository = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    print(markdown(os.path.relpath(os.path.abspath(FLAGS.out), repository), out, FLAGS.keys))


if __name__ == "__main__":
  app.run(main)
