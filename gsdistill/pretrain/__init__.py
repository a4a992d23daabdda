"""Pretraining (``gsdistill pretrain``, ``gsdistill export``): the loop, its two engines (plain PyTorch / DeepSpeed ZeRO-3), schedules, checkpoints."""
