"""The model stage: the dense ViT, the head slices that make subnetwork k, HydraViT, its checkpoints and
its sizes."""
