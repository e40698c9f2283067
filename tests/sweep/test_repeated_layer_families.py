"""Every family whose layers ``etmlx.llm.repeated_layers`` traces once (its ``FAMILIES``)
is tested: ``make test`` runs a few (tests/models/test_repeated_layers.py), ``make
test-vision`` this sweep of the others, each exported three layers deep and generating
eager's tokens (tests/repeated.py)."""

import pytest
import transformers
from repeated import COMPARED_WHOLE, IN_MAKE_TEST, SETTINGS, check_traced_once_per_layer

from etmlx.llm import repeated_layers

SWEPT = sorted(set(SETTINGS) - set(IN_MAKE_TEST) - set(COMPARED_WHOLE))


def test_every_family_traced_once_per_layer_is_tested():
    tested = {getattr(transformers, f"{family}Config").model_type for family in SETTINGS}
    assert tested == set(repeated_layers.FAMILIES)
    assert set(IN_MAKE_TEST) | set(COMPARED_WHOLE) <= set(SETTINGS)


@pytest.mark.parametrize("family", SWEPT)
def test_every_other_family_traced_once_per_layer_generates_eager_tokens(family, tmp_path):
    check_traced_once_per_layer(family, tmp_path)
