"""``fedco.ALGORITHMS`` lookups of a name it does not hold name the close matches and where
the list is (a bare ``KeyError: 'fedavgg'`` before), and stay a ``KeyError``."""

import re

import pytest

import fedco
import fedco.testing
from tests.helpers import ROOT


@pytest.mark.parametrize(
  "name,close",
  [("fedavgg", "'fedavg'"), ("FedDRO", "'feddro'"), ("scafold", "'scaffold'")],
)
def test_an_unknown_name_names_the_close_matches_and_the_list(name, close):
  with pytest.raises(KeyError) as caught:
    fedco.ALGORITHMS[name]
  message = str(caught.value)  # printed as written, not quoted as a bare KeyError's
  assert message.startswith(f"fedco.ALGORITHMS has no algorithm {name!r} (did you mean {close}")
  assert "sorted(fedco.ALGORITHMS)" in message and "docs/algorithms.md" in message
  assert len(message.splitlines()) == 1


def test_a_name_close_to_none_still_says_where_the_list_is():
  with pytest.raises(KeyError, match=r"^fedco\.ALGORITHMS has no algorithm 'zzz'; its \d+ names"):
    fedco.algorithms.ALGORITHMS["zzz"]
  # membership and .get are plain dict lookups: no error, no suggestion
  assert "zzz" not in fedco.ALGORITHMS and fedco.ALGORITHMS.get("zzz") is None
  assert fedco.ALGORITHMS["fedavg"] is fedco.fedavg


ALGORITHMS_DOC = (ROOT / "docs" / "algorithms.md").read_text()


@pytest.mark.parametrize("name", sorted(fedco.ALGORITHMS))
def test_every_registry_name_has_a_row_in_the_algorithms_table(name):
  assert (
    f"| `{name}(" in ALGORITHMS_DOC
    or f"`, `{name}(" in ALGORITHMS_DOC
    or (f" / `{name}(" in ALGORITHMS_DOC)
  ), f"docs/algorithms.md has no row for {name}"


def test_the_kit_example_shows_every_check_in_order():
  """The sample output under ``check_algorithm``'s example lists ``fedco.testing.CHECKS``."""
  shown = re.findall(r"'(\w+)': '(?:passed|skipped)", ALGORITHMS_DOC)
  assert shown == list(fedco.testing.CHECKS)
