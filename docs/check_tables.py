"""Checks the numbers in the guides' marked tables against the results JSON they quote.

A table is marked by an HTML comment on the line before it (hidden on GitHub and in the
built docs; decision 117)::

    <!-- checked: experiments/results/X.json columns=test_acc,per_seed:test_acc,paired:test_acc,- -->

The table follows the mark at once: a header, a ``| --- |`` line, one row a method, each
with one cell a column. The JSON is one ``experiments/merge_workdirs.py`` (``--markdown``
prints such a table) or an experiment's summary writes. Each column after the first (the
method) names what its cells quote:

- ``KEY``: ``mean +- spread`` of ``methods.<label>.KEY``, the spread its ``stderr`` (merged
  JSONs) or else its ``std`` (the experiments' summaries); ``±`` and ``+/-`` read as ``+-``;
  a cell may quote the mean alone; words in parentheses are not read, other numbers are
  refused;
- ``per_seed:KEY``: ``methods.<label>.per_seed.<seed>.KEY`` in seed order, comma separated;
- ``paired:KEY``: ``paired.<label>.KEY`` in points (100x): ``mean +- stderr (k of n)``,
  ``(k/n)`` or ``(k)``, ``k`` the seeds it is ahead on (or no parentheses, with an
  ``ahead:KEY`` column ``k of n`` beside it); a cell is empty where the JSON holds no
  difference (the reference label's);
- ``vs:BASE:KEY`` / ``vs100:BASE:KEY``: an experiment summary's
  ``against_fedavg.BASE.<label>.KEY`` (``difference``, ``stderr``, ``seeds_ahead``) as
  written there or in points, in the same form (a pair the summary lacks, such as one FedAvg
  run against the other, is computed from the two labels' per-seed values);
- ``-``: not checked (words, or numbers from another file).

A row's label is the first backticked word of its first cell, or the row's entry in an
optional ``labels=a,b,...`` after the columns (one a row, for rows that name a setting, such
as ``I = 2``, rather than the JSON's label). A label the JSON's methods lack is an error
unless the JSON lists it as diverged (its row is then words, not checked); a summary's
method every seed of which diverged (``per_seed.<seed>.diverged``) has a row of words too,
which must say "diverged".
A number quoted with ``d`` decimals matches a value within half a unit of its last digit; a
whole number must be exact. A mark that does not parse, a table of another shape and a
JSON without what a cell quotes are errors too, each one line naming the file and line.

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
COUNT = r"(\d+)(?:(?: of |/)(\d+))?"  # seeds ahead: "k of n", "k/n" or "k"
SEPARATOR = re.compile(r"^\|(\s*:?-+:?\s*\|)+$")
DIFFERENCES = ("paired", "ahead", "vs", "vs100")


class Mismatch(Exception):
  """A cell that does not quote its JSON, or a JSON without what the cell quotes."""


def _plain(cell: str) -> str:
  """The cell's text with bold dropped and every way of writing +- and minus made one."""
  for other, plain in (("±", "+-"), ("+/-", "+-"), ("\u2212", "-"), ("\u2013", "-"), ("*", "")):
    cell = cell.replace(other, plain)
  return cell.strip()


def matches(quoted: str, value: Optional[float], scale: float = 1.0) -> bool:
  """Whether ``quoted`` (a number as written) is ``value * scale`` rounded to its digits."""
  if value is None:
    return False
  decimals = len(quoted.split(".")[1]) if "." in quoted else 0
  tolerance = 0.5 * 10.0**-decimals + 1e-9 if decimals else 1e-9
  return abs(float(quoted) - value * scale) <= tolerance


def _mean_cell(cell: str, entry: dict) -> None:
  numbers = NUMBER.findall(re.sub(r"\([^)]*\)", "", cell))
  if not numbers or len(numbers) > (2 if "+-" in cell else 1):
    raise Mismatch(f"{cell!r} is not 'mean' or 'mean +- spread'")
  spread_name = "stderr" if "stderr" in entry else "std"  # merged JSONs: stderr; summaries: std
  if not matches(numbers[0], entry["mean"]):
    raise Mismatch(f"{numbers[0]} is not the mean {entry['mean']}")
  if len(numbers) == 2 and not matches(numbers[1], entry[spread_name]):
    raise Mismatch(f"{numbers[1]} is not the {spread_name} {entry[spread_name]}")


def _per_seed_cell(cell: str, per_seed: dict, key: str) -> None:
  values = [per_seed[s][key] for s in sorted(per_seed, key=int)]
  numbers = NUMBER.findall(cell)
  if len(numbers) != len(values) or not all(map(matches, numbers, values)):
    raise Mismatch(f"{', '.join(numbers)} are not the seeds' {values}")


def _ahead(text: str, entry: dict) -> None:
  count = re.fullmatch(rf"\(?{COUNT}\)?", text)
  if count is None:
    raise Mismatch(f"{text!r} is not 'k of n'")
  if int(count.group(1)) != entry["ahead"] or (
    count.group(2) and int(count.group(2)) != entry["seeds"]
  ):
    raise Mismatch(f"{text!r} is not ahead on {entry['ahead']} of {entry['seeds']}")


def _difference_cell(cell: str, entry: dict, scale: float) -> None:
  counts = [p for p in re.findall(r"\([^)]*\)", cell) if re.search(r"\d", p)]
  if len(counts) > 1 or (counts and not cell.endswith(counts[0])):
    raise Mismatch(f"{cell!r} is not 'mean +- stderr (k of n)'")
  numbers = NUMBER.findall(cell[: -len(counts[0])] if counts else cell)
  mean, stderr = entry["mean"], entry["stderr"]
  if stderr is None and len(numbers) == 1:  # one seed: no standard error to quote
    numbers, stderr = numbers + ["0"], 0.0
  if len(numbers) != 2:
    raise Mismatch(f"{cell!r} is not 'mean +- stderr (k of n)'")
  if not (matches(numbers[0], mean, scale) and matches(numbers[1], stderr, scale)):
    raise Mismatch(f"{numbers[0]} +- {numbers[1]} is not {mean} +- {stderr} (x{scale:g})")
  if counts:
    _ahead(counts[0], entry)


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
  # the tables' own statistic (what merge_workdirs and the summaries report)
  from fedco.experiment import outputs

  return {**outputs.mean_and_stderr(diffs), "ahead": sum(d > 0 for d in diffs), "seeds": len(diffs)}


def _difference(result: dict, kind: str, key: str, name: str) -> Optional[dict]:
  """A difference in one shape (mean, stderr, ahead, seeds); None where the JSON has none."""
  if kind in ("paired", "ahead"):
    entry = result.get("paired", {}).get(name, {})
    return {**entry[key], "seeds": len(entry["seeds"])} if key in entry else None
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


def _check_cell(column: str, cell: str, result: dict, name: str) -> None:
  kind, _, key = column.partition(":") if ":" in column else ("", "", column)
  entry = result["methods"][name]
  if kind in DIFFERENCES:
    difference = _difference(result, kind, key, name)
    reference = result.get("paired_with") if kind in ("paired", "ahead") else key.split(":")[0]
    if not cell and (difference is None or name == reference):
      return  # nothing quoted where there is no difference (the reference's own row)
    if difference is None:
      raise Mismatch("the JSON holds no such difference")
    if kind == "ahead":
      _ahead(cell, difference)
    else:
      _difference_cell(cell, difference, 1.0 if kind == "vs" else 100.0)
  elif kind == "per_seed":
    _per_seed_cell(cell, entry["per_seed"], key)
  elif kind == "":
    _mean_cell(cell, entry[key])
  else:
    raise Mismatch(f"unknown column kind {kind!r}")


def check_row(cells: List[str], columns: List[str], result: dict, name: str = "") -> List[str]:
  """The mismatches of one table row (its cells without the ``|`` borders); ``name``: its
  label in the JSON (default: the first backticked word of its first cell)."""
  label = re.search(r"`([^`]+)`", cells[0])
  if not name and label is None:
    return [f"row {cells[0]!r}: no backticked label"]
  name = name or label.group(1)
  methods = result.get("methods", {})
  if name not in methods and name in result.get("diverged", {}):
    return []
  if _diverged_everywhere(methods.get(name)):  # a summary's method with no finished seed
    words = " ".join(cells[1:])
    return [] if "diverged" in words else [f"{name}: diverged on every seed; its row says not"]
  if name not in methods:
    return [f"{name}: not among the JSON's methods {sorted(methods)}"]
  errors = []
  for column, cell in zip(columns, cells[1:]):
    if column == "-":
      continue
    try:
      _check_cell(column, _plain(cell), result, name)
    except Mismatch as e:
      errors.append(f"{name} {column}: {e}")
    except (KeyError, TypeError, ValueError, AttributeError) as e:
      errors.append(
        f"{name} {column}: the JSON lacks what the cell quotes ({type(e).__name__}: {e})"
      )
  return errors


def _diverged_everywhere(entry) -> bool:
  """Whether an experiment summary's ``methods.<label>`` entry has seeds and every one of
  them diverged (its ``per_seed.<seed>`` holds ``diverged``)."""
  seeds = entry.get("per_seed", {}) if isinstance(entry, dict) else {}
  return bool(seeds) and all(isinstance(v, dict) and "diverged" in v for v in seeds.values())


def _table(lines: List[str], columns: List[str]) -> List[str]:
  """The rows of the table right after a mark; a table of another shape raises Mismatch."""
  block = []
  for line in lines:
    if not line.startswith("|"):
      break
    block.append(line.rstrip())
  if len(block) < 3 or not SEPARATOR.match(block[1]):
    raise Mismatch("no table (a header, a | --- | line, rows) right after the mark")
  for row in block:
    if len(row.split("|")) - 2 != len(columns) + 1:
      raise Mismatch(f"a row has not {len(columns)} + 1 cells: {row[:60]!r}")
  return block[2:]


def check(path: pathlib.Path) -> Tuple[int, List[str]]:
  """The number of marked tables in ``path`` and the mismatches found in them."""
  lines, tables, errors = path.read_text().splitlines(), 0, []
  for i, line in enumerate(lines):
    if "<!-- checked:" not in line:
      continue
    where = f"{path.name}:{i + 1}"
    mark = MARK.match(line.strip())
    if not mark:
      errors.append(f"{where}: a mark not of the form '<!-- checked: FILE columns=A,B -->'")
      continue
    tables += 1
    source = ROOT / mark.group(1)
    if not source.is_file():
      errors.append(f"{where}: {mark.group(1)} does not exist")
      continue
    result: Dict = json.loads(source.read_text())
    columns = mark.group(2).split(",")
    try:
      body = _table(lines[i + 1 :], columns)
    except Mismatch as e:
      errors.append(f"{where}: {e}")
      continue
    names = mark.group(3).split(",") if mark.group(3) else [""] * len(body)
    if len(names) != len(body):
      errors.append(f"{where}: {len(names)} labels for {len(body)} rows")
      continue
    for n, (row, name) in enumerate(zip(body, names)):
      errors += [
        f"{path.name}:{i + 4 + n}: {e}"
        for e in check_row(row.split("|")[1:-1], columns, result, name)
      ]
  return tables, errors


def main(paths: List[str]) -> int:
  errors = [e for p in paths for e in check(pathlib.Path(p))[1]]
  print("\n".join(errors) or f"{len(paths)} files: every marked table matches its JSON")
  return 1 if errors else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
