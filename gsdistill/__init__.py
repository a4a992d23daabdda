"""gsdistill: geometry- and semantics-aware document-vision pretraining.

Data flows one way: documents -> page tuples (``gsdistill.tuples``) -> views -> model
(``gsdistill.models``) -> named losses (``gsdistill.losses``) -> optimizer (``gsdistill.pretrain``).
Every stage is a sub-command of ``gsdistill`` (see ``gsdistill/cli.py``).
"""

__version__ = "0.1.0"
