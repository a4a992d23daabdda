"""DeviceFeed: one batch fetched ahead (the CUDA path's logic, run on the CPU), positions a checkpoint can trust."""
import torch

from gsdistill.pretrain.data_stream import FixedBatches
from gsdistill.pretrain.prefetch import DeviceFeed


def _stream():
    return FixedBatches([{"ids": [str(i)], "x": torch.full((1,), float(i))} for i in range(5)])


def test_ahead_hands_out_the_same_batches_and_the_position_of_the_last_one():
    plain, ahead = DeviceFeed(_stream(), torch.device("cpu")), DeviceFeed(_stream(), torch.device("cpu"), ahead=True)
    assert not plain.ahead and ahead.ahead
    for step in range(1, 8):
        a, b = next(plain), next(ahead)
        assert a["ids"] == b["ids"]
        assert plain.position == ahead.position == {"epoch": 0, "batch": step}
        assert ahead.batches.position == {"epoch": 0, "batch": step + 1}  # the stream itself is one further


def test_restore_drops_the_batch_fetched_ahead():
    feed = DeviceFeed(_stream(), torch.device("cpu"), ahead=True)
    for _ in range(3):
        next(feed)
    feed.restore({"epoch": 0, "batch": 1})
    assert feed.position == {"epoch": 0, "batch": 1}
    assert next(feed)["ids"] == ["1"] and feed.position == {"epoch": 0, "batch": 2}
