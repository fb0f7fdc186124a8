"""Cross-checks of the RoPE variants against transformers (pinned), live and frozen: partial rotation in GPT-NeoX,
Phi and GPT-J, LongRoPE in Phi-3's rotary module, M-RoPE in Qwen2-VL and Qwen3-VL, axial RoPE in Qwen2-VL's vision
encoder, Qwen2-VL's position ids for images and video in text, and ViT's resizing of its position table. (LongRoPE's and the partial schedules' frequencies
are in ROPE_SCALING_CASES, checked by test_rope_scaling.)"""


import pytest
import torch

import hf_reference as ref
from hf_reference import HAVE_HF, hf, tensor  # noqa: F401 (hf is a fixture)
import posenc
from posenc.input.grid import resize_grid_table
from posenc.qk.axial import mrope_positions



@pytest.mark.parametrize("model, head_dim, factor, layout", ref.PARTIAL_CASES)
def test_partial_rotation_is_the_models_bit_for_bit(hf, model, head_dim, factor, layout):
    expected_freq, expected = (tensor(t) for t in hf["partial_rotation"][model])
    x, positions = ref.rotation_input(head_dim), torch.tensor(ref.PARTIAL_POSITIONS)
    inv_freq, _ = posenc.rope_frequencies(head_dim, partial_rotary_factor=factor, numerics="transformers")
    assert torch.equal(inv_freq, expected_freq)
    rope = posenc.Rope(head_dim, layout=layout, partial_rotary_factor=factor, numerics="transformers")
    ours = rope.transform_qk(x, positions)
    assert torch.equal(ours, expected)
    assert torch.equal(posenc.apply_rope(x, positions, inv_freq, layout, partial_rotary_factor=factor), ours)


@pytest.mark.parametrize("call", sorted(ref.LONGROPE_CALLS))
def test_longrope_switches_where_phi3s_module_switches(hf, call):
    """Phi-3's rotary module takes the long factors when max(position_ids) + 1 > original: so does Rope, per call."""
    positions = ref.LONGROPE_CALLS[call]
    rope = posenc.Rope(16, rope_type="longrope", numerics="transformers", max_position_embeddings=128, **ref.LONGROPE_MODULE)
    ours = rope.transform_qk(ref.rotation_input(16, len(positions)), torch.tensor(positions))
    assert torch.equal(ours, tensor(hf["longrope_module"][call]))


@pytest.mark.parametrize("interleaved", [False, True], ids=["qwen2_vl", "qwen3_vl_interleaved"])
def test_mrope_rotation_is_qwen_vls_bit_for_bit(hf, interleaved):
    ids = ref.mrope_ids()
    section = ref.MROPE_INTERLEAVED_SECTION if interleaved else ref.MROPE_SECTION
    mrope = posenc.MRope(32, mrope_section=section, mrope_interleaved=interleaved, numerics="transformers")
    expected = tensor(hf["mrope_interleaved_rotation" if interleaved else "mrope_rotation"])
    x = ref.rotation_input(32, ids.shape[1])
    assert torch.equal(mrope.transform_qk(x, ids), expected)
    assert torch.equal(mrope.transform_qk(x, ids[:, None, :]), expected)  # transformers' (3, batch, L) position_ids
    assert torch.equal(ids, mrope_positions(ref.ROPE_INDEX_CASES["image_in_text"]))


def test_axial_rope_is_qwen2_vls_vision_encoder(hf):
    coords, expected = hf["vision_rotation"]
    x = ref.rotation_input(32, len(coords[0]))
    ours = posenc.AxialRope(32, numerics="transformers").transform_qk(x, torch.tensor(coords))
    assert torch.equal(ours, tensor(expected))  # Qwen2-VL rotates in float32 as posenc does for float32 inputs


@pytest.mark.parametrize("name", sorted(ref.ROPE_INDEX_CASES))
def test_mrope_positions_are_qwen2_vls_get_rope_index(hf, name):
    ours = mrope_positions(ref.ROPE_INDEX_CASES[name])
    theirs = torch.tensor(hf["rope_index"][name])
    if name != "video_longer_than_wide":
        assert torch.equal(ours, theirs)
        return
    # a video with more frames than rows and columns: Qwen2-VL's rule (and its original code) starts the text after it at
    # the largest id + 1; transformers 5.23 advances by max(h, w) only, so the text reuses the last frame's time id
    assert torch.equal(ours[:, :-2], theirs[:, :-2])
    assert ours[:, -2].tolist() == [5, 5, 5] and theirs[:, -2].tolist() == [4, 4, 4] and int(theirs[0, :-2].max()) == 4


def test_resizing_a_position_table_is_vits_interpolate_pos_encoding(hf):
    table = ref.vit_table()[1:]  # the class token's vector is kept apart by ViT
    ours = resize_grid_table(table, ref.VIT_GRID, ref.VIT_NEW_GRID)
    torch.testing.assert_close(ours, tensor(hf["vit_interpolation"]), atol=0, rtol=0)
