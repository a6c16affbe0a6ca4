"""Checks the numbers in the guides' marked tables against the results JSON they quote.

A table is marked by an HTML comment on the line before it (hidden on GitHub and in the
built docs; decision 117)::

    <!-- checked: experiments/results/X.json columns=test_acc,per_seed:test_acc,paired:test_acc,- -->

The JSON is one ``experiments/merge_workdirs.py`` or an experiment's summary writes. Each column after the first (the
method) names what its cells quote:

- ``KEY``: ``mean +- spread`` of ``methods.<label>.KEY``, the spread its ``stderr`` (merged
  JSONs) or else its ``std`` (the experiments' summaries); ``±`` reads as ``+-``; a cell may
  quote the mean alone; words in parentheses are not read;
- ``per_seed:KEY``: ``methods.<label>.per_seed.<seed>.KEY`` in seed order, comma separated;
- ``paired:KEY``: ``paired.<label>.KEY`` in points (100x): ``mean +- stderr (k of n)``,
  ``(k/n)`` or ``(k)``, ``k`` the seeds it is ahead on (or no parentheses, with an
  ``ahead:KEY`` column ``k of n`` beside it); the reference label's cells are empty;
- ``vs:BASE:KEY`` / ``vs100:BASE:KEY``: an experiment summary's
  ``against_fedavg.BASE.<label>.KEY`` (``difference``, ``stderr``, ``seeds_ahead``) as
  written there or in points, in the same form (a pair the summary lacks, such as one FedAvg
  run against the other, is computed from the two labels' per-seed values);
- ``-``: not checked (words, or numbers from another file).

A row's label is the first backticked word of its first cell, or the row's entry in an
optional ``labels=a,b,...`` after the columns (one a row, for rows that name a setting, such
as ``I = 2``, rather than the JSON's label). A label the JSON's methods lack is an error
unless the JSON lists it as diverged (its row is then words, not checked).
A number quoted with ``d`` decimals matches a value within half a unit of its last digit; a
whole number must be exact.

Usage: ``python docs/check_tables.py docs/guides/*.md``: prints each mismatch, one a line,
and exits 1 if there was one.
"""

from __future__ import annotations

import json
import math
import pathlib
import re
import sys
from typing import Dict, List, Optional, Tuple

ROOT = pathlib.Path(__file__).resolve().parent.parent
MARK = re.compile(r"^<!-- checked: (\S+) columns=(\S+)(?: labels=(\S+))? -->$")
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


def _numbers(text: str) -> List[str]:
  return NUMBER.findall(text.replace("*", ""))


def matches(quoted: str, value: Optional[float], scale: float = 1.0) -> bool:
  """Whether ``quoted`` (a number as written) is ``value * scale`` rounded to its digits."""
  if value is None:
    return False
  decimals = len(quoted.split(".")[1]) if "." in quoted else 0
  tolerance = 0.5 * 10.0**-decimals + 1e-9 if decimals else 1e-9
  return abs(float(quoted) - value * scale) <= tolerance


def _mean_cell(cell: str, entry: dict) -> Optional[str]:
  numbers = _numbers(re.sub(r"\([^)]*\)", "", cell))
  spread = entry.get("stderr", entry.get("std"))  # merged JSONs: stderr; summaries: std
  if not numbers:
    return "no number"
  if not matches(numbers[0], entry.get("mean")):
    return f"{numbers[0]} is not the mean {entry.get('mean')}"
  if "+-" in cell and (len(numbers) < 2 or not matches(numbers[1], spread)):
    return f"{numbers[1:2]} is not the {'stderr' if 'stderr' in entry else 'std'} {spread}"
  return None


def _per_seed_cell(cell: str, per_seed: dict, key: str) -> Optional[str]:
  values = [per_seed[s].get(key) for s in sorted(per_seed, key=int)]
  numbers = _numbers(cell)
  if len(numbers) != len(values) or not all(map(matches, numbers, values)):
    return f"{', '.join(numbers)} are not the seeds' {values}"
  return None


COUNT = r"(\d+)(?:(?: of |/)(\d+))?"  # seeds ahead: "k of n", "k/n" or "k"


def _ahead(text: str, entry: dict) -> Optional[str]:
  count = re.fullmatch(rf"\(?{COUNT}\)?", text.strip("* "))
  if count is None:
    return f"{text!r} is not 'k of n'"
  if int(count.group(1)) != entry["ahead"] or (
    count.group(2) and int(count.group(2)) != entry["seeds"]
  ):
    return f"{text!r} is not ahead on {entry['ahead']} of {entry['seeds']}"
  return None


def _difference_cell(cell: str, entry: dict, scale: float) -> Optional[str]:
  ahead = re.search(rf"\({COUNT}\)", cell)
  numbers = _numbers(cell[: ahead.start()] if ahead else cell)
  mean, stderr = entry["mean"], entry["stderr"]
  if stderr is None and len(numbers) == 1:  # one seed: no standard error to quote
    numbers, stderr = numbers + ["0"], 0.0
  if len(numbers) < 2:
    return "not 'mean +- stderr (k of n)'"
  if not (matches(numbers[0], mean, scale) and matches(numbers[1], stderr, scale)):
    return f"{numbers[0]} +- {numbers[1]} is not {mean} +- {stderr} (x{scale:g})"
  return _ahead(ahead.group(0), entry) if ahead else None


def _difference(result: dict, kind: str, key: str, name: str) -> Optional[dict]:
  """A paired difference in one shape (mean, stderr, ahead, seeds), or None if absent."""
  if kind in ("paired", "ahead"):
    entry = result.get("paired", {}).get(name, {})
    if key not in entry:
      return None
    return {**entry[key], "seeds": len(entry["seeds"])}
  base, _, key = key.partition(":")
  entry = result.get("against_fedavg", {}).get(base, {}).get(name, {}).get(key)
  if entry is None:  # a pair the summary does not hold (two FedAvg runs): from the seeds
    return _from_seeds(result["methods"], name, base, key)
  return {
    "mean": entry["difference"],
    "stderr": entry["stderr"],
    "ahead": entry["seeds_ahead"],
    "seeds": entry["seeds"],
  }


def _from_seeds(methods: dict, name: str, base: str, key: str) -> Optional[dict]:
  """``name`` minus ``base`` on the seeds where both hold a finite ``key``."""
  if base not in methods:
    return None
  mine, theirs = methods[name]["per_seed"], methods[base]["per_seed"]
  finite = lambda row: isinstance(row.get(key), (int, float)) and math.isfinite(row[key])
  diffs = [
    mine[s][key] - theirs[s][key]
    for s in mine
    if s in theirs and finite(mine[s]) and finite(theirs[s])
  ]
  if not diffs:
    return None
  mean = sum(diffs) / len(diffs)
  spread = sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1) if len(diffs) > 1 else None
  return {
    "mean": mean,
    "stderr": math.sqrt(spread / len(diffs)) if spread is not None else None,
    "ahead": sum(d > 0 for d in diffs),
    "seeds": len(diffs),
  }


def _reference(result: dict, kind: str, key: str, name: str) -> bool:
  return name == (result.get("paired_with") if kind in ("paired", "ahead") else key.split(":")[0])


def check_row(cells: List[str], columns: List[str], result: dict, name: str = "") -> List[str]:
  """The mismatches of one table row (its cells without the ``|`` borders); ``name``: its
  label in the JSON (default: the first backticked word of its first cell)."""
  label = re.search(r"`([^`]+)`", cells[0])
  if not name and label is None:
    return [f"row {cells[0]!r}: no backticked label"]
  name, methods = name or label.group(1), result["methods"]
  if name not in methods and name in result.get("diverged", {}):
    return []
  if name not in methods:
    return [f"{name}: not among the JSON's methods {sorted(methods)}"]
  errors = []
  for column, cell in zip(columns, cells[1:]):
    kind, _, key = column.partition(":") if ":" in column else ("", "", column)
    cell = cell.strip().replace("±", "+-")
    if column == "-" or (not cell and _reference(result, kind, key, name)):
      continue
    if kind in ("paired", "ahead", "vs", "vs100"):
      entry = _difference(result, kind, key, name)
      if entry is None:
        why: Optional[str] = "no paired entry"
      elif kind == "ahead":
        why = _ahead(cell, entry)
      else:
        why = _difference_cell(cell, entry, 1.0 if kind == "vs" else 100.0)
    elif kind == "per_seed":
      why = _per_seed_cell(cell, methods[name]["per_seed"], key)
    elif kind == "" and key in methods[name]:
      why = _mean_cell(cell, methods[name][key])
    else:
      why = f"the JSON has no {column!r}"
    if why:
      errors.append(f"{name} {column}: {why}")
  return errors


def check(path: pathlib.Path) -> Tuple[int, List[str]]:
  """The number of marked tables in ``path`` and the mismatches found in them."""
  lines, tables, errors = path.read_text().splitlines(), 0, []
  for i, line in enumerate(lines):
    mark = MARK.match(line.strip())
    if not mark:
      continue
    tables += 1
    source = ROOT / mark.group(1)
    if not source.is_file():
      raise FileNotFoundError(f"{path.name}:{i + 1}: {mark.group(1)} does not exist")
    result: Dict = json.loads(source.read_text())
    columns = mark.group(2).split(",")
    rows = [r for r in lines[i + 1 :] if r.startswith("|")]
    body = []
    for r in lines[i + 3 :]:
      if not r.startswith("|"):
        break
      body.append(r)
    if len(rows) < 3 or len(rows[0].split("|")) - 3 != len(columns):
      errors.append(
        f"{path.name}:{i + 1}: the table after the mark has not {len(columns)} + 1 columns"
      )
      continue
    names = mark.group(3).split(",") if mark.group(3) else [""] * len(body)
    if len(names) != len(body):
      errors.append(f"{path.name}:{i + 1}: {len(names)} labels for {len(body)} rows")
      continue
    for n, (row, name) in enumerate(zip(body, names)):
      where = f"{path.name}:{i + 4 + n}"
      errors += [f"{where}: {e}" for e in check_row(row.split("|")[1:-1], columns, result, name)]
  return tables, errors


def main(paths: List[str]) -> int:
  errors = [e for p in paths for e in check(pathlib.Path(p))[1]]
  print("\n".join(errors) or f"{len(paths)} files: every marked table matches its JSON")
  return 1 if errors else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
