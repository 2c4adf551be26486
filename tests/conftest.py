import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_configure(config):
    config.addinivalue_line("markers", "notebook: runs a notebook through the papermill runner (slow)")
    config.addinivalue_line("markers", "slow: takes more than ~20 s on a 2-core CPU")


@pytest.fixture(scope="session")
def tokenizer():
    import helpers
    return helpers.load_tokenizer()


@pytest.fixture(scope="session")
def hf_model():
    import helpers
    return helpers.load_hf_model()
