"""The shared loss core: tensor-in, scalar-out losses, selectable by name (``get_loss``).

Conventions: ``scores: float[B, N]`` are logits (see ``LogitScale``); ``positives``/``valid``:
``bool[B, N]``; graded ``labels: float[B, N]`` (grades >= 0). Multi-positive, graded and noisy-label
losses record ``last_stats`` (anchors used / without positive / without negative) after each
forward. ``LOSSES`` maps snake_case names to classes, ``LOSS_KIND`` names to
multi_positive / graded / noisy / distill / reg. Inputs are value-checked (NaN/inf, grades) unless
``validation.set_checks(False)``: then the pretraining losses run without a host sync
(``syncs.HostSyncCounter`` counts them).
"""
from gsdistill.losses.bce import MultiPositiveBCE, multi_positive_bce
from gsdistill.losses.centering import TeacherCentering, sinkhorn_knopp
from gsdistill.losses.dino import DINOLoss
from gsdistill.losses.gather import gather_with_grad, rank_offset
from gsdistill.losses.ibot import IBOTPatchLoss
from gsdistill.losses.koleo import KoLeoHybridLoss, KoLeoLoss
from gsdistill.losses.listwise import KLListLoss, ListNetLoss, kl_list_loss, listnet_loss
from gsdistill.losses.logit_scale import LogitScale
from gsdistill.losses.multi_positive import (
    MPCL, InfoNCE, JointLH, LSEPair, Rand1LH, SingleLH, SumMargLH, joint_lh, lse_pair, sum_marg_lh,
)
from gsdistill.losses.noisy import (
    SupersetPairwiseLoss, ambiguity_sets, possibility_distribution, superset_pairwise_loss,
)
from gsdistill.losses.patch_spread import PatchSpreadLoss
from gsdistill.losses.pairwise_graded import (
    ApproxNDCGLoss, RankNetLoss, approx_ndcg_loss, ranknet_loss,
)
from gsdistill.losses.registry import LOSS_KIND, LOSSES, get_loss, loss_key, loss_kind
from gsdistill.losses.robust import (
    AGCELoss, AULLoss, EvidenceLabelSmoothingLoss, GCELoss, LabelRelaxationLoss, LabelSmoothingLoss,
    NCEAGCELoss, NCEAULLoss, NCELoss,
)
from gsdistill.losses.wasserstein import WassersteinLoss, gaussian_w2_from_samples, wasserstein_loss

__all__ = [
    "AGCELoss", "AULLoss", "ApproxNDCGLoss", "DINOLoss", "EvidenceLabelSmoothingLoss", "GCELoss",
    "IBOTPatchLoss", "InfoNCE", "JointLH", "KLListLoss", "KoLeoHybridLoss", "KoLeoLoss", "LOSSES",
    "LOSS_KIND", "LSEPair", "LabelRelaxationLoss", "LabelSmoothingLoss", "ListNetLoss",
    "LogitScale", "MPCL", "PatchSpreadLoss", "MultiPositiveBCE", "NCEAGCELoss", "NCEAULLoss", "NCELoss", "Rand1LH",
    "RankNetLoss", "SingleLH", "SumMargLH", "SupersetPairwiseLoss", "TeacherCentering",
    "WassersteinLoss", "ambiguity_sets", "approx_ndcg_loss", "gather_with_grad",
    "gaussian_w2_from_samples", "get_loss", "joint_lh", "kl_list_loss", "listnet_loss", "loss_key",
    "loss_kind", "lse_pair", "multi_positive_bce", "possibility_distribution", "rank_offset",
    "ranknet_loss", "sinkhorn_knopp", "sum_marg_lh", "superset_pairwise_loss", "wasserstein_loss",
]
