"""The cheap CPU dropout: what torch's dropout promises (the rate, the expectation, the gradient, a seed repeats it),
drawn a byte an element."""

import pytest
import torch

from chargpt.model.dropout import Dropout, dropout, keep_mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_drops_the_rate_asked_and_keeps_the_expectation(dtype):
    torch.manual_seed(0)
    x = torch.ones(400, 1000, dtype=dtype)
    y = dropout(x, 0.2)
    assert y.dtype == dtype and y.shape == x.shape
    dropped = (y == 0).float().mean().item()
    assert abs(dropped - 51 / 256) < 0.003  # 0.2 to within 1/512; 400,000 draws: sd 0.0006
    assert abs(y.float().mean().item() - 1.0) < 0.005  # kept values scaled by 256 / 205
    assert torch.allclose(y[y != 0].float(), torch.full_like(y[y != 0].float(), 256 / 205), rtol=1e-2)


def test_every_byte_position_of_a_random_word_is_used_evenly():
    torch.manual_seed(0)
    keep, rate = keep_mask((80_000, 8), 0.5)
    assert rate == 0.5
    per_position = 1 - keep.mean(dim=0)  # each of a 64-bit word's eight bytes drops half
    assert torch.all((per_position - 0.5).abs() < 0.01), per_position


def test_the_gradient_is_the_mask_times_the_scale():
    torch.manual_seed(3)
    x = torch.randn(50, 70, requires_grad=True)
    y = dropout(x, 0.3)
    y.sum().backward()
    kept = y.detach() != 0
    scale = 1 / (1 - round(0.3 * 256) / 256)
    assert torch.allclose(x.grad, kept.float() * scale)
    assert torch.allclose(y.detach()[kept], x.detach()[kept] * scale)


def test_a_seed_repeats_the_mask_and_evaluation_keeps_everything():
    x = torch.randn(33, 17)  # a size that is not a multiple of eight
    torch.manual_seed(7)
    a = dropout(x, 0.1)
    torch.manual_seed(7)
    b = dropout(x, 0.1)
    assert torch.equal(a, b)
    layer = Dropout(0.5).eval()
    assert torch.equal(layer(x), x)
    assert torch.equal(dropout(x, 0.0), x)


def test_the_module_is_a_drop_in_for_torch_s():
    layer = Dropout(0.25)
    assert isinstance(layer, torch.nn.Dropout) and layer.p == 0.25
    torch.manual_seed(0)
    assert (layer(torch.ones(1000)) == 0).any()
