"""serving/gpu/hf_encoders.py patches only the Marian encoder layer whose contract it copies.

Its forward mirrors transformers 5's MarianEncoderLayer (attention returns two values, the layer returns a tensor).
transformers is not pinned (extra ``hf``): under 4.x the layer returns a tuple that the encoder indexes
(``layer_outputs[0]``) and takes ``layer_head_mask`` / ``output_attentions``, so the patched forward broke every
MT batch of the engine there. A layer of another contract keeps Hugging Face's own forward. Unit test of one part.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from lingua_fusion.serving.gpu.hf_encoders import device_only  # noqa: E402


def _encoder(layer: torch.nn.Module) -> torch.nn.Module:
    encoder = torch.nn.Module()
    encoder.layers = torch.nn.ModuleList([layer])
    return encoder.eval()


def test_a_marian_layer_of_another_transformers_contract_keeps_its_own_forward() -> None:
    class MarianEncoderLayer(torch.nn.Module):  # transformers 4.x's contract: a tuple out, head mask in
        def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None,
                    layer_head_mask: torch.Tensor | None = None,
                    output_attentions: bool = False) -> tuple[torch.Tensor, ...]:
            return (hidden_states * 2,)

    encoder = device_only(_encoder(MarianEncoderLayer()))
    x = torch.ones(1, 3, 4)
    out = encoder.layers[0](x, None, layer_head_mask=None, output_attentions=False)
    assert isinstance(out, tuple) and torch.equal(out[0], x * 2)


def test_the_installed_marian_layer_is_the_one_patched() -> None:
    from gpu_models import hf_marian

    encoder = device_only(hf_marian(seed=3).get_encoder())
    assert all(layer.forward.__func__.__name__ == "_marian_layer" for layer in encoder.layers)
