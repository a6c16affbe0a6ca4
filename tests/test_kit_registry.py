"""Every configuration of ``fedco.ALGORITHMS`` (each algorithm's registered ``settings``)
through ``fedco.testing.check_algorithm``: the kit users run on their own algorithms is
what guards the built-ins. The costlier checks run where they are cheap to share: sweep
and resume on a few algorithms here and in their own tests, the mesh for every
configuration in ``tests/test_mesh.py`` (one program per side)."""

import pytest

import fedco.testing
from tests import registry

LABELS = sorted(registry.CASES)
ROWS = fedco.testing.default_data().num_examples  # primal-dual DRO's row weights


def _kwargs(label):
  return registry.kwargs(label, local_steps=3, num_examples=ROWS)


CHECKS = ("builds", "state", "jit", "chain", "inject", "simulate", "server", "asynchronous")


@pytest.mark.parametrize("label", LABELS)
def test_every_registry_configuration_meets_the_contract(label):
  report = fedco.testing.check_algorithm(registry.factory(label), checks=CHECKS, **_kwargs(label))
  assert set(report) == set(CHECKS)
  plan = registry.factory(label)(**_kwargs(label)).plan
  sends_state = plan.fields or plan.round_start_loss
  assert all(
    v == "passed" or (check == "asynchronous" and sends_state and v.startswith("skipped"))
    for check, v in report.items()
  ), report


@pytest.mark.parametrize("label", ["feddro", "drfa", "primal_dual_dro"])
def test_sweep_and_resume_for_an_every_step_a_loss_querying_and_a_row_weighting_server(label):
  report = fedco.testing.check_algorithm(
    registry.factory(label), checks=("sweep", "resume"), **_kwargs(label)
  )
  assert report == {"sweep": "passed", "resume": "passed"}, report
