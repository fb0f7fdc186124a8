"""Values from Hugging Face transformers, the implementations practitioners run.

Used live by test_reference.py when transformers is installed (it is pinned in
requirements.txt), and frozen into data/hf_reference.json by
`python tests/hf_reference.py`, so the cross-checks also run without it.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

FROZEN = Path(__file__).parent / "data" / "hf_reference.json"

SINUSOIDAL_CASES = [(64, 16), (50, 7), (32, 128)]  # (n_pos, dim)
ROPE_CASES = [(16, 10000.0), (64, 10000.0), (96, 10000.0), (128, 500000.0), (128, 1000000.0)]  # (head_dim, base)
ROTATION_POSITIONS = [0, 1, 2, 100, 4097]
ALIBI_HEADS = list(range(1, 65)) + [80, 96, 100, 112, 128, 200, 256]
T5_CASES = [(True, 32, 128), (False, 32, 128), (True, 8, 20), (False, 16, 40), (True, 64, 512)]  # (bidirectional, num_buckets, max_distance)
T5_RANGE = (-700, 700)
# (rope_type, head_dim, base, params, max_position_embeddings, seq_len): a grid over Hugging Face's rope_types
ROPE_SCALING_CASES = [
    ("linear", 64, 10000.0, {"factor": 4.0}, 4096, None),
    ("linear", 128, 500000.0, {"factor": 2.5}, 4096, None),
    ("dynamic", 64, 10000.0, {"factor": 2.0}, 2048, None),
    ("dynamic", 64, 10000.0, {"factor": 2.0}, 2048, 6000),
    ("dynamic", 128, 1000000.0, {"factor": 8.0}, 4096, 40000),
    ("yarn", 64, 10000.0, {"factor": 16.0, "original_max_position_embeddings": 4096}, 65536, None),
    ("yarn", 128, 10000.0, {"factor": 4.0, "original_max_position_embeddings": 4096, "beta_fast": 16.0, "beta_slow": 2.0}, 16384, None),
    ("yarn", 128, 500000.0, {"factor": 8.0, "original_max_position_embeddings": 8192, "truncate": False}, 65536, None),
    ("yarn", 64, 10000.0, {"factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 1.0, "mscale_all_dim": 0.707}, 163840, None),
    ("yarn", 64, 10000.0, {"factor": 4.0, "original_max_position_embeddings": 2048, "attention_factor": 1.5}, 8192, None),
    ("yarn", 32, 100.0, {"factor": 8.0, "original_max_position_embeddings": 4096}, 32768, None),
    ("yarn", 64, 10000.0, {"original_max_position_embeddings": 4096}, 32768, None),
    ("llama3", 128, 500000.0, {"factor": 8.0, "original_max_position_embeddings": 8192, "low_freq_factor": 1.0, "high_freq_factor": 4.0}, 131072, None),
    ("llama3", 64, 10000.0, {"factor": 4.0, "original_max_position_embeddings": 2048, "low_freq_factor": 2.0, "high_freq_factor": 8.0}, 8192, None),
    ("llama3", 128, 500000.0, {"factor": 32.0, "original_max_position_embeddings": 8192, "low_freq_factor": 1.0, "high_freq_factor": 4.0}, 131072, None),
    # partial rotary dimensions: every schedule formed for int(head_dim * partial_rotary_factor)
    ("linear", 128, 10000.0, {"factor": 4.0, "partial_rotary_factor": 0.25}, 4096, None),
    ("dynamic", 80, 10000.0, {"factor": 2.0, "partial_rotary_factor": 0.4}, 2048, 6000),
    ("yarn", 128, 10000.0, {"factor": 8.0, "original_max_position_embeddings": 4096, "partial_rotary_factor": 0.5}, 32768, None),
    ("llama3", 128, 500000.0, {"factor": 8.0, "original_max_position_embeddings": 8192, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "partial_rotary_factor": 0.75}, 131072, None),
]


def _ladder(n: int, top: float) -> list[float]:
    """n rescale factors rising geometrically from 1 to `top`, rounded: LongRoPE-like values (the real ones come from a search)."""
    return [round(top ** (i / (n - 1)), 4) for i in range(n)]


# LongRoPE as Phi-3 (head_dim 96, 4k original, 128k target, factor derived from the two lengths) and Phi-4-mini
# (partial_rotary_factor 0.75 of 128) configure it, with LongRoPE-like factors: short at, long past the original length
PHI3 = {"short_factor": _ladder(48, 1.2), "long_factor": _ladder(48, 60.0), "original_max_position_embeddings": 4096}
ROPE_SCALING_CASES += [
    ("longrope", 96, 10000.0, PHI3, 131072, None),
    ("longrope", 96, 10000.0, PHI3, 131072, 4096),
    ("longrope", 96, 10000.0, PHI3, 131072, 4097),
    ("longrope", 128, 10000.0, {**PHI3, "partial_rotary_factor": 0.75}, 131072, 8192),
    ("longrope", 64, 10000.0, {"short_factor": _ladder(32, 1.1), "long_factor": _ladder(32, 16.0), "original_max_position_embeddings": 2048, "factor": 8.0, "attention_factor": 1.25}, 16384, 3000),
]
# (model, head_dim, partial_rotary_factor, layout): models that rotate part of each head
PARTIAL_CASES = [("gpt_neox", 64, 0.25, "half"), ("phi", 80, 0.4, "half"), ("gptj", 64, 0.25, "interleaved")]
PARTIAL_POSITIONS = [0, 1, 7, 300, 4097]
# LongRoPE in a module (Phi-3's rotary embedding), switching on max(position_ids) + 1 > original: head_dim 16, original 32
LONGROPE_MODULE = {"short_factor": _ladder(8, 1.5), "long_factor": _ladder(8, 8.0), "original_max_position_embeddings": 32}
LONGROPE_CALLS = {"short": [0, 3, 17, 31], "long": [0, 3, 17, 40]}
# M-RoPE: Qwen2-VL's text rotary embedding and position ids; parts as posenc.qk.axial.mrope_positions takes them
MROPE_SECTION = [4, 6, 6]  # head_dim 32
MROPE_INTERLEAVED_SECTION = [6, 5, 5]  # Qwen3-VL's interleaved layout, head_dim 32
SPATIAL_MERGE = 2
ROPE_INDEX_CASES = {  # name: parts, with grids in the language model's tokens (patches / SPATIAL_MERGE on h and w)
    "image_in_text": [3, (1, 2, 3), 2],
    "two_images_and_a_video": [2, (1, 3, 2), 1, (2, 2, 2), 3, (1, 1, 4), 1],
    "video_longer_than_wide": [2, (3, 2, 2), 2],  # where transformers 5.23 and Qwen2-VL's original rule part ways
}


def rotation_input(head_dim: int = 8, length: int = 5) -> torch.Tensor:
    """A fixed (1, 2, length, head_dim) input, written out so it does not depend on a random generator."""
    values = [math.sin(1.7 * i + 0.3) * (1 + (i % 5)) for i in range(2 * length * head_dim)]
    return torch.tensor(values, dtype=torch.float32).reshape(1, 2, length, head_dim)


def sinusoidal(n_pos: int, dim: int) -> torch.Tensor:
    from transformers.models.distilbert.modeling_distilbert import _create_sinusoidal_embeddings

    return _create_sinusoidal_embeddings(n_pos, dim, torch.empty(n_pos, dim))


def rope_inv_freq(head_dim: int, base: float) -> torch.Tensor:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = LlamaConfig(hidden_size=head_dim * 2, num_attention_heads=2, head_dim=head_dim, rope_parameters={"rope_type": "default", "rope_theta": base})
    return LlamaRotaryEmbedding.compute_default_rope_parameters(config)[0]


def rope_half(x: torch.Tensor, positions: list[int], base: float = 10000.0) -> torch.Tensor:
    """Hugging Face Llama: rotate-half layout."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    inv_freq = rope_inv_freq(x.shape[-1], base)
    freqs = torch.tensor(positions, dtype=torch.float32)[None, :, None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return apply_rotary_pos_emb(x, x, emb.cos(), emb.sin())[0]


def rope_interleaved(x: torch.Tensor, positions: list[int]) -> torch.Tensor:
    """Hugging Face GPT-J: interleaved layout (base 10000)."""
    from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb, create_sinusoidal_positions

    table = create_sinusoidal_positions(max(positions) + 1, x.shape[-1])[positions]
    sin, cos = torch.split(table, x.shape[-1] // 2, dim=-1)
    # GPT-J's tensors are (batch, seq, heads, head_dim)
    return apply_rotary_pos_emb(x.transpose(1, 2), sin[None], cos[None]).transpose(1, 2)


def alibi_slopes(num_heads: int) -> torch.Tensor:
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes

    return _get_alibi_slopes(num_heads, torch.device("cpu"))


def t5_buckets(bidirectional: bool, num_buckets: int, max_distance: int) -> torch.Tensor:
    from transformers.models.t5.modeling_t5 import T5Attention

    rel = torch.arange(*T5_RANGE)
    return T5Attention._relative_position_bucket(rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)


def rope_scaled(rope_type: str, head_dim: int, base: float, params: dict, max_position_embeddings: int, seq_len: int | None) -> tuple[torch.Tensor, float]:
    """Hugging Face's ROPE_INIT_FUNCTIONS[rope_type] for a Llama config with these RoPE parameters."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope_parameters = {"rope_type": rope_type, "rope_theta": base, **params}
    if rope_type == "yarn" and "factor" not in params:
        rope_parameters["factor"] = None
    config = LlamaConfig(hidden_size=head_dim * 2, num_attention_heads=2, head_dim=head_dim, max_position_embeddings=max_position_embeddings, rope_parameters=rope_parameters)
    inv_freq, factor = ROPE_INIT_FUNCTIONS[rope_type](config, None, seq_len)
    return inv_freq, float(factor)


def scaling_case_id(case) -> str:
    rope_type, head_dim, base, params, max_len, seq_len = case
    shown = {k: f"[{v[0]}..{v[-1]}]" if isinstance(v, list) else v for k, v in params.items()}
    return f"{rope_type}-d{head_dim}-b{base:g}-" + "-".join(f"{k}={v}" for k, v in shown.items()) + f"-max{max_len}-seq{seq_len}"


def partial_rotation(model: str, head_dim: int, factor: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(inv_freq, the fixed input rotated at PARTIAL_POSITIONS) by a model that rotates only part of each head."""
    x, positions = rotation_input(head_dim), torch.tensor(PARTIAL_POSITIONS)
    rotated = int(head_dim * factor)
    if model == "gptj":  # interleaved pairs over the first rotary_dim dimensions (GPT-J's attention)
        from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb, create_sinusoidal_positions

        table = create_sinusoidal_positions(max(PARTIAL_POSITIONS) + 1, rotated)
        sin, cos = torch.split(table[positions], rotated // 2, dim=-1)
        turned = apply_rotary_pos_emb(x[..., :rotated].transpose(1, 2), sin[None], cos[None]).transpose(1, 2)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, rotated, 2, dtype=torch.int64) / rotated)).float()
        return inv_freq, torch.cat((turned, x[..., rotated:]), -1)
    if model == "gpt_neox":
        from transformers import GPTNeoXConfig
        from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding as Rotary, apply_rotary_pos_emb

        config = GPTNeoXConfig(hidden_size=2 * head_dim, num_attention_heads=2, partial_rotary_factor=factor)
        rotary = Rotary(config)
        cos, sin = rotary(x, positions[None])
        return rotary.inv_freq, apply_rotary_pos_emb(x, x, cos, sin)[0]  # GPT-NeoX's function splits off the rotated part
    from transformers import PhiConfig
    from transformers.models.phi.modeling_phi import PhiRotaryEmbedding as Rotary, apply_rotary_pos_emb

    config = PhiConfig(hidden_size=2 * head_dim, num_attention_heads=2, partial_rotary_factor=factor)
    rotary = Rotary(config)
    cos, sin = rotary(x, positions[None])
    turned = apply_rotary_pos_emb(x[..., :rotated], x[..., :rotated], cos, sin)[0]  # Phi's attention splits, rotates, concatenates
    return rotary.inv_freq, torch.cat((turned, x[..., rotated:]), -1)


def longrope_module(positions: list[int]) -> torch.Tensor:
    """The fixed input rotated by Phi-3's rotary embedding, whose longrope frequencies switch with the call's largest position."""
    from transformers import Phi3Config
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding, apply_rotary_pos_emb

    original = LONGROPE_MODULE["original_max_position_embeddings"]  # Phi3Config's own field overrides the rope_parameters' one
    config = Phi3Config(
        hidden_size=32, num_attention_heads=2, max_position_embeddings=128, original_max_position_embeddings=original,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, **LONGROPE_MODULE},
    )
    x = rotation_input(16, len(positions))
    cos, sin = Phi3RotaryEmbedding(config)(x, torch.tensor(positions)[None])
    return apply_rotary_pos_emb(x, x, cos, sin)[0]


def mrope_rotation(ids: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """The fixed (1, 2, L, 32) input rotated by Qwen2-VL's (or, interleaved, Qwen3-VL's) text rotary embedding at (3, L) ids."""
    if interleaved:
        from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig as Config
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding as Rotary, apply_rotary_pos_emb
    else:
        from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig as Config
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding as Rotary, apply_rotary_pos_emb
    section = MROPE_INTERLEAVED_SECTION if interleaved else MROPE_SECTION
    config = Config(hidden_size=64, num_attention_heads=2, num_key_value_heads=2, head_dim=32, rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section})
    x = rotation_input(32, ids.shape[1])
    cos, sin = Rotary(config)(x, ids[:, None, :])
    return apply_rotary_pos_emb(x, x, cos, sin)[0]


def vision_rotation(grid_hw: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(coordinates (2, N), the fixed input rotated by Qwen2-VL's vision encoder) for one image of grid_hw patches, head_dim 32."""
    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLVisionRotaryEmbedding, apply_rotary_pos_emb_vision
    from transformers.vision_utils import get_vision_position_ids

    positions = get_vision_position_ids(torch.tensor([[1, *grid_hw]]), SPATIAL_MERGE)  # (N, 2), in merge-block order
    x = rotation_input(32, len(positions))[0].transpose(0, 1)  # (N, heads, head_dim) as the vision attention holds it
    cos, sin = Qwen2VLVisionRotaryEmbedding(Qwen2VLVisionConfig(embed_dim=64, num_heads=2))(x, positions)
    return positions.T, apply_rotary_pos_emb_vision(x, x, cos, sin)[0].transpose(0, 1)[None]


def rope_index(parts: list) -> torch.Tensor:
    """Qwen2-VL's get_rope_index (transformers' position-id builder) for text runs and grids, as (3, L) ids."""
    import types

    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

    kinds, images, videos = [], [], []
    for part in parts:
        if isinstance(part, int):
            kinds += [0] * part
        else:
            t, h, w = part
            kinds += [1 if t == 1 else 2] * (t * h * w)
            (images if t == 1 else videos).append([t, h * SPATIAL_MERGE, w * SPATIAL_MERGE])
    config = Qwen2VLConfig(text_config={"hidden_size": 64, "num_attention_heads": 2}, vision_config={"spatial_merge_size": SPATIAL_MERGE})
    model = types.SimpleNamespace(config=config, get_vision_position_ids=lambda *a, **k: Qwen2VLModel.get_vision_position_ids(None, *a, **k))
    kinds = torch.tensor([kinds])
    ids, _ = Qwen2VLModel.get_rope_index(
        model, torch.zeros_like(kinds), kinds, image_grid_thw=torch.tensor(images) if images else None, video_grid_thw=torch.tensor(videos) if videos else None
    )
    return ids[:, 0]


VIT_GRID, VIT_NEW_GRID, VIT_DIM = (4, 4), (6, 8), 8  # ViT's position table of a 4 x 4 grid, resized for a 6 x 8 one


def vit_table() -> torch.Tensor:
    """A fixed (1 + 16, 8) ViT position table (class token first), written out like rotation_input."""
    n = 1 + VIT_GRID[0] * VIT_GRID[1]
    return torch.tensor([math.cos(0.7 * i + 0.1) * (1 + (i % 3)) for i in range(n * VIT_DIM)], dtype=torch.float32).reshape(n, VIT_DIM)


def vit_interpolation() -> torch.Tensor:
    """ViT's interpolate_pos_encoding of vit_table() for an image of VIT_NEW_GRID patches: the patch rows, (48, 8)."""
    from transformers import ViTConfig
    from transformers.models.vit.modeling_vit import ViTEmbeddings

    patch = 8
    config = ViTConfig(hidden_size=VIT_DIM, image_size=VIT_GRID[0] * patch, patch_size=patch, num_channels=1)
    embeddings = ViTEmbeddings(config)
    with torch.no_grad():
        embeddings.position_embeddings.copy_(vit_table()[None])
        tokens = torch.zeros(1, 1 + VIT_NEW_GRID[0] * VIT_NEW_GRID[1], VIT_DIM)
        resized = embeddings.interpolate_pos_encoding(tokens, VIT_NEW_GRID[0] * patch, VIT_NEW_GRID[1] * patch)
    return resized[0, 1:]


def mrope_ids() -> torch.Tensor:
    """(3, 11) ids of text, a 2 x 3 image, text: the input of the M-RoPE rotation checks."""
    return torch.tensor([[0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7], [0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7], [0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7]])


def compute() -> dict:
    import transformers

    x = rotation_input()
    return {
        "transformers": transformers.__version__,
        "sinusoidal": {f"{n}x{d}": sinusoidal(n, d).tolist() for n, d in SINUSOIDAL_CASES},
        "rope_inv_freq": {f"{d}@{b:g}": rope_inv_freq(d, b).tolist() for d, b in ROPE_CASES},
        "rope_half": rope_half(x, ROTATION_POSITIONS).tolist(),
        "rope_interleaved": rope_interleaved(x, ROTATION_POSITIONS).tolist(),
        "alibi_slopes": {str(h): alibi_slopes(h).tolist() for h in ALIBI_HEADS},
        "t5_buckets": {f"{b}/{n}/{m}": t5_buckets(b, n, m).tolist() for b, n, m in T5_CASES},
        "rope_scaling": {scaling_case_id(c): [v.tolist() if isinstance(v, torch.Tensor) else v for v in rope_scaled(*c)] for c in ROPE_SCALING_CASES},
        "partial_rotation": {model: [t.tolist() for t in partial_rotation(model, d, f)] for model, d, f, _ in PARTIAL_CASES},
        "longrope_module": {name: longrope_module(p).tolist() for name, p in LONGROPE_CALLS.items()},
        "mrope_rotation": mrope_rotation(mrope_ids()).tolist(),
        "mrope_interleaved_rotation": mrope_rotation(mrope_ids(), interleaved=True).tolist(),
        "vision_rotation": [t.tolist() for t in vision_rotation((4, 6))],
        "rope_index": {name: rope_index(parts).tolist() for name, parts in ROPE_INDEX_CASES.items()},
        "vit_interpolation": vit_interpolation().tolist(),
    }


def frozen() -> dict:
    return json.loads(FROZEN.read_text())



# --- for the test modules: the values from both sources, as a fixture ---------------------------------------

HAVE_HF = importlib.util.find_spec("transformers") is not None
SOURCES = ["frozen", pytest.param("live", marks=pytest.mark.skipif(not HAVE_HF, reason="transformers not installed (pip install -r requirements.txt)"))]


@pytest.fixture(scope="module", params=SOURCES)
def hf(request):
    """The reference values, frozen and (where transformers is installed) live: every test that takes it runs on both."""
    return frozen() if request.param == "frozen" else compute()


def tensor(values):
    return torch.tensor(values, dtype=torch.float32)


if __name__ == "__main__":
    FROZEN.parent.mkdir(exist_ok=True)
    FROZEN.write_text(json.dumps(compute(), separators=(",", ":")) + "\n")
    print(f"wrote {FROZEN}")
