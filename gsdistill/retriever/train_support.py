"""Helpers of the retriever training loop: process group, gradient sync, frozen-passage cache, plot."""
from __future__ import annotations

from pathlib import Path

import torch

from gsdistill.losses.gather import is_distributed
from gsdistill.retriever.model import DualEncoder


def init_distributed() -> bool:
    """Join the process group a launcher (torchrun) describes in the environment; False when alone."""
    import os

    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return dist.is_initialized()
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return True


def sync_gradients(params: list[torch.nn.Parameter]) -> None:
    """Average gradients over ranks (what DDP does), so that with ``gather_with_grad`` candidates the
    update equals one process holding the whole batch. No-op on one process."""
    if not is_distributed():
        return
    import torch.distributed as dist

    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


class PassageCache:
    """Embeddings of a frozen passage tower, computed once per document on first use."""

    def __init__(self, model: DualEncoder, texts: list[str], batch_size: int, embeddings: torch.Tensor | None = None):
        self.model, self.texts, self.batch_size = model, texts, batch_size
        dim = int(model.query_encoder.config.hidden_size)
        self.emb = embeddings.float().cpu() if embeddings is not None else torch.zeros(len(texts), dim)
        self.filled = torch.full((len(texts),), embeddings is not None)
        if embeddings is not None and embeddings.shape[0] != len(texts):
            raise ValueError(f"passage embeddings have {embeddings.shape[0]} rows, corpus has {len(texts)} docs")

    def get(self, idx: torch.Tensor) -> torch.Tensor:
        missing = idx[~self.filled[idx]].unique()
        if len(missing):
            self.emb[missing] = self.model.encode([self.texts[i] for i in missing.tolist()], "passage", self.batch_size)
            self.filled[missing] = True
        return self.emb[idx].to(self.model.device)


def plot_losses(history: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([r["step"] for r in history], [r["loss"] for r in history])
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title("retriever training")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
