"""gsdistill: geometry- and semantics-aware document-vision pretraining.

Data flows one way: documents -> page tuples (``gsdistill.tuples``) -> views -> model
(``gsdistill.models``) -> named losses (``gsdistill.losses``) -> optimizer (``gsdistill.pretrain``).
Every stage is a sub-command of ``gsdistill`` (see ``gsdistill/cli.py``).
"""

import os

# albumentations asks PyPI for its newest version when it is imported, in every DataLoader worker;
# on a cluster without network each try can stall. Set before any gsdistill module imports it.
os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

__version__ = "0.1.0"
