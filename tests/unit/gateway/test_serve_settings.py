"""``hybridrl serve``'s defaults come from the model and the machine: the context length from the model's positions
(the demo's checkpoints have 256: a fixed 2048 made vLLM refuse to start), the dtype as ``hybridrl train`` resolves
``model.dtype: auto``; an explicit context longer than the model is refused naming the option."""

from __future__ import annotations

import pytest

from hybridrl.cli import main
from hybridrl.config.auto_dtype import resolve_dtype
from hybridrl.gateway.standalone import DEFAULT_CONTEXT, ServeSettings, for_model
from hybridrl.utils.tiny_model import TinyModelSpec, save_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("serve") / "model", TinyModelSpec(max_position_embeddings=256))


def test_the_context_and_dtype_default_to_the_models_and_the_machines(model_dir):
    settings = for_model(ServeSettings(port=0), model_dir)
    assert settings.max_model_len == 256 < DEFAULT_CONTEXT
    assert settings.dtype == resolve_dtype("auto", "cpu", log=False)
    explicit = for_model(ServeSettings(port=0, max_model_len=128, dtype="float32"), model_dir)
    assert (explicit.max_model_len, explicit.dtype) == (128, "float32")


def test_a_context_longer_than_the_model_is_refused_by_name(model_dir, capsys):
    with pytest.raises(ValueError, match=r"--max-model-len 2048: the model at .* has 256 positions"):
        for_model(ServeSettings(port=0, max_model_len=2048), model_dir)
    assert main(["serve", str(model_dir), "--port", "0", "--max-model-len", "2048"]) == 2
    assert "--max-model-len 2048" in capsys.readouterr().err
