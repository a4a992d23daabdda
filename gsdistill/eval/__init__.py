"""Page retrieval evaluation (``gsdistill eval``): crop-subsampled text -> page retrieval, retrieval
through each head, IR metrics, exact inner-product search."""
