"""Values from Hugging Face transformers, the implementations practitioners run.

Used live by test_reference.py when transformers is installed (it is pinned in
requirements.txt), and frozen into data/hf_reference.json by
`python tests/hf_reference.py`, so the cross-checks also run without it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

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
]


def rotation_input() -> torch.Tensor:
    """A fixed (1, 2, 5, 8) input, written out so it does not depend on a random generator."""
    values = [math.sin(1.7 * i + 0.3) * (1 + (i % 5)) for i in range(2 * 5 * 8)]
    return torch.tensor(values, dtype=torch.float32).reshape(1, 2, 5, 8)


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
    return f"{rope_type}-d{head_dim}-b{base:g}-" + "-".join(f"{k}={v}" for k, v in params.items()) + f"-max{max_len}-seq{seq_len}"


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
    }


def frozen() -> dict:
    return json.loads(FROZEN.read_text())


if __name__ == "__main__":
    FROZEN.parent.mkdir(exist_ok=True)
    FROZEN.write_text(json.dumps(compute(), separators=(",", ":")) + "\n")
    print(f"wrote {FROZEN}")
