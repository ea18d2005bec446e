"""Fixtures the server tests share: the fixture checkpoint's weights and a live server
over them, one per module (a module that needs another server defines its own `live`)."""
from __future__ import annotations

import pytest

from tests.model.support import reference_params
from tests.server.support import LiveServer


@pytest.fixture(scope="module")
def params():
    return reference_params()


@pytest.fixture(scope="module")
def live(params):
    with LiveServer(params) as server:
        yield server
