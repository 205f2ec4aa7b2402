"""Stage 1: make `model.to("cuda")` fail as the user's did -- the caching-allocator model, the real `_apply` walk,
the simulated and the CUDA paths, and the outside-PyTorch memory derived from the seed."""

from oomlab.core.exports import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "allocator": ("CachingAllocator", "SimulatedOutOfMemory"),
    "cuda": ("reproduce_on_cuda",),
    "honesty": ("HonestReproduction", "honest_reproduction"),
    "outside": ("case_outside", "seed_outside_bytes"),
    "replay": ("reproduce", "reproduce_simulated"),
    "result": ("FailingTensor", "FigureComparison", "ReproduceResult", "compare_with_seed"),
    "summary": ("is_seed_result",),
})
