"""Session fixtures for the model tests (tiny random HF checkpoints, built once)."""
import pytest

from .helpers import CASES, make_hf_model


@pytest.fixture(scope="session")
def hf_models(tmp_path_factory):
    """name -> (folder with config.json + model.safetensors, torch model)."""
    out = {}
    for name in CASES:
        model = make_hf_model(name)
        folder = tmp_path_factory.mktemp(f"hf_{name}")
        model.save_pretrained(folder, safe_serialization=True)
        out[name] = (str(folder), model)
    return out
