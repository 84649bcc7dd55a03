"""Each state vocabulary is spelled once (``torchyard_contract.state``): the Literals the API's
schemas use name exactly the members of their Enum, so a new state cannot reach the database
without reaching the published document, or the other way round."""

from enum import Enum
from typing import get_args

import pytest

from torchyard_contract import runfiles, state


@pytest.mark.parametrize(("literal", "enum"), [
    (state.SweepStateName, state.SweepState),
    (state.TrialOutcomeName, state.TrialOutcome),
    (state.WebhookEventName, state.WebhookEvent),
    (state.DeliveryStateName, state.DeliveryState),
    (runfiles.OutcomeStateName, runfiles.OutcomeState),
])
def test_each_literal_names_its_enum(literal: object, enum: type[Enum]) -> None:
    assert list(get_args(literal)) == [member.value for member in enum]
