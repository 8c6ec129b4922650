"""Module-wide tiny models and batch (built once: model construction compiles)."""
import pytest
from flax import nnx

from hindsight.testing import make_batch, tiny_model

from tests.methods.helpers import dense_logits


@pytest.fixture(scope="session")
def models():
    """``(policy, reference)``: two tiny random decoders with different weights."""
    return tiny_model(0), tiny_model(1)


@pytest.fixture(scope="session")
def batch(models):
    return make_batch(models[0])


@pytest.fixture(scope="session")
def dense(models, batch):
    """Materialised logits ``[B, T, V]`` at ``target_index`` for every (model, context) pair:
    ``dense[("policy" | "reference", None | "teacher" | "probe")]``, from one jitted program."""
    keys = [(net, ctx) for net in ("policy", "reference") for ctx in (None, "teacher", "probe")]

    @nnx.jit
    def all_logits(policy, reference, batch):
        nets = {"policy": policy, "reference": reference}
        return [dense_logits(nets[net], batch, ctx) for net, ctx in keys]

    return dict(zip(keys, all_logits(*models, batch)))
