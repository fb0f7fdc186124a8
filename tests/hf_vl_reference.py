"""transformers 5.23's get_rope_index of Qwen2.5-VL and Qwen3-VL on token sequences built from `parts`, and Pixtral's 2-D RoPE.

Used live when transformers is installed, and frozen into data/hf_vl_positions.json by
`python tests/hf_vl_reference.py` (as hf_reference.py does for the other cross-checks).
Each case is a batch: a list of rows, each a parts list; rows of different lengths are
left-padded, with an attention mask. Parts: an int is a run of text tokens; (1, h, w) an image;
for Qwen2.5-VL (t, h, w, second_per_grid_t) a video; for Qwen3-VL ("video", h, w, timestamp
token counts) a video, which the processor writes frame by frame (timestamp text,
<|vision_start|>, h * w video tokens, <|vision_end|>). Grids are in the language model's
tokens: the model is given (t, h * SPATIAL_MERGE, w * SPATIAL_MERGE).
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import torch

FROZEN = Path(__file__).parent / "data" / "hf_vl_positions.json"
SPATIAL_MERGE = 2
TOKENS_PER_SECOND = 2  # the released Qwen2.5-VL checkpoints' vision_config.tokens_per_second
TEXT_ID, PAD_ID = 9707, 151643  # an ordinary token and Qwen's <|endoftext|> used as padding

QWEN2_5_CASES = {
    "text": [[5]],
    "image": [[3, (1, 2, 3), 2]],
    "video": [[2, (3, 2, 2, 1.0), 2]],  # time ids 0, 2, 4 past rows and columns: transformers parts from the rule
    "slow_video": [[2, (2, 3, 3, 0.5), 2]],  # time ids 0, 1 stay below 3 rows: both agree
    "fractional_interval": [[1, (4, 2, 2, 0.75), 1]],  # 1.5 ids per temporal patch: 0, 1, 3, 4
    "mixed": [[2, (1, 3, 2), 1, (2, 2, 2, 1.0), 3, (1, 1, 4), 1, (2, 3, 2, 0.5), 2]],
    "left_padded": [[3, (1, 2, 3), 2], [6], [1, (2, 3, 3, 0.5), 1, (1, 2, 2), 2]],
    "left_padded_video": [[2, (3, 2, 2, 1.0), 2], [4, (1, 2, 2), 1]],
}
QWEN3_CASES = {
    "text": [[5]],
    "image": [[3, (1, 2, 3), 2]],
    "video": [[2, ("video", 2, 2, [5, 5, 6]), 2]],
    "mixed": [[2, (1, 3, 2), 1, ("video", 1, 3, [5, 5]), 3, (1, 1, 4), 1]],
    "left_padded": [[3, (1, 2, 3), 2], [6], [1, ("video", 3, 3, [5, 6]), 2]],
}


def _is_video(part) -> bool:
    return isinstance(part, tuple) and (len(part) == 4)


def tokens(parts, config) -> tuple[list[int], list[list[int]], list[list[int]], list[float]]:
    """input_ids of one row, with the model's special token ids, and its image grids, video grids and seconds per grid."""
    ids, images, videos, seconds = [], [], [], []
    for part in parts:
        if isinstance(part, int):
            ids += [TEXT_ID] * part
        elif part[0] == "video":  # Qwen3-VL: frame by frame, each after its timestamp text
            _, h, w, stamps = part
            for n in stamps:
                ids += [TEXT_ID] * n + [config.vision_start_token_id] + [config.video_token_id] * (h * w) + [config.vision_end_token_id]
            videos.append([len(stamps), h * SPATIAL_MERGE, w * SPATIAL_MERGE])
        elif _is_video(part):
            t, h, w, s = part
            ids += [config.video_token_id] * (t * h * w)
            videos.append([t, h * SPATIAL_MERGE, w * SPATIAL_MERGE])
            seconds.append(s)
        else:
            t, h, w = part
            ids += [config.image_token_id] * (t * h * w)
            images.append([t, h * SPATIAL_MERGE, w * SPATIAL_MERGE])
    return ids, images, videos, seconds


def rope_index(model: str, rows: list) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(position_ids (3, batch, L), rope_deltas (batch, 1), attention_mask (batch, L)) from get_rope_index of `model`."""
    if model == "qwen2_5_vl":
        from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLConfig as Config
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel as Model

        vision = {"spatial_merge_size": SPATIAL_MERGE, "tokens_per_second": TOKENS_PER_SECOND}
    else:
        from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLConfig as Config
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel as Model

        vision = {"spatial_merge_size": SPATIAL_MERGE}
    config = Config(text_config={"hidden_size": 64, "num_attention_heads": 2}, vision_config=vision)
    built = [tokens(parts, config) for parts in rows]
    length = max(len(b[0]) for b in built)
    input_ids = torch.tensor([[PAD_ID] * (length - len(b[0])) + b[0] for b in built])
    attention_mask = torch.tensor([[0] * (length - len(b[0])) + [1] * len(b[0]) for b in built])
    mm_token_type_ids = (input_ids == config.image_token_id).int() + 2 * (input_ids == config.video_token_id).int()  # as the processor marks them
    images, videos, seconds = (sum((b[k] for b in built), []) for k in (1, 2, 3))
    extra = {"second_per_grid_ts": torch.tensor(seconds)} if model == "qwen2_5_vl" and seconds else {}
    host = types.SimpleNamespace(config=config, get_vision_position_ids=lambda *a, **k: Model.get_vision_position_ids(None, *a, **k))
    ids, deltas = Model.get_rope_index(
        host, input_ids, mm_token_type_ids,
        image_grid_thw=torch.tensor(images) if images else None, video_grid_thw=torch.tensor(videos) if videos else None,
        attention_mask=attention_mask, **extra,
    )
    return ids, deltas, attention_mask


PIXTRAL_GRID, PIXTRAL_HEAD_DIM = (3, 5), 32


def pixtral_rotation() -> tuple[torch.Tensor, torch.Tensor]:
    """(coordinates (2, N), hf_reference's fixed input rotated by Pixtral's vision rotary embedding) for a PIXTRAL_GRID image."""
    from hf_reference import rotation_input
    from transformers.models.pixtral.configuration_pixtral import PixtralVisionConfig
    from transformers.models.pixtral.modeling_pixtral import PixtralVisionRotaryEmbedding, apply_rotary_pos_emb

    config = PixtralVisionConfig(hidden_size=2 * PIXTRAL_HEAD_DIM, num_attention_heads=2, head_dim=PIXTRAL_HEAD_DIM)
    rows, cols = torch.meshgrid(torch.arange(PIXTRAL_GRID[0]), torch.arange(PIXTRAL_GRID[1]), indexing="ij")
    positions = torch.stack((rows.flatten(), cols.flatten()), dim=-1)  # (N, 2), as PixtralTransformer's position_ids
    x = rotation_input(PIXTRAL_HEAD_DIM, len(positions))
    cos, sin = PixtralVisionRotaryEmbedding(config)(x, positions)
    return positions.T, apply_rotary_pos_emb(x, x, cos, sin, unsqueeze_dim=0)[0]


def compute() -> dict:
    import transformers

    out = {"transformers": transformers.__version__, "pixtral_rotation": [t.tolist() for t in pixtral_rotation()]}
    for model, cases in (("qwen2_5_vl", QWEN2_5_CASES), ("qwen3_vl", QWEN3_CASES)):
        out[model] = {name: [t.tolist() for t in rope_index(model, rows)] for name, rows in cases.items()}
    return out


def frozen() -> dict:
    return json.loads(FROZEN.read_text())


if __name__ == "__main__":
    FROZEN.parent.mkdir(exist_ok=True)
    FROZEN.write_text(json.dumps(compute(), separators=(",", ":")) + "\n")
    print(f"wrote {FROZEN}")
