"""oomlab.explanation.processes: which listed process is this one, and the memory outside PyTorch that follows."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oomlab.core.size_ranges import format_interval
from oomlab.explanation.message import parse_oom_message
from oomlab.explanation.processes import ProcessBasis, account_processes


def _message(listed: list[tuple[int, str]], this: str | None = None, allocated: str = "4.00 GiB") -> str:
    """A torch >= 2.1 message on a 40 GiB GPU with 1 GiB free, reserved = allocated (0 bytes unallocated)."""
    clauses = [f"Process {pid} has {size} memory in use. " for pid, size in listed]
    if this is not None:
        clauses.insert(0, f"Including non-PyTorch memory, this process has {this} memory in use. ")
    return ("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 40.00 GiB of which "
            f"1.00 GiB is free. {''.join(clauses)}Of the allocated memory {allocated} is allocated by PyTorch, and "
            "0 bytes is reserved by PyTorch but unallocated.")


@pytest.mark.parametrize(
    ("listed", "this", "basis", "pid", "others", "candidates"),
    [
        ([], None, None, None, [], []),  # NVML listed nothing (MIG, no permission): nothing to tell
        ([], "5.00 GiB", ProcessBasis.NAMED, None, [], []),
        ([(7, "30.00 GiB")], "5.00 GiB", ProcessBasis.NAMED, None, [7], []),
        ([(7, "5.00 GiB")], None, ProcessBasis.ONLY_ONE_LISTED, 7, [], []),  # a container's host PID
        ([(7, "2.00 GiB")], None, None, None, [7], []),  # less than the 4 GiB reserved: not this process
        ([(7, "2.00 GiB"), (8, "30.00 GiB")], None, ProcessBasis.ONLY_ONE_LARGE_ENOUGH, 8, [7], []),
        ([(7, "2.00 GiB"), (8, "30.00 GiB"), (9, "6.00 GiB")], None, None, None, [7], [8, 9]),  # ambiguous
        ([(7, "4.00 GiB"), (8, "3.99 GiB")], None, ProcessBasis.ONLY_ONE_LARGE_ENOUGH, 7, [8], []),  # boundary
    ],
)
def test_this_process_among_the_listed(listed, this, basis, pid, others, candidates) -> None:
    """'this process' when named; else the only one listed, or the only one holding the reserved memory."""
    acc = account_processes(parse_oom_message(_message(listed, this)))
    assert (acc.basis, acc.pid) == (basis, pid)
    assert ([p.pid for p in acc.others], [p.pid for p in acc.candidates]) == (others, candidates)
    assert acc.ambiguous == (("in_use", "non_pytorch", "other_processes") if candidates else ())


@pytest.mark.parametrize(
    ("listed", "this", "non_pytorch", "other_processes"),
    [
        # 5 − 4 reserved, each ± 0.005 GiB: 1 GiB − 10,737,418 bytes (1013.76 MiB) to 1 GiB + 10,737,418
        ([], "5.00 GiB", "1013.76 MiB – 1.01 GiB", "33.99 GiB – 34.01 GiB"),
        # the one listed is this one; "1.00 GiB" free is above 1 GiB (1 GiB itself prints 1024.00 MiB), so the
        # others hold at most 40.005 − 1 − 38.995 GiB = 10.24 MiB
        ([(7, "39.00 GiB")], None, "34.99 GiB – 35.01 GiB", "0 bytes – 10.24 MiB"),
        ([(7, "2.00 GiB"), (8, "30.00 GiB"), (9, "6.00 GiB")], None, None, None),  # ambiguous: not derived
    ],
)
def test_memory_outside_pytorch_from_this_process(listed, this, non_pytorch, other_processes) -> None:
    """In use − reserved is this process's memory outside PyTorch; total − free − in use the other processes'."""
    acc = account_processes(parse_oom_message(_message(listed, this)))
    assert (format_interval(acc.non_pytorch) if acc.non_pytorch else None) == non_pytorch
    assert (format_interval(acc.other_processes) if acc.other_processes else None) == other_processes


def test_several_listed_without_reserved_figures_are_all_candidates() -> None:
    """Cut before the allocated figure: nothing tells the processes apart, so every one may be this one."""
    text = _message([(7, "2.00 GiB"), (8, "30.00 GiB")]).split("Of the allocated")[0]
    acc = account_processes(parse_oom_message(text))
    assert ([p.pid for p in acc.candidates], acc.basis, acc.in_use) == ([7, 8], None, None)


@given(st.lists(st.tuples(st.integers(1, 10**6), st.integers(1, 38 * 1024)), max_size=6, unique_by=lambda t: t[0]),
       st.booleans())
def test_listed_processes_are_partitioned(listed: list[tuple[int, int]], named: bool) -> None:
    """Every listed process is this one, another, or a candidate -- exactly one of them."""
    text = _message([(pid, f"{mib}.00 MiB") for pid, mib in listed], "5.00 GiB" if named else None)
    acc = account_processes(parse_oom_message(text))
    own = [acc.pid] if acc.pid is not None else []
    assert sorted(own + [p.pid for p in acc.others] + [p.pid for p in acc.candidates]) == sorted(p for p, _ in listed)
    assert acc.listed == len(listed) + named
