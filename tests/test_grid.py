"""Absolute codes for grids of patches: the 2-D sinusoidal code and resizing a position table (ViT)."""

import pytest
import torch

import posenc
from posenc.input.grid import resize_grid_table, sinusoidal_2d
from posenc.qk.axial import grid_positions


def test_sinusoidal_2d_is_a_row_code_then_a_column_code():
    coords = grid_positions(5, 7)
    code = sinusoidal_2d(coords, 32)
    assert code.shape == (35, 32)
    assert torch.equal(code[:, :16], posenc.sinusoidal_encoding(coords[0], 16))
    assert torch.equal(code[:, 16:], posenc.sinusoidal_encoding(coords[1], 16))
    same_row = coords[0][:, None] == coords[0][None, :]
    assert torch.equal((code[:, None, :16] == code[None, :, :16]).all(-1), same_row)
    gaps = torch.cdist(code, code) + torch.eye(35) * 1e9
    assert float(gaps.min()) > 0.1  # every patch has its own code


def test_sinusoidal_2d_takes_real_coordinates():
    half = sinusoidal_2d(torch.tensor([[0.5], [1.5]]), 8)
    assert torch.allclose(half[0, :4], posenc.sinusoidal_encoding(torch.tensor([0.5]), 4)[0])


def test_resizing_to_the_same_grid_changes_nothing_and_a_constant_stays_constant():
    table = torch.randn(12, 6)
    torch.testing.assert_close(resize_grid_table(table, (3, 4), (3, 4)), table)
    constant = torch.ones(12, 6) * 2.5
    torch.testing.assert_close(resize_grid_table(constant, (3, 4), (6, 8)), torch.full((48, 6), 2.5))


def test_resizing_stretches_a_smooth_code_over_the_same_extent():
    """A 2-D sinusoidal table of 8 x 8, resized to 16 x 16, approximates the code at half-step coordinates, not the 16 x 16 code."""
    small = sinusoidal_2d(grid_positions(8, 8), 16, base=100.0)
    big = resize_grid_table(small, (8, 8), (16, 16), mode="bilinear")
    rows = (torch.arange(16) + 0.5) / 2 - 0.5  # where align_corners=False samples the old grid
    centres = torch.stack(torch.meshgrid(rows, rows, indexing="ij")).reshape(2, -1).clamp(0, 7)
    stretched, extended = sinusoidal_2d(centres, 16, base=100.0), sinusoidal_2d(grid_positions(16, 16), 16, base=100.0)
    assert (big - stretched).abs().mean() < (big - extended).abs().mean() / 3


@pytest.mark.parametrize("call, words", [
    (lambda: sinusoidal_2d(torch.zeros(3, 4), 8), "coords must have shape (2, N)"),
    (lambda: sinusoidal_2d(torch.zeros(2, 4), 10), "dim must be a multiple of 4"),
    (lambda: resize_grid_table(torch.zeros(10, 4), (3, 4), (6, 8)), "table must have shape (height * width, dim) = (12, dim)"),
    (lambda: resize_grid_table(torch.zeros(12, 4), 12, (6, 8)), "size must be a (height, width) pair"),
    (lambda: resize_grid_table(torch.zeros(12, 4), (3, 4), (6, 8), mode="area"), "mode must be one of 'bicubic', 'bilinear', 'nearest'"),
])
def test_bad_grid_input_is_named(call, words):
    with pytest.raises((ValueError, TypeError)) as info:
        call()
    assert words in str(info.value)
