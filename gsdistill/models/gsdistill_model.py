"""The GSDistill meta-architecture (paper 003 §4): student, EMA teacher, heads, named loss terms.

``GSDistill(cfg)(batch)`` takes a ``collate_pretrain`` batch and returns a dict of named loss terms
(``sem``/``geom``/``joint``, ``distill``, ``ibot``, ``koleo``, ``patch_spread``, ``local_sem``, ``region_geom``; only the
enabled ones) and ``total`` = the weighted sum ``l1 L_sem + l2 L_geom + l3 L_distill + l4 L_ibot + l5 L_KoLeo-H
(+ l6 L_patch_spread + l7 L_local_sem: span-centred local views against the spans they show,
``gsdistill.models.local_text``; + l8 L_region_geom: the tokens under each layout box against its descriptor,
``gsdistill.models.region_text``)``. The training
loop backpropagates ``total``, steps, calls :meth:`update_teacher`, logs and checkpoints.

Views: the student sees the (iBOT-masked) global views and the local views; the teacher sees the
unmasked global views and, when ``objective.distill_local`` (Table A1), the local views too. The
alignment heads (``objective.align_views``) read whole views (``unmasked``: the views iBOT left whole
as they are, plus an unmasked copy of each masked view), the views iBOT left whole, or all.
The step is packed as DINOv2 packs it: ONE student backbone call per crop size (the global call takes
``[global views, unmasked copies of the masked ones]``, so no view is encoded twice the same way), one
teacher call per crop size, and one call of each self-distillation head per network (DINO's pooled
rows and iBOT's masked patches concatenated when they share a head). Crops may come as ``uint8``
pixels and are normalised here, on the device (``gsdistill.models.view_batch``), or as pages and crop rows
made into views here (``views.device``: ``gsdistill.views.render``, inside the compiled step).
Each term's value is per rank; cross-rank terms use ``gather_with_grad`` so that gradients averaged
over ranks (DDP / DeepSpeed) equal those of one process holding the whole batch.
"""
from __future__ import annotations

import copy

import torch
from torch import nn
from torch.profiler import record_function

from gsdistill.losses import DINOLoss, IBOTPatchLoss, KoLeoHybridLoss, PatchSpreadLoss, gather_with_grad, rank_offset
from gsdistill.losses.gather import equal_sizes
from gsdistill.models.alignment import PageTextAlignment
from gsdistill.models.backbone import create_backbone
from gsdistill.models.heads import DINOHead
from gsdistill.models.local_text import local_sem_term
from gsdistill.models.page_embeddings import PageEmbeddings
from gsdistill.models.region_text import region_geom_term
from gsdistill.models.view_batch import masked_view_index, view_pixels, whole_view_rows, with_unmasked_copies
from gsdistill.models.vit_encoder import encode_views, install_view_hooks

HEADS, POSITIVES = {"semantic": ("sem",), "dual": ("sem", "geom"), "joint": ("joint",)}, ("multi", "single")
ALIGN_VIEWS = ("unmasked", "visible", "masked")


def masked_patch_index(masks: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
    """Flat row-major indices of the True entries of ``masks: bool[V, P]`` (the ``patches[masks]``
    order). ``index``: the same, computed on the host by the data pipeline (``batch["mask_index"]``,
    optional), which spares the ``nonzero`` -- a host sync when the masks live on a GPU."""
    if index is not None:
        return index.to(masks.device, non_blocking=True)
    return masks.flatten().nonzero()[:, 0]


def _plain(cfg) -> dict:
    from omegaconf import OmegaConf
    return OmegaConf.to_container(cfg, resolve=True) if not isinstance(cfg, dict) else dict(cfg)


class GSDistill(PageEmbeddings, nn.Module):
    """Student backbone + page/text heads + DINO head, EMA teacher, loss modules (see module doc)."""

    def __init__(self, cfg):
        super().__init__()
        m, o = cfg["model"], cfg["objective"]
        if o["heads"] not in HEADS:
            raise ValueError(f"objective.heads must be one of {sorted(HEADS)}, got {o['heads']!r}")
        if o["positives"] not in POSITIVES:
            raise ValueError(f"objective.positives must be one of {POSITIVES}, got {o['positives']!r}")
        self.backbone_cfg = _plain(m["backbone"])
        self.text_encoder_name = str(m["text_encoder"])
        self.positives = o["positives"]
        self.geom_target = str(o["geom_target"])
        if self.geom_target not in ("boxes", "mean"):
            raise ValueError(f"objective.geom_target must be 'boxes' or 'mean', got {self.geom_target!r}")
        self.backbone = create_backbone(self.backbone_cfg)
        install_view_hooks(self.backbone)  # now, not inside a compiled step (the teacher's copy gets its own)
        if bool(m["freeze_backbone"]):  # the "random backbone, trained heads" control of the demo report
            self.backbone.requires_grad_(False)
        dim = int(self.backbone.embed_dim)
        # each head reads the mean-pooled h_p (0, the paper) or a G x G grid of patch tokens (G > 0)
        grids = {"sem": int(m["sem_pool_grid"]), "geom": int(m["geom_pool_grid"]), "joint": int(m["sem_pool_grid"])}
        self.pool_grid = {name: grids[name] for name in HEADS[o["heads"]]}
        self.patch_size = int(self.backbone.patch_embed.patch_size[0])
        self.align = nn.ModuleDict({
            name: PageTextAlignment(dim * max(self.pool_grid[name], 1) ** 2, int(m["text_dim"]), int(m["proj_dim"]), int(m["head_hidden_dim"]),
                                    str(o["loss_geom"] or o["loss"]) if name == "geom" else o["loss"],
                                    float(m["init_temperature"]), bool(m["learnable_scale"]),
                                    float(m["max_logit_scale"]), int(o["queue_size"]), bool(o["symmetric"]))
            for name in HEADS[o["heads"]]})
        self.weights = {name: float(o["lambda_geom"] if name == "geom" else o["lambda_sem"]) for name in self.align}
        self.use_distill, self.use_ibot, self.use_koleo = bool(o["distill"]), bool(o["ibot"]), bool(o["koleo"])
        self.use_patch_spread = bool(o["patch_spread"])
        self.distill_local = bool(o["distill_local"])
        self.align_views = str(o["align_views"])
        if self.align_views not in ALIGN_VIEWS:
            raise ValueError(f"objective.align_views must be one of {ALIGN_VIEWS}, got {self.align_views!r}")
        # texts per page of each head, known on the host: under several processes every rank pads to it
        spans = int(cfg["views"]["max_spans"]) if "views" in cfg else None
        self.text_width = {n: 1 if self.positives == "single" or (n == "geom" and self.geom_target == "mean")
                           else spans and spans * (1 + (n == "joint")) for n in self.align}
        self.weights.update(distill=float(o["lambda_distill"]), ibot=float(o["lambda_ibot"]),
                            koleo=float(o["lambda_koleo"]), patch_spread=float(o["lambda_patch_spread"]),
                            local_sem=float(o.get("lambda_local_sem", 1.0)),
                            region_geom=float(o.get("lambda_region_geom", 1.0)))
        self.region_geom = bool(o.get("region_geom", False))
        if self.region_geom:  # its own projections: a box's tokens are not a page view
            self.region_align = PageTextAlignment(dim, int(m["text_dim"]), int(m["proj_dim"]), int(m["head_hidden_dim"]),
                                                  str(o["loss_geom"] or o["loss"]), float(m["init_temperature"]),
                                                  bool(m["learnable_scale"]), float(m["max_logit_scale"]))
        # .get: configs saved before these keys existed (read without the defaults) build the model too
        views = cfg["views"] if "views" in cfg else {}
        # the sides of views made in the step from pages and crop rows (views.device; gsdistill.views.render)
        self.view_sizes = (int(views["global_size"]), int(views["local_size"])) if "global_size" in views else None
        self.local_sem, self.max_texts = bool(o.get("local_sem", False)), spans
        if self.local_sem and ("sem" not in self.align or views.get("local_mode") != "spans"):
            raise ValueError("objective.local_sem needs the semantic head (objective.heads semantic or dual) and "
                             "span-centred local views (views.local_mode=spans)")
        # what retrieval over span-centred crops should show this model: (page px, view px), as pretrained
        self.span_crop_view = ((int(views["local_span_px"]), int(views["local_size"]))
                               if views.get("local_mode") == "spans" else None)
        self.teacher_temp, self.centering = float(o["teacher_temp"]), str(o["centering"])
        # short-run schedules (DINOv2 warms the teacher temperature up; we also ramp the
        # self-distillation weights so the alignment heads shape the features before the EMA
        # teacher's targets, which start near uniform over K, pull on them)
        self.teacher_temp_start = float(o["teacher_temp_start"])
        self.teacher_temp_warmup = int(o["teacher_temp_warmup_steps"])
        self.distill_warmup = int(o["distill_warmup_steps"])
        self.register_buffer("steps_seen", torch.zeros((), dtype=torch.long))  # training forwards (resumed with the model)
        self._host_steps: int | None = None  # steps_seen read once on the host, then counted here
        self.register_load_state_dict_post_hook(lambda module, _keys: setattr(module, "_host_steps", None))
        self.sinkhorn_iters = int(o["sinkhorn_iters"])
        if self.use_ibot:
            self.mask_token = nn.Parameter(torch.zeros(1, dim))
            nn.init.normal_(self.mask_token, std=1e-6)
        if self.use_distill or self.use_ibot:
            head_shape = (dim, int(m["dino_out_dim"]), int(m["dino_hidden_dim"]), int(m["dino_bottleneck_dim"]),
                          int(m["dino_layers"]))
            self.dino_head = DINOHead(*head_shape)
            heads = {"dino_head": self.dino_head}
            if self.use_ibot and bool(m["ibot_separate_head"]):  # DINOv2's ibot.separate_head: same shape, own weights
                self.ibot_head = heads["ibot_head"] = DINOHead(*head_shape)
            self.teacher = nn.ModuleDict({"backbone": copy.deepcopy(self.backbone),
                                          **{k: copy.deepcopy(v) for k, v in heads.items()}})
            self.teacher.requires_grad_(False)
            k, st, cm = int(m["dino_out_dim"]), float(o["student_temp"]), float(o["center_momentum"])
            self.dino_loss = DINOLoss(k, student_temp=st, center_momentum=cm)
            self.ibot_loss = IBOTPatchLoss(k, student_temp=st, center_momentum=cm)
        if self.use_koleo:
            self.koleo_loss = KoLeoHybridLoss(alpha=float(o["koleo_alpha"]), beta=float(o["koleo_beta"]))
        if self.use_patch_spread:
            self.patch_spread_loss = PatchSpreadLoss(cov_weight=float(o["patch_spread_cov"]))

    def train(self, mode: bool = True) -> "GSDistill":
        """The EMA teacher always runs in eval mode: no stochastic depth or dropout in its targets."""
        super().train(mode)
        if hasattr(self, "teacher"):
            self.teacher.eval()
        return self

    # ---- training --------------------------------------------------------------------------
    @property
    def ibot_head_name(self) -> str:
        """The head iBOT's patch tokens go through: ``ibot_head`` with ``model.ibot_separate_head``, else ``dino_head``."""
        return "ibot_head" if hasattr(self, "ibot_head") else "dino_head"

    def student_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return [(n, p) for n, p in self.named_parameters() if not n.startswith("teacher.")]

    def teacher_pairs(self) -> list[tuple[nn.Parameter, nn.Parameter]]:
        """(teacher param, student param) pairs for the EMA update."""
        if not hasattr(self, "teacher"):
            return []
        pairs = []
        for part in self.teacher.keys():  # backbone, dino_head (+ ibot_head)
            student = dict(getattr(self, part).named_parameters())
            pairs += [(p, student[n]) for n, p in self.teacher[part].named_parameters()]
        return pairs

    @torch.no_grad()
    def update_teacher(self, momentum: float, skip: torch.Tensor | None = None) -> None:
        """``teacher = m * teacher + (1 - m) * student`` (EMA, paper 003 §4.3). ``skip``: a 0-dim
        device tensor, 1 when the optimizer skipped this step (non-finite gradients): the teacher
        stays as it is too, decided on the device."""
        pairs = self.teacher_pairs()
        if not pairs:
            return
        teachers, students = [t for t, _ in pairs], [s.detach().to(t.dtype) for t, s in pairs]
        if skip is None:
            torch._foreach_lerp_(teachers, students, 1.0 - momentum)
            return
        # a device tensor weight: lerp reads it back to the host (HostSyncCounter), mul does not
        weight = (1.0 - skip.to(teachers[0].device, teachers[0].dtype)) * (1.0 - momentum)
        steps = torch._foreach_sub(students, teachers)
        torch._foreach_mul_(steps, weight)
        torch._foreach_add_(teachers, steps)

    def _texts(self, batch: dict, head: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Candidate text embeddings ``[B, S, D]`` and validity ``[B, S]`` of one head."""
        if self.positives == "single":
            key = {"sem": "sp_sem_emb", "geom": "sp_geom_emb", "joint": "sp_joint_emb"}[head]
            if key not in batch:
                raise KeyError(f"SP mode for head {head!r} needs batch[{key!r}] (the page's texts "
                               "concatenated into one, from the text cache)")
            emb = batch[key].unsqueeze(1)
            return emb, torch.ones(emb.shape[:2], dtype=torch.bool, device=emb.device)
        if head == "geom" and self.geom_target == "mean":  # the page's layout as one bag-of-boxes text
            valid = batch["geom_valid"].unsqueeze(-1).to(batch["geom_emb"].dtype)
            mean = (batch["geom_emb"] * valid).sum(1) / valid.sum(1).clamp_min(1.0)
            return mean.unsqueeze(1), batch["geom_valid"].any(1, keepdim=True)
        if head == "joint":
            return (torch.cat([batch["sem_emb"], batch["geom_emb"]], 1),
                    torch.cat([batch["sem_valid"], batch["geom_valid"]], 1))
        return batch[f"{head}_emb"], batch[f"{head}_valid"]

    def current_teacher_temp(self) -> float:
        """Teacher temperature at this step: linear from ``teacher_temp_start`` to ``teacher_temp``."""
        if self.teacher_temp_warmup <= 0:
            return self.teacher_temp
        if self._host_steps is None:  # one host sync after construction or a load, then none
            self._host_steps = int(self.steps_seen)
        f = min(self._host_steps / self.teacher_temp_warmup, 1.0)
        return self.teacher_temp_start + f * (self.teacher_temp - self.teacher_temp_start)

    def distill_ramp(self) -> float | torch.Tensor:
        """Factor on l3 and l4 at this step: linear 0 -> 1 over ``distill_warmup_steps`` (1 when 0).
        A tensor op on the step buffer, so the schedule costs no host sync on a GPU."""
        if self.distill_warmup <= 0:
            return 1.0
        return ((self.steps_seen + 1).float() / self.distill_warmup).clamp(max=1.0)

    def _teacher_targets(self, logits: torch.Tensor, loss: nn.Module, **rows) -> torch.Tensor:
        # DINO head logits are cosines (normalised features x normalised prototypes): |t| <= 1
        return loss.teacher_probs(logits, self.current_teacher_temp(), centering=self.centering,
                                  n_iters=self.sinkhorn_iters, logit_bound=1.0 + 1e-2, **rows)

    def forward(self, batch: dict) -> dict[str, torch.Tensor]:
        # record_function labels cost nothing without a profiler; tools/bench/bench_pretrain.py times them
        glob, local = view_pixels(batch, self.view_sizes)  # crops, or pages and crop rows made into views here
        n_pages = len(batch["ids"])
        n_global, n_local = glob.shape[0] // n_pages, local.shape[0] // n_pages
        masks = batch["masks"] if self.use_ibot else None
        align_patches = max(self.pool_grid.values()) > 0 or self.use_patch_spread or self.region_geom
        copies = None
        if masks is not None and self.align_views == "unmasked":
            # iBOT's masks hide up to half of a view's patches, and with them the boxes its descriptors
            # describe: the alignment heads read the masked views again, unmasked, in the same call
            # (padded to the run's fixed count: padding copies are encoded, never read)
            copies = masked_view_index(masks, batch.get("masked_views"))
        with record_function("gsdistill.student_global"):
            views, view_masks = with_unmasked_copies(glob, masks, copies)
            h_all, p_all = encode_views(self.backbone, views, view_masks, getattr(self, "mask_token", None),
                                        with_patches=self.use_ibot or align_patches)
        h_glob, patches = h_all[:glob.shape[0]], None if p_all is None else p_all[:glob.shape[0]]
        h_align, p_align, visible = h_glob, patches, None
        if copies is not None and copies.numel():
            rows = whole_view_rows(glob.shape[0], copies, batch.get("masked_views_valid"))
            h_align, p_align = h_all.index_select(0, rows), None if p_all is None else p_all.index_select(0, rows)
        elif masks is not None and self.align_views == "visible":  # same pass; anchors = views left whole
            visible = ~masks.to(glob.device).any(dim=1)  # a tensor mask: no host sync
        terms: dict[str, torch.Tensor] = {}
        anchor_page = torch.arange(n_pages, device=glob.device).repeat(n_global)
        koleo = []
        sizes = equal_sizes(anchor_page.shape[0])  # fixed per-rank batches: rows per rank known on the host
        if self.use_koleo:
            offset = rank_offset(n_pages, equal_sizes(n_pages))
            page_ids = gather_with_grad((anchor_page + offset).float()[:, None], sizes)[:, 0].long()
        for name, head in self.align.items():
            with record_function(f"gsdistill.{name}"):
                text, valid = self._texts(batch, name)
                terms[name], z = head(self.head_inputs(h_align, p_align, glob.shape[-2:], name), anchor_page, text,
                                      valid, anchor_valid=visible, text_width=self.text_width[name])
            if self.use_koleo:  # over the whole (gathered) batch; pairs = same page, other view
                with record_function("gsdistill.koleo"):
                    koleo.append(self.koleo_loss(gather_with_grad(z, sizes), group_ids=page_ids))
        if self.use_koleo:
            terms["koleo"] = torch.stack(koleo).mean()
        if self.use_patch_spread:  # the tokens of whole global views (masked ones carry the mask token)
            with record_function("gsdistill.patch_spread"):
                terms["patch_spread"] = self.patch_spread_loss(p_align.flatten(0, 1))
        if self.region_geom:
            with record_function("gsdistill.region_geom"):
                terms["region_geom"] = region_geom_term(self.region_align, p_align, batch, n_pages, self.max_texts,
                                                        view_valid=visible)
        h_local = p_local = None
        if self.use_distill or self.local_sem:  # one student pass over the local views serves DINO and local_sem
            with record_function("gsdistill.student_local"):
                h_local, p_local = encode_views(self.backbone, local,
                                                with_patches=self.local_sem and self.pool_grid["sem"] > 0)
        if self.local_sem:
            with record_function("gsdistill.local_sem"):
                terms["local_sem"] = local_sem_term(self, h_local, p_local, local.shape[-2:], batch, n_pages,
                                                    n_local, self.max_texts)
        if self.use_distill or self.use_ibot:
            terms.update(self._self_distillation(glob, local, masks, batch.get("mask_index"), batch.get("mask_valid"),
                                                 h_glob, patches, h_local, n_global, n_local))
        ramp = self.distill_ramp()
        terms["total"] = sum(self.weights[k] * (ramp if k in ("distill", "ibot") else 1.0) * v
                             for k, v in terms.items())
        if self.training:
            # a new tensor, not an in-place add: a compiled step's backward recomputes the ramp from this
            # buffer (inductor's partitioner), and read after an in-place add it was one step ahead
            self.steps_seen = self.steps_seen + 1
            if self._host_steps is not None:
                self._host_steps += 1
        return terms

    def _head_logits(self, net: nn.Module, pooled: torch.Tensor | None,
                     masked: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Prototype logits of one network (student or teacher) for its pooled rows (DINO) and masked
        patch rows (iBOT): ONE call of the head they share (DINOv2 concatenates the class tokens and
        the masked patches), one call each when iBOT has its own head."""
        dino, ibot = net.dino_head, getattr(net, self.ibot_head_name)
        if dino is ibot and pooled is not None and masked is not None:
            # split, not two slices: the slices' backward fills and adds two zero [rows, K] tensors
            dino_logits, ibot_logits = dino(torch.cat([pooled, masked])).split([pooled.shape[0], masked.shape[0]])
            return dino_logits, ibot_logits
        return (None if pooled is None else dino(pooled)), (None if masked is None else ibot(masked))

    def _self_distillation(self, glob, local, masks, batch_index, index_valid, h_glob, patches, h_local,
                           n_global, n_local) -> dict:
        out = {}
        teacher_local = self.use_distill and self.distill_local and n_local > 0
        index = masked_patch_index(masks, batch_index) if self.use_ibot else None
        # iBOT rows padded to the run's fixed count (gsdistill.views.fixed_shapes): flagged, so the padding
        # rows get no teacher mass and no weight
        rows = {} if index_valid is None or not self.use_ibot else {"row_valid": index_valid.to(glob.device)}
        with torch.no_grad(), record_function("gsdistill.teacher"):
            t_glob, t_patch = encode_views(self.teacher["backbone"], glob, with_patches=self.use_ibot)
            t_pooled = None
            if self.use_distill:
                t_pooled = torch.cat([t_glob, encode_views(self.teacher["backbone"], local)[0]]) if teacher_local \
                    else t_glob
            t_masked = t_patch.flatten(0, 1).index_select(0, index) if self.use_ibot else None
            t_dino, t_ibot = self._head_logits(self.teacher, t_pooled, t_masked)
        s_pooled = torch.cat([h_glob, h_local]) if self.use_distill else None
        with record_function("gsdistill.heads"):
            s_masked = patches.flatten(0, 1).index_select(0, index) if self.use_ibot else None
            s_dino, s_ibot = self._head_logits(self, s_pooled, s_masked)
        if self.use_distill:
            with record_function("gsdistill.distill"):
                n_glob = glob.shape[0]
                teacher_views = list(self._teacher_targets(t_dino[:n_glob], self.dino_loss).chunk(n_global))
                if teacher_local:
                    teacher_views += list(self._teacher_targets(t_dino[n_glob:], self.dino_loss).chunk(n_local))
                out["distill"] = self.dino_loss(list(s_dino.chunk(n_global + n_local)), teacher_views,
                                                ignore_diagonal=True)
        if self.use_ibot:
            with record_function("gsdistill.ibot"):
                out["ibot"] = self.ibot_loss(s_ibot, self._teacher_targets(t_ibot, self.ibot_loss, **rows), masks,
                                             patch_index=index if rows else None, **rows)
        return out
