"""The text encoder's transformer run by ONNX Runtime on the CPU (``embed.precision=onnx``).

Same weights, same float32 arithmetic, a faster CPU runtime: ~1.8x fewer CPU seconds than PyTorch
eager for all-MiniLM-L6-v2 on this project's 2-core machine, vectors within cosine 1e-6 of PyTorch's
(docs/data.md, "Embedding"). The graph is exported in memory when an encoder starts (about one
second; nothing is written or downloaded). Optional: ``pip install 'gsdistill[onnx]'``.

The export uses the model's eager attention: the SDPA path computes its padding mask from the
shapes seen while tracing, and an export of it gives wrong vectors for batches of other shapes
(cosine 0.76 to PyTorch's on real pages).
"""
from __future__ import annotations

import io
import warnings

import torch


def _import_ort():
    try:
        import onnxruntime
    except ImportError:
        raise RuntimeError("embed.precision=onnx needs ONNX Runtime: pip install 'gsdistill[onnx]' "
                           "(or pip install onnxruntime onnx)") from None
    return onnxruntime


class _LastHidden(torch.nn.Module):
    """``(input_ids, attention_mask) -> last_hidden_state``: the two inputs the encoder feeds."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask,
                          token_type_ids=torch.zeros_like(input_ids)).last_hidden_state


class OnnxTransformer:
    """``run(input_ids, attention_mask) -> float32 last_hidden_state`` through ONNX Runtime, with
    ``threads`` intra-op threads (the process's torch thread count by default)."""

    def __init__(self, path: str, threads: int | None = None):
        ort = _import_ort()
        from transformers import AutoModel

        model = AutoModel.from_pretrained(path, local_files_only=True, attn_implementation="eager").eval()
        example = (torch.ones(2, 8, dtype=torch.long), torch.ones(2, 8, dtype=torch.long))
        buffer = io.BytesIO()
        dynamic = {0: "batch", 1: "tokens"}
        with warnings.catch_warnings():  # the tracer's notes on Python control flow in the HF model
            warnings.simplefilter("ignore")
            torch.onnx.export(_LastHidden(model), example, buffer, input_names=["input_ids", "attention_mask"],
                              output_names=["hidden"], opset_version=17, dynamo=False,
                              dynamic_axes={"input_ids": dynamic, "attention_mask": dynamic, "hidden": dynamic})
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(threads or torch.get_num_threads())
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(buffer.getvalue(), options, providers=["CPUExecutionProvider"])

    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        feeds = {"input_ids": input_ids.numpy(), "attention_mask": attention_mask.numpy()}
        return torch.from_numpy(self.session.run(None, feeds)[0])
