from tests.integration.conftest import app, env, start_worker  # noqa: F401 - shared fixtures
