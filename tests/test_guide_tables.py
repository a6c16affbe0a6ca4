"""The guides' marked tables quote their results JSON (``docs/check_tables.py``, decision 117):
every marked table matches, and a wrong mean, standard error, seed value, paired difference,
count of seeds ahead or label is caught."""

import json

import pytest

from tests.helpers import ROOT, docs_program

check_tables = docs_program("check_tables")

GUIDES = sorted((ROOT / "docs" / "guides").glob("*.md"))


def test_every_marked_table_in_the_guides_matches_its_json():
  found = [check_tables.check(path) for path in GUIDES]
  assert [e for _, errors in found for e in errors] == []
  assert sum(tables for tables, _ in found) >= 23  # the tables marked at the last change


RESULT = {
  "methods": {
    "base": {
      "per_seed": {"0": {"acc": 0.40}, "1": {"acc": 0.44}},
      "acc": {"mean": 0.42, "stderr": 0.02},
    },
    "other": {
      "per_seed": {"0": {"acc": 0.45}, "1": {"acc": 0.46}},
      "acc": {"mean": 0.455, "stderr": 0.005},
    },
  },
  "paired_with": "base",
  "paired": {"other": {"seeds": [0, 1], "acc": {"mean": 0.035, "stderr": 0.015, "ahead": 2}}},
  "diverged": {"gone": {"0": "diverged at round 2"}},
}
TABLE = """| method | acc | per seed | minus base (ahead) | words |
| --- | --- | --- | --- | --- |
| `base` | 0.420 +- 0.020 | 0.40, 0.44 | | anything 7 |
| `other` (a note 9) | **0.455 +- 0.005** | 0.45, 0.46 | +3.5 +- 1.5 points (2 of 2) | 12 |
| `gone` | diverged at round 2 | | | |
"""


def errors_of(tmp_path, table=TABLE, result=None, columns="acc,per_seed:acc,paired:acc,-"):
  source = tmp_path / "result.json"
  source.write_text(json.dumps(result or RESULT))
  guide = tmp_path / "guide.md"
  guide.write_text(f"Text.\n\n<!-- checked: {source} columns={columns} -->\n{table}\nMore.\n")
  tables, errors = check_tables.check(guide)
  assert tables == 1
  return errors


def test_a_table_that_quotes_its_json_passes(tmp_path):
  assert errors_of(tmp_path) == []


@pytest.mark.parametrize(
  "old,new,expected",
  [
    ("0.420 +- 0.020", "0.421 +- 0.020", "base acc: 0.421 is not the mean"),
    ("0.420 +- 0.020", "0.420 +- 0.030", "base acc: 0.030 is not the stderr"),
    ("0.40, 0.44", "0.40, 0.45", "base per_seed:acc"),
    ("0.40, 0.44", "0.40", "base per_seed:acc"),
    ("+3.5 +- 1.5 points", "+3.6 +- 1.5 points", "other paired:acc: +3.6 +- 1.5 is not"),
    ("(2 of 2)", "(1 of 2)", "other paired:acc: '(1 of 2)' is not ahead on 2 of 2"),
    ("(2 of 2)", "(2 of 3)", "is not ahead on 2 of 2"),
    ("`other`", "`another`", "another: not among the JSON's methods"),
    ("| `base` | 0.420", "| base | 0.420", "no backticked label"),
  ],
)
def test_a_wrong_number_or_label_is_named(tmp_path, old, new, expected):
  errors = errors_of(tmp_path, TABLE.replace(old, new, 1))
  assert len(errors) == 1 and expected in errors[0], errors
  assert errors[0].startswith("guide.md:")  # where, as file:line


def test_a_summarys_method_that_diverged_on_every_seed_is_a_row_that_says_so(tmp_path):
  result = json.loads(json.dumps(RESULT))
  result["methods"]["lost"] = {"per_seed": {"0": {"diverged": "diverged at round 10"}}}
  row = "| `lost` | diverged at round 10 | | | |\n"
  assert errors_of(tmp_path, TABLE + row, result) == []
  errors = errors_of(tmp_path, TABLE + row.replace("diverged at", "stopped at"), result)
  assert errors == ["guide.md:9: lost: diverged on every seed; its row says not"], errors
  result["methods"]["lost"]["per_seed"]["1"] = {"acc": 0.3}  # one seed finished: numbers
  assert "lost acc:" in errors_of(tmp_path, TABLE + row, result)[0]


def test_a_whole_number_must_be_exact_and_digits_set_the_tolerance(tmp_path):
  assert check_tables.matches("0.46", 0.4649) and not check_tables.matches("0.46", 0.4651)
  assert check_tables.matches("0", 0.0) and not check_tables.matches("0", 0.3)
  assert check_tables.matches("+3.5", 0.035, 100) and not check_tables.matches("3", 0.035, 100)


def test_labels_name_rows_by_setting_and_must_count_the_rows(tmp_path):
  table = TABLE.replace("`base`", "I = 1").replace("`other` (a note 9)", "I = 2")
  table = "\n".join(table.splitlines()[:4]) + "\n"
  assert errors_of(tmp_path, table, columns="acc,per_seed:acc,paired:acc,- labels=base,other") == []
  errors = errors_of(tmp_path, table, columns="acc,per_seed:acc,paired:acc,- labels=base")
  assert errors == ["guide.md:3: 1 labels for 2 rows"]


def test_a_mark_whose_table_has_other_columns_or_a_missing_json_is_refused(tmp_path):
  assert errors_of(tmp_path, columns="acc,per_seed:acc") == [
    "guide.md:3: a row has not 2 + 1 cells: '| method | acc | per seed | minus base (ahead) | words |'"
  ]
  guide = tmp_path / "missing.md"
  guide.write_text("<!-- checked: experiments/results/nothing.json columns=acc -->\n| a | b |\n")
  assert check_tables.check(guide) == (
    1,
    ["missing.md:1: experiments/results/nothing.json does not exist"],
  )


SUMMARY = {  # an experiment's own summary: std, and against_fedavg's paired differences
  "methods": {
    "fedavg": {"per_seed": {}, "acc": {"mean": 0.50, "std": 0.01}},
    "afl": {"per_seed": {}, "acc": {"mean": 0.53, "std": 0.02}},
  },
  "against_fedavg": {
    "fedavg": {"afl": {"acc": {"difference": 0.03, "stderr": 0.005, "seeds": 5, "seeds_ahead": 5}}}
  },
}
SUMMARY_TABLE = """| method | acc | vs fedavg | vs fedavg, points |
| --- | --- | --- | --- |
| `afl` | 0.530 ± 0.020 | +0.030 ± 0.005 (5/5) | +3.0 +- 0.5 (5 of 5) |
| `fedavg` | 0.500 ± 0.010 | | |
"""


@pytest.mark.parametrize(
  "old,new,expected",
  [
    ("0.530 ± 0.020", "0.530 ± 0.010", "afl acc: 0.010 is not the std 0.02"),
    ("(5/5)", "(4/5)", "afl vs:fedavg:acc: '(4/5)' is not ahead on 5 of 5"),
    ("+0.030 ± 0.005", "+0.031 ± 0.005", "afl vs:fedavg:acc: +0.031 +- 0.005 is not"),
    ("+3.0 +- 0.5", "+0.030 +- 0.005", "afl vs100:fedavg:acc: +0.030 +- 0.005 is not"),
  ],
)
def test_a_summarys_spread_and_differences_are_checked(tmp_path, old, new, expected):
  columns = "acc,vs:fedavg:acc,vs100:fedavg:acc"
  assert errors_of(tmp_path, SUMMARY_TABLE, SUMMARY, columns) == []
  errors = errors_of(tmp_path, SUMMARY_TABLE.replace(old, new, 1), SUMMARY, columns)
  assert len(errors) == 1 and expected in errors[0], errors


def test_a_pair_the_summary_lacks_comes_from_the_per_seed_values(tmp_path):
  seeds = lambda *values: {str(s): {"acc": v} for s, v in enumerate(values)}
  result = {
    "methods": {
      "fedavg": {"per_seed": seeds(0.50, 0.52, 0.54), "acc": {"mean": 0.52, "std": 0.02}},
      "fedavg_uniform": {"per_seed": seeds(0.49, 0.52, 0.52), "acc": {"mean": 0.51, "std": 0.02}},
    },
    "against_fedavg": {"fedavg": {}},
  }
  # differences -1, 0, -2 points: mean -1, standard error 1/sqrt(3) = 0.58, none ahead
  table = "| method | minus FedAvg |\n| --- | --- |\n| `fedavg_uniform` | -1.00 +- 0.58 (0) |\n"
  assert errors_of(tmp_path, table, result, "vs100:fedavg:acc") == []
  wrong = errors_of(tmp_path, table.replace("0.58", "0.50"), result, "vs100:fedavg:acc")
  assert len(wrong) == 1 and "-1.00 +- 0.50 is not" in wrong[0]


@pytest.mark.parametrize(
  "old,new,expected",
  [
    ("0.455 +- 0.005", "0.455 +/- 0.009", "other acc: 0.009 is not the stderr"),
    ("0.455 +- 0.005", "0.455, 0.999", "is not 'mean' or 'mean +- spread'"),
    ("(2 of 2)", "(ahead on 0 of 2)", "is not 'k of n'"),
    ("+3.5 +- 1.5", "\u22123.5 +- 1.5", "-3.5 +- 1.5 is not"),  # a typographic minus is a minus
    ("| 12 |", "|", "a row has not 4 + 1 cells"),
  ],
)
def test_a_cell_of_another_form_is_refused_not_skipped(tmp_path, old, new, expected):
  errors = errors_of(tmp_path, TABLE.replace(old, new, 1))
  assert len(errors) == 1 and expected in errors[0], errors


def test_a_mark_not_followed_by_its_table_or_mistyped_is_an_error(tmp_path):
  source = tmp_path / "result.json"
  source.write_text(json.dumps(RESULT))
  guide = tmp_path / "guide.md"
  guide.write_text(f"<!-- checked: {source} columns=acc -->\nA paragraph.\n\n| m | acc |\n")
  assert check_tables.check(guide)[1] == [
    "guide.md:1: no table (a header, a | --- | line, rows) right after the mark"
  ]
  guide.write_text(f"<!-- checked: {source} columns=acc  -->\n| m | acc |\n| --- | --- |\n")
  assert "a mark not of the form" in check_tables.check(guide)[1][0]


def test_a_json_without_what_a_cell_quotes_is_one_line_not_a_traceback(tmp_path):
  result = {"methods": {"base": {"acc": {"mean": 0.42, "stderr": 0.02}}}}  # no per_seed
  errors = errors_of(tmp_path, TABLE.split("| `other`")[0], result)
  assert errors == [
    "guide.md:6: base per_seed:acc: the JSON lacks what the cell quotes (KeyError: 'per_seed')"
  ]


def test_merge_workdirs_markdown_passes_with_one_seed_and_an_unpaired_label(tmp_path):
  from experiments import merge_workdirs

  result = {
    "methods": {
      "base": {"per_seed": {"0": {"acc": 0.4}}, "acc": {"mean": 0.4, "stderr": None}},
      "other": {"per_seed": {"0": {"acc": 0.45}}, "acc": {"mean": 0.45, "stderr": None}},
      "lone": {"per_seed": {"1": {"acc": -0.3}}, "acc": {"mean": -0.3, "stderr": None}},
    },
    "paired_with": "base",
    "paired": {"other": {"seeds": [0], "acc": {"mean": 0.05, "stderr": None, "ahead": 1}}},
  }
  source = tmp_path / "result.json"
  source.write_text(json.dumps(result))
  table = merge_workdirs.markdown(str(source), result, ["acc"])
  assert "| `other` | 0.450 | +5.00 (1 of 1) |" in table and "| `lone` | -0.300 |  |" in table
  (tmp_path / "guide.md").write_text(table + "\n")
  assert check_tables.check(tmp_path / "guide.md") == (1, [])
