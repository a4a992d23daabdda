"""Views: what the model sees of a page tuple during pretraining (multi-crop global/local views with
their spans and box descriptors, iBOT patch masks)."""
