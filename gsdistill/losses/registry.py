"""Name -> loss class registry: ``get_loss("lse_pair")`` builds any loss from a config string."""
from __future__ import annotations

import difflib

from torch import nn

from gsdistill.losses.bce import MultiPositiveBCE
from gsdistill.losses.dino import DINOLoss
from gsdistill.losses.ibot import IBOTPatchLoss
from gsdistill.losses.koleo import KoLeoHybridLoss, KoLeoLoss
from gsdistill.losses.patch_spread import PatchSpreadLoss
from gsdistill.losses.listwise import KLListLoss, ListNetLoss
from gsdistill.losses.multi_positive import JointLH, LSEPair, Rand1LH, SingleLH, SumMargLH
from gsdistill.losses.noisy import SupersetPairwiseLoss
from gsdistill.losses.pairwise_graded import ApproxNDCGLoss, RankNetLoss
from gsdistill.losses.robust import (
    AGCELoss, AULLoss, EvidenceLabelSmoothingLoss, GCELoss, LabelRelaxationLoss, LabelSmoothingLoss,
    NCEAGCELoss, NCEAULLoss, NCELoss,
)
from gsdistill.losses.wasserstein import WassersteinLoss

LOSSES: dict[str, type[nn.Module]] = {
    "single_lh": SingleLH, "infonce": SingleLH, "rand1_lh": Rand1LH, "joint_lh": JointLH,
    "sum_marg_lh": SumMargLH, "mpcl": SumMargLH, "lse_pair": LSEPair, "bce": MultiPositiveBCE,
}
LOSS_KIND: dict[str, str] = {name: "multi_positive" for name in LOSSES}
LOSSES.update(wasserstein=WassersteinLoss, kl=KLListLoss, listnet=ListNetLoss, ranknet=RankNetLoss,
              approx_ndcg=ApproxNDCGLoss)
LOSS_KIND.update({name: "graded" for name in ("wasserstein", "kl", "listnet", "ranknet", "approx_ndcg")})
LOSSES.update(superset_pairwise=SupersetPairwiseLoss, gce=GCELoss, nce=NCELoss, agce=AGCELoss,
              aul=AULLoss, label_smoothing=LabelSmoothingLoss, label_relaxation=LabelRelaxationLoss,
              els=EvidenceLabelSmoothingLoss, nce_agce=NCEAGCELoss, nce_aul=NCEAULLoss)
LOSS_KIND.update({name: "noisy" for name in ("superset_pairwise", "gce", "nce", "agce", "aul",
                                             "label_smoothing", "label_relaxation", "els", "nce_agce",
                                             "nce_aul")})
LOSSES.update(dino=DINOLoss, ibot=IBOTPatchLoss, koleo=KoLeoLoss, koleo_hybrid=KoLeoHybridLoss, patch_spread=PatchSpreadLoss)
LOSS_KIND.update(dino="distill", ibot="distill", koleo="reg", koleo_hybrid="reg", patch_spread="reg")


def register(name: str, kind: str, cls: type[nn.Module]) -> None:
    """Add a loss under ``name`` (snake_case) of ``kind`` (multi_positive/graded/noisy/distill/reg)."""
    LOSSES[name] = cls
    LOSS_KIND[name] = kind


def loss_key(name: str) -> str:
    """The one normalisation of a loss name ("Wasserstein", "approx-ndcg" -> registry keys)."""
    return str(name).strip().lower().replace("-", "_")


def loss_kind(name: str, default: str = "multi_positive") -> str:
    """``LOSS_KIND`` of ``name`` after ``loss_key`` (so the kind never disagrees with ``get_loss``)."""
    return LOSS_KIND.get(loss_key(name), default)


def get_loss(name: str, **kwargs) -> nn.Module:
    """Build the loss registered as ``name`` with ``kwargs``; unknown name -> ValueError + hint."""
    key = loss_key(name)
    if key not in LOSSES:
        close = difflib.get_close_matches(key, list(LOSSES), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(f"unknown loss {name!r}{hint} (known: {', '.join(sorted(LOSSES))})")
    try:
        return LOSSES[key](**kwargs)
    except TypeError as err:
        raise ValueError(f"loss {key!r}: bad arguments {sorted(kwargs)}: {err}") from err
