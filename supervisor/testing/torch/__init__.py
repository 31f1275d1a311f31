"""The PyTorch example as a supervised run: torchrun worlds and the end-to-end scenarios."""
