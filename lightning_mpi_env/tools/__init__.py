"""The command-line tools and the exports for plain PyTorch, torchrun and JAX."""
