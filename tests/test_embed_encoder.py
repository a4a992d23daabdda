"""The encoder's fast path (token-sorted batches, equal token ids encoded once, optional bf16) gives
the vectors of encoding every text on its own (real all-MiniLM-L6-v2)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gsdistill.models.text_encoder import TOKENS_PER_TEXT, TextEncoder, mean_pool, native_bf16, token_batches

TEXTS = ["Figure 3: Recall at k for the two heads.", "FIGURE 3: recall at K for the two heads.", "", "7",
         "Text, west west east east east east east east, north x6 south x2, thin x4 broad x4; one of 19 boxes",
         "Journal of Tests, vol. 3", "Journal of Tests, vol. 3",
         " ".join(f"word{i} of a long whole-page text that runs past the encoder's token limit" for i in range(60)),
         "Section 2.1 Related work", "a"]


@pytest.fixture(scope="module")
def encoder():
    torch.set_num_threads(1)
    return TextEncoder()


def alone(enc: TextEncoder, text: str) -> torch.Tensor:
    """The plain path: one text, no padding, no sorting, no sharing."""
    batch = enc.tokenizer([text or " "], truncation=True, max_length=enc.max_length, return_tensors="pt")
    with torch.no_grad():
        hidden = enc.model(**batch).last_hidden_state
    return F.normalize(mean_pool(hidden, batch["attention_mask"]), dim=-1)[0]


def test_batched_sorted_shared_encode_equals_one_text_at_a_time(encoder):
    calls = []
    forward = encoder.model.forward
    encoder.model.forward = lambda **kw: calls.append(kw["input_ids"].shape) or forward(**kw)
    try:
        got = encoder.encode(TEXTS, batch_size=3)
    finally:
        encoder.model.forward = forward
    want = torch.stack([alone(encoder, t) for t in TEXTS])
    assert got.shape == (len(TEXTS), 384)
    assert float((got * want).sum(1).min()) >= 0.9999
    # the uncased tokenizer maps the two captions to the same ids, the running head repeats: 8 rows encoded
    assert sum(shape[0] for shape in calls) == 8
    assert torch.equal(got[0], got[1]) and torch.equal(got[5], got[6])
    widths = [shape[1] for shape in calls]
    assert widths == sorted(widths), "batches go from the shortest token count to the longest"


@pytest.mark.skipif(not native_bf16(torch.device("cpu")), reason="this CPU has no native bf16")
def test_bf16_stays_close_to_fp32(encoder):
    fast = TextEncoder(precision="bf16")
    cos = (fast.encode(TEXTS) * encoder.encode(TEXTS)).sum(1)
    assert float(cos.min()) >= 0.999  # 0.9999 on every text of 411 real pages (docs/data.md); looser on odd texts


def test_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="precision must be one of fp32, bf16"):
        TextEncoder(precision="int8")


def test_batches_of_long_texts_hold_fewer_texts():
    lengths = [256, 10, 256, 12, 11, 256, 256, 130, 9]
    batches = token_batches(lengths, batch_size=4)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert all(len(b) <= 4 and len(b) * max(lengths[i] for i in b) <= 4 * TOKENS_PER_TEXT for b in batches)
    assert [lengths[b[0]] for b in batches] == sorted(lengths[b[0]] for b in batches)
    assert token_batches([], 4) == [] and token_batches([1000], 4) == [[0]]  # one over-long text still goes


def test_onnx_runtime_gives_pytorchs_vectors_for_every_batch_shape(encoder):
    """embed.precision=onnx: the same fp32 model exported in memory and run by ONNX Runtime; batches of
    other shapes than the export's (padding, one text, long texts) give PyTorch's vectors."""
    pytest.importorskip("onnxruntime", reason="the onnx extra (pip install 'gsdistill[onnx]') is not installed")
    onnx = TextEncoder(precision="onnx")
    for batch_size in (1, 3, 64):
        got = onnx.encode(TEXTS, batch_size=batch_size)
        want = torch.stack([alone(encoder, t) for t in TEXTS])
        assert (got * want).sum(-1).min() > 1 - 1e-6


def test_onnx_is_refused_off_the_cpu():
    with pytest.raises(ValueError, match="precision=onnx runs on the CPU"):
        TextEncoder(device="cuda", precision="onnx")
