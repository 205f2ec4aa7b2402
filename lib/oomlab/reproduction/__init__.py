"""Stage 1: make `model.to("cuda")` fail as the user's did -- the caching-allocator model, the real `_apply` walk,
the simulated and the CUDA paths, and the outside-PyTorch memory derived from the seed."""
