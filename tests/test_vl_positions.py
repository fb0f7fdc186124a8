"""Position ids of images and video beyond Qwen2-VL: Qwen2.5-VL's absolute time, Qwen3-VL's timestamped frames,
left-padded batches with their rope_deltas (all against transformers 5.23's get_rope_index, live and frozen), and the
1-D layout with a break token after each row."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hf_vl_reference as ref
from hf_reference import SOURCES
from posenc.qk import left_pad_position_ids, qwen2_5_vl_positions, qwen3_vl_positions, qwen3_vl_video_parts, row_break_positions
from posenc.qk.axial import mrope_positions


@pytest.fixture(scope="module", params=SOURCES)
def hf(request):
    """get_rope_index's outputs, frozen and (where transformers is installed) live."""
    return ref.frozen() if request.param == "frozen" else ref.compute()


def theirs(hf, model, name):
    ids, deltas, mask = (torch.tensor(v) for v in hf[model][name])
    return ids, deltas, mask.bool()


def qwen3_parts(parts):
    """A Qwen3-VL case's parts as qwen3_vl_positions takes them: each video laid out frame by frame."""
    out = []
    for part in parts:
        out += qwen3_vl_video_parts(*part[1:]) if isinstance(part, tuple) and part[0] == "video" else [part]
    return out


def overshoot(parts, tokens_per_second=ref.TOKENS_PER_SECOND):
    """Per token, how far transformers 5.23's Qwen2.5-VL ids lie below the Qwen team's rule.

    After a grid, the rule starts the next part at the grid's largest id + 1; transformers at its
    start + max(h, w). They differ by the time ids' overshoot past the rows and columns,
    max(0, last time offset + 1 - max(h, w)), and the differences add up along the row.
    """
    shift, total = [], 0
    for part in parts:
        if isinstance(part, int):
            shift += [total] * part
            continue
        t, h, w = part[:3]
        shift += [total] * (t * h * w)
        last_time = int((t - 1) * part[3] * tokens_per_second) if len(part) == 4 else 0
        total += max(0, last_time + 1 - max(h, w))
    return torch.tensor(shift)


# --- Qwen2.5-VL -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ref.QWEN2_5_CASES))
def test_qwen2_5_vl_positions_are_get_rope_index_but_after_a_video(hf, name):
    """Equal wherever no video's time ids run past its rows and columns; after one that does, transformers' ids
    are the rule's minus the overshoot (the text after the video is placed below the video's last time ids)."""
    ids, deltas, mask = theirs(hf, "qwen2_5_vl", name)
    rows = ref.QWEN2_5_CASES[name]
    for i, parts in enumerate(rows):
        ours, real = qwen2_5_vl_positions(parts, tokens_per_second=ref.TOKENS_PER_SECOND), ids[:, i, mask[i]]
        assert torch.equal(real, ours - overshoot(parts))
        assert int(deltas[i]) == int(real.max()) + 1 - real.shape[1]  # transformers' delta, from its own ids
        assert (ids[:, i, ~mask[i]] == 0).all()  # padding at zero
    if all(overshoot(parts).max() == 0 for parts in rows):  # no divergence: the batch and its deltas are posenc's
        ours, our_deltas = left_pad_position_ids([qwen2_5_vl_positions(p, ref.TOKENS_PER_SECOND) for p in rows])
        assert torch.equal(ours, ids) and torch.equal(our_deltas, deltas)


def test_qwen2_5_vl_text_after_a_video_sits_below_its_last_time_ids_in_transformers(hf):
    """The headline case: 3 temporal patches of 1 s at 2 ids a second, a 2 x 2 grid, after 2 text tokens."""
    ids, deltas, _ = theirs(hf, "qwen2_5_vl", "video")
    ours = qwen2_5_vl_positions(ref.QWEN2_5_CASES["video"][0], tokens_per_second=2)
    assert ours[0, 2:14].unique().tolist() == [2, 4, 6]  # time ids: 2 + 0, 2 + 2, 2 + 4 (0, 1, 2 s)
    assert torch.equal(ours[:, :14], ids[:, 0, :14])  # the same up to the end of the video
    assert ours[:, 14:].tolist() == [[7, 8]] * 3  # the rule: after the largest id, 6
    assert ids[:, 0, 14:].tolist() == [[4, 5]] * 3  # transformers: 2 + max(h, w), below the last frame's time id 6
    assert int(deltas) == -9  # and decoding resumes at 16 - 9 = 7: the prefill's last text is at 5, the next token at 7
    fractional = qwen2_5_vl_positions([(4, 1, 1, 0.75)])  # 1.5 ids per patch, floored as transformers' .long()
    assert fractional[0].tolist() == [0, 1, 3, 4]


def test_a_video_of_one_temporal_patch_has_the_ids_of_an_image():
    assert torch.equal(qwen2_5_vl_positions([2, (1, 3, 2, 1.0), 1]), qwen2_5_vl_positions([2, (1, 3, 2), 1]))
    assert torch.equal(qwen2_5_vl_positions([2, (1, 3, 2), 1]), mrope_positions([2, (1, 3, 2), 1]))  # images as Qwen2-VL


@settings(max_examples=25, deadline=None)
@given(t=st.integers(1, 6), h=st.integers(1, 4), w=st.integers(1, 4), seconds=st.sampled_from([0.25, 0.5, 1.0, 2.0]), start=st.integers(0, 50))
def test_qwen2_5_vl_time_ids_follow_absolute_time(t, h, w, seconds, start):
    """Patch k's time id is start + floor(k * seconds * 2), whatever the grid; the text after starts past every id."""
    ids = qwen2_5_vl_positions([(t, h, w, seconds), 1], tokens_per_second=2, start=start)
    times = ids[0, :-1].reshape(t, h * w)
    assert (times == times[:, :1]).all()
    assert times[:, 0].tolist() == [start + int(k * seconds * 2) for k in range(t)]
    assert int(ids[0, -1]) == int(ids[:, :-1].max()) + 1


# --- Qwen3-VL -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ref.QWEN3_CASES))
def test_qwen3_vl_positions_are_get_rope_index(hf, name):
    """One-frame grids with the timestamps as text between them: the rule and transformers agree, deltas included."""
    ids, deltas, _ = theirs(hf, "qwen3_vl", name)
    ours, our_deltas = left_pad_position_ids([qwen3_vl_positions(qwen3_parts(parts)) for parts in ref.QWEN3_CASES[name]])
    assert torch.equal(ours, ids) and torch.equal(our_deltas, deltas)


def test_qwen3_vl_video_frames_each_start_their_own_time_id():
    parts = qwen3_vl_video_parts(2, 2, [3, 4])
    assert parts == [4, (1, 2, 2), 1, 5, (1, 2, 2), 1]
    ids = qwen3_vl_positions(parts)
    assert ids[0, 4:8].tolist() == [4] * 4 and ids[0, 14:18].tolist() == [12] * 4  # 4 + 2 (the frame) + 1 + 5 (end, timestamp, start): time moves with the text


# --- batches and the 1-D layout with row breaks ---------------------------------------------------------------------


def test_left_padding_puts_each_row_at_the_right_and_its_delta_continues_it():
    rows = [mrope_positions([2, (1, 2, 3), 1]), mrope_positions([3])]
    ids, deltas = left_pad_position_ids(rows)
    assert ids.shape == (3, 2, 9) and torch.equal(ids[:, 0], rows[0]) and torch.equal(ids[:, 1, 6:], rows[1])
    assert (ids[:, 1, :6] == 0).all() and deltas.tolist() == [[-3], [0]]
    assert 9 + int(deltas[0]) == int(rows[0].max()) + 1  # the next token follows the largest id


@settings(max_examples=25, deadline=None)
@given(height=st.integers(1, 8), width=st.integers(1, 8), start=st.integers(0, 100))
def test_row_breaks_follow_each_row(height, width, start):
    positions, is_break = row_break_positions(height, width, start)
    assert torch.equal(positions, torch.arange(start, start + height * (width + 1)))
    assert int(is_break.sum()) == height and bool(is_break[-1])
    patches = positions[~is_break].reshape(height, width)
    assert (patches[:, 1:] - patches[:, :-1] == 1).all()  # a column to the right: one position on
    assert (patches[1:] - patches[:-1] == width + 1).all()  # a row down: width + 1 positions on, on every row
    assert torch.equal(patches[:, -1] + 1, positions[is_break])  # each break right after its row


@pytest.mark.parametrize("call, words", [
    (lambda: qwen2_5_vl_positions([2, (3, 2, 2)]), "an image has t = 1; give a video as (t, h, w, second_per_grid_t)"),
    (lambda: qwen2_5_vl_positions([(2, 2, 2, 0)]), "parts[0][3] (second_per_grid_t) must be a finite number > 0"),
    (lambda: qwen2_5_vl_positions([(2, 2, 2, 1.0)], tokens_per_second=-1), "tokens_per_second must be a finite number > 0"),
    (lambda: qwen2_5_vl_positions(["text"]), "parts[0] must be an int (text tokens), a (1, h, w) image or a (t, h, w, second_per_grid_t) video"),
    (lambda: qwen2_5_vl_positions([]), "at least one"),
    (lambda: qwen3_vl_positions([1, (2, 2, 2)]), "Qwen3-VL gives every grid one frame (t = 1)"),
    (lambda: qwen3_vl_video_parts(2, 2, 3), "timestamp_tokens must be a list of token counts"),
    (lambda: qwen3_vl_video_parts(2, 2, [3, 0]), "timestamp_tokens[1] must be a positive integer"),
    (lambda: left_pad_position_ids(torch.zeros(3, 4)), "rows must be a non-empty list"),
    (lambda: left_pad_position_ids([torch.zeros(2, 4, dtype=torch.long)]), "rows[0] must be a (3, L) integer tensor"),
    (lambda: row_break_positions(0, 4), "height must be a positive integer"),
    (lambda: row_break_positions(2, 4, start=-1), "start must be a non-negative integer"),
])
def test_bad_vl_position_input_is_named(call, words):
    with pytest.raises((ValueError, TypeError)) as info:
        call()
    assert words in str(info.value)
