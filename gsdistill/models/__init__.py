"""Models: timm ViT backbone, frozen text encoder, GSDistill heads and meta-architecture."""
