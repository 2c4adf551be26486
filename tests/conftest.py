"""Shared pytest configuration: the markers the suite uses."""


def pytest_configure(config):
    config.addinivalue_line("markers", "notebook: runs a tutorial notebook through ci/run_notebooks.py")
    config.addinivalue_line("markers", "slow: takes more than ~20 s on a 2-core CPU (deselect with -m 'not slow')")
