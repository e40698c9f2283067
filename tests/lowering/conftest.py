import pytest


@pytest.fixture
def whole_file(request):
    """Skips a coverage test when only part of its file was selected to run."""
    module = request.node.parent
    everything = {item.name for item in module.collect()}
    selected = {item.name for item in request.session.items if item.parent is module}
    if everything - selected:
        pytest.skip("only part of this file ran")
