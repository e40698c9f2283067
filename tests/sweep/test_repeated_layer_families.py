"""Every family whose layers ``etmlx.llm.repeated_layers`` traces once (its ``FAMILIES``)
exports three layers deep and generates eager's tokens (tests/repeated.py). ``make
test-vision`` runs this sweep; ``make test`` runs a few (tests/models/test_repeated_layers.py)."""

import pytest
import transformers
from repeated import SETTINGS, check_traced_once_per_layer

from etmlx.llm import repeated_layers


def test_every_family_traced_once_per_layer_is_tested():
    tested = {getattr(transformers, f"{family}Config").model_type for family in SETTINGS}
    assert tested == set(repeated_layers.FAMILIES)


@pytest.mark.parametrize("family", sorted(SETTINGS))
def test_every_family_traced_once_per_layer_generates_eager_tokens(family, tmp_path):
    check_traced_once_per_layer(family, tmp_path)
