"""oomlab.explanation.backend: the backends that write OOM messages and the words each verdict uses."""

import pytest

from oomlab.explanation.backend import Backend, backend_terms


@pytest.mark.parametrize(
    ("backend", "malloc", "context", "caching"),
    [
        (Backend.CUDA, "cudaMalloc", "a CUDA context", True),
        (Backend.HIP, "hipMalloc", "a HIP runtime context", True),
        (Backend.XPU, "SYCL's aligned_alloc_device", "a Level Zero context", True),
        (Backend.MPS, "a Metal heap", "the Metal device's own allocations", False),
        (Backend.CPU, "posix_memalign", "-", False),
        (None, "cudaMalloc", "a CUDA context", True),  # the newest builds' plain "Out of memory" reads as CUDA
    ],
)
def test_backend_terms(backend: Backend | None, malloc: str, context: str, caching: bool) -> None:
    """Each backend's allocator call and context; only CUDA, HIP and XPU round requests into segments."""
    terms = backend_terms(backend)
    assert (terms.malloc, terms.context) == (malloc, context)
    assert (backend or Backend.CUDA).caching_allocator is caching


@pytest.mark.parametrize(("backend", "article"), [(Backend.MPS, "an"), (Backend.XPU, "an"), (Backend.HIP, "a"),
                                                  (Backend.CPU, "a"), (Backend.CUDA, "a")])
def test_article(backend: Backend, article: str) -> None:
    """'an MPS message', 'a HIP message': the article as the name is read aloud."""
    assert backend.article == article
