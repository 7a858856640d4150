"""Shared fixtures. No ``__init__.py`` here: verl's wheel installs a top-level ``tests`` package we must not shadow."""

import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
