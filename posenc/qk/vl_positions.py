"""Where image and video tokens sit in a language model's sequence: position ids
beyond Qwen2-VL's.

`mrope_positions` (in axial) builds Qwen2-VL's (3, L) M-RoPE ids. This module adds

* Qwen2.5-VL's, whose video time ids follow absolute time (qwen2_5_vl_positions);
* Qwen3-VL's, which cuts a video into one-frame grids with its timestamps written as
  text between them (qwen3_vl_video_parts, qwen3_vl_positions);
* a left-padded batch of such rows with the per-row `rope_deltas` that decoding
  continues from (left_pad_position_ids);
* plain 1-D positions for an image laid out row by row with a break token after each
  row, as Fuyu, LLaVA-NeXT and Pixtral feed their language models
  (row_break_positions).

`parts` lists a sequence in order, as mrope_positions takes it: an int is a run of that
many text tokens, a tuple a grid of image or video tokens in the language model's units
(after merging: patches / spatial_merge_size on height and width, temporal patches on
time).
"""

from __future__ import annotations

import torch

from .._checks import non_negative_int, positive_float, positive_int
from .axial import mrope_positions


def _is_text(part) -> bool:
    return isinstance(part, int) and not isinstance(part, bool)


def qwen2_5_vl_positions(
    parts, tokens_per_second: float = 2.0, start: int = 0
) -> torch.Tensor:
    """Qwen2.5-VL's (3, L) position ids: Qwen2-VL's, with each video's time ids in
    absolute time.

    `parts` lists ints (text runs), (1, h, w) images and (t, h, w, second_per_grid_t)
    videos, where second_per_grid_t is the seconds one temporal patch spans (the
    processor's temporal_patch_size / fps). A grid starting at the running id c gives
    temporal patch k, row r and column x the ids
    (c + floor(k * second_per_grid_t * tokens_per_second), c + r, c + x) (Bai et al.,
    2025, "absolute time encoding"); `tokens_per_second` is the vision config's (2 in
    the released checkpoints: one id per half second). The product is formed in
    float64; transformers forms it in second_per_grid_ts's dtype (float32), which can
    floor differently where it lies within float32 rounding of an integer. Text tokens
    get (c, c, c).

    Whatever follows a grid starts at the largest id so far + 1: the Qwen team's rule,
    as mrope_positions keeps it for Qwen2-VL. transformers 5.23's get_rope_index
    advances by max(h, w) instead, so the text after a video whose last time offset
    floor((t - 1) * second_per_grid_t * tokens_per_second) reaches max(h, w) (a clip of
    20 s at 2 ids a second on a grid 32 tokens wide: 38 against 32) is placed below the
    video's last time ids, and every id after it is lowered by the overshoot
    (transformers issue #45381); the rope_deltas it computes from the largest id then
    put the first generated token back above the video, not next to the prompt's last
    id. posenc follows the Qwen team; tests/test_vl_positions.py records the
    difference.
    """
    tokens_per_second = positive_float("tokens_per_second", tokens_per_second)
    current, pieces = non_negative_int("start", start), []
    for i, part in enumerate(parts):
        if _is_text(part):
            pieces.append(
                torch.arange(
                    current, current + positive_int(f"parts[{i}]", part)
                ).expand(3, -1)
            )
        elif isinstance(part, (tuple, list)) and len(part) in (3, 4):
            t, h, w = (
                positive_int(f"parts[{i}][{k}]", n) for k, n in enumerate(part[:3])
            )
            if len(part) == 3 and t != 1:
                raise ValueError(
                    f"parts[{i}] = {tuple(part)} has t = {t}: an image has t = 1; give "
                    "a video as (t, h, w, second_per_grid_t)"
                )
            seconds = (
                positive_float(f"parts[{i}][3] (second_per_grid_t)", part[3])
                if len(part) == 4
                else 0.0
            )
            times = (
                (torch.arange(t, dtype=torch.float64) * (seconds * tokens_per_second))
                .floor()
                .long()
            )
            grid = torch.stack(
                torch.meshgrid(times, torch.arange(h), torch.arange(w), indexing="ij")
            ).reshape(3, -1)
            pieces.append(grid + current)
        else:
            raise TypeError(
                f"parts[{i}] must be an int (text tokens), a (1, h, w) image or a "
                f"(t, h, w, second_per_grid_t) video, got {part!r}"
            )
        current = int(pieces[-1].max()) + 1
    if not pieces:
        raise ValueError("parts must list at least one text run or grid")
    return torch.cat(pieces, dim=1)


def qwen3_vl_video_parts(height: int, width: int, timestamp_tokens) -> list:
    """A Qwen3-VL video as parts: one (1, height, width) grid per temporal patch, each
    after its timestamp.

    Qwen3-VL's processor writes temporal patch k as the text "<{seconds:.1f} seconds>",
    then <|vision_start|>, height * width video tokens and <|vision_end|>
    (transformers 5.23, Qwen3VLProcessor.replace_video_token). `timestamp_tokens[k]` is
    how many text tokens the tokenizer makes of patch k's timestamp (it varies with the
    number of digits), so the parts are [timestamp_tokens[k] + 1, (1, height, width), 1]
    for each k; give them, with the text around the video, to qwen3_vl_positions.
    """
    height, width = positive_int("height", height), positive_int("width", width)
    if (
        isinstance(timestamp_tokens, (str, bytes))
        or not hasattr(timestamp_tokens, "__len__")
        or len(timestamp_tokens) == 0
    ):
        raise TypeError(
            "timestamp_tokens must be a list of token counts, one per temporal patch "
            f"of the video, got {timestamp_tokens!r}"
        )
    parts = []
    for k, n in enumerate(timestamp_tokens):
        parts += [positive_int(f"timestamp_tokens[{k}]", n) + 1, (1, height, width), 1]
    return parts


def qwen3_vl_positions(parts, start: int = 0) -> torch.Tensor:
    """Qwen3-VL's (3, L) position ids: Qwen2-VL's rule on grids of one frame each.

    `parts` lists ints (text runs) and (1, h, w) grids: images, and a video's frames as
    qwen3_vl_video_parts lays them out (timestamps as text between them, so time
    advances through the text ids, not through a time axis). A grid with t > 1 is
    refused. With t = 1 everywhere, the largest id of a grid starting at c is
    c + max(h, w) - 1, so the Qwen team's rule (next part at the largest id + 1) and
    transformers 5.23's (next part at c + max(h, w)) agree.
    """
    for i, part in enumerate(parts):
        if isinstance(part, (tuple, list)) and len(part) == 3 and part[0] != 1:
            raise ValueError(
                f"parts[{i}] = {tuple(part)}: Qwen3-VL gives every grid one frame "
                "(t = 1); lay a video out with qwen3_vl_video_parts"
            )
    return mrope_positions(parts, start)


def left_pad_position_ids(rows) -> tuple[torch.Tensor, torch.Tensor]:
    """(3, batch, L) ids of rows of different lengths, left-padded, and each row's
    rope_delta, (batch, 1).

    `rows` are (3, L_i) ids (from mrope_positions, qwen2_5_vl_positions,
    qwen3_vl_positions). Padding gets id 0 on every axis, as in transformers 5.23's
    get_rope_index (mask it). rope_delta_i = largest id of row i + 1 - L_i: the token
    after row i's L_i real tokens gets the id L_i + rope_delta_i on all three axes, and
    each later one the next, as transformers decodes. It is negative when images or
    videos compress the ids.
    """
    if isinstance(rows, torch.Tensor) or not hasattr(rows, "__len__") or len(rows) == 0:
        raise TypeError(
            "rows must be a non-empty list of (3, L_i) position-id tensors, one per "
            f"sequence, got {type(rows).__name__}"
        )
    for i, row in enumerate(rows):
        if (
            not isinstance(row, torch.Tensor)
            or row.ndim != 2
            or row.shape[0] != 3
            or row.shape[1] == 0
            or row.is_floating_point()
        ):
            shape = (
                tuple(row.shape)
                if isinstance(row, torch.Tensor)
                else type(row).__name__
            )
            raise ValueError(
                f"rows[{i}] must be a (3, L) integer tensor of position ids with "
                f"L >= 1, got {shape}"
            )
    length = max(row.shape[1] for row in rows)
    ids = torch.zeros(3, len(rows), length, dtype=torch.int64)
    for i, row in enumerate(rows):
        ids[:, i, length - row.shape[1] :] = row
    deltas = torch.tensor([[int(row.max()) + 1 - row.shape[1]] for row in rows])
    return ids, deltas


def row_break_positions(
    height: int, width: int, start: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """1-D positions of an image of height x width tokens in raster order with a break
    token after each row.

    Returns (positions, is_break), both of length height * (width + 1): the tokens of
    row r take start + r * (width + 1) + (0, ..., width - 1) and the row's break the
    position after them, so the patch below another is width + 1 positions later, on
    every row. This is how Fuyu (|NEWLINE| after each row), LLaVA-NeXT (image_newline
    after each row of its tiles) and Pixtral ([IMG_BREAK] after each row but the last,
    which ends in [IMG_END]) feed an image to a language model with plain RoPE: the
    image keeps its shape only through the breaks, which is the baseline to M-RoPE's
    (row, col) ids.
    """
    height, width, start = (
        positive_int("height", height),
        positive_int("width", width),
        non_negative_int("start", start),
    )
    positions = torch.arange(start, start + height * (width + 1))
    is_break = (torch.arange(height * (width + 1)) % (width + 1)) == width
    return positions, is_break
