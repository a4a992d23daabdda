"""Pipelines over the stages: ``gsdistill demo`` (the main job, with its controls and report) and
``gsdistill ablate`` (the paper's Tables 3 / A1: pretraining, detection and page retrieval per row)."""
