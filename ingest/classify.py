"""Failure classifier: log line -> DESIGN §6 ``error_class``; whole log -> first root cause.

Standard library only (``ingest/`` must import without third-party packages).

Line rules
----------
The patterns live in :mod:`ingest.failure_rules`. :func:`classify_line` tries the rules of
:data:`RULES` in order and returns the class of the first
rule that matches; the order *is* the precedence, most specific first:

0. ANSI colour codes are removed; a line with none of the lower-case keywords of ``rules.KEYWORDS``
   (which every rule below needs) is not an error line -- a cheap pre-filter for the common case;
1. not an error at all (checked before anything else) -> ``None``: ``NCCL INFO`` lines; benign
   ``NCCL WARN`` lines (net-plugin discovery such as "NET/Plugin : Could not find ...", connection
   "retrying"); warning-level lines (c10 ``[W...]``, glog ``W0101 ...``, ``WARNING:``, Python
   ``*Warning``) -- torch prints TCPStore retry/teardown warnings ("Failed to check the "should
   dump" flag on TCPStore ... Connection reset by peer") in healthy runs; Python source lines
   quoted inside a traceback (``    raise ChildFailedError(``);
2. ``scheduler_time_limit``, then ``node_failure`` (Slurm "Node failure on", ``NODE_FAIL``, "... DUE TO
   NODE FAILURE", an srun task's ``Bus error``), then ``scheduler_cancelled`` (Slurm ``*** JOB|STEP ... CANCELLED AT``
   banners, PBS walltime, LSF ``TERM_RUNLIMIT``/``TERM_OWNER``): unambiguous, never wrap another error;
3. ``gpu_hardware_fault`` (Xid, uncorrectable ECC, fallen off the bus, GPU lost -- also the driver's
   ``GPU lost from the bus [NV_ERR_GPU_IS_LOST]``, NVML's ``GpuIsLost``, the GSP's "RC all channels for
   critical error N" whose N is read as an Xid, ROCr's memory fault with an ECC reason) -- except the Xid
   codes that NVIDIA's Xid catalog attributes to the application, not the GPU: 31 (MMU fault: the
   process touched an invalid address; it sees ``CUDA_ERROR_ILLEGAL_ADDRESS``) is
   ``cuda_illegal_memory_access``; 13 (graphics engine exception), 43 (GPU stopped processing) and 45
   (preemptive cleanup after an earlier error or a killed process) are ``unknown``;
4. ``cuda_illegal_memory_access`` (also ROCr's "Memory access fault by GPU node-N ... Reason: Page not
   present or supervisor privilege" on AMD GPUs) -- beats any NCCL wrapper around it ("Cuda failure 'an illegal
   memory access...'", "watchdog thread terminated with exception: CUDA error: an illegal...");
5. ``oom_gpu_nccl_buffer``: NCCL's own allocations (``Failed to CUDA calloc``, ``NCCL WARN Cuda
   failure 'out of memory'``, ``ncclUnhandledCudaError ... out of memory``, ``[Rem Allocator]``);
   checked before the generic OOM and before the NCCL result codes;
6. ``oom_host`` (host memory: the allocator's ``DefaultCPUAllocator: can't allocate memory``, the
   Linux OOM killer ``Out of memory: Killed process``, Slurm's cgroup ``Detected 1 oom-kill
   event(s)`` / ``oom_kill event``, srun's ``task 0: Out Of Memory``, a job over its memory limit,
   ``std::bad_alloc``, Python's ``MemoryError``, Kubernetes' ``OOMKilled`` / runc's "OOM-killed"; status
   ``oom``), then ``oom_gpu`` (``CUDA out of
   memory``, ``HIP out of memory``, ``OutOfMemoryError``, ``CUDA error: out of memory``,
   ``CUBLAS_STATUS_ALLOC_FAILED``, XLA/TF ``failed to allocate ... from device``,
   ``HIP_ERROR_OutOfMemory``, XLA's ``RESOURCE_EXHAUSTED`` (JAX / PyTorch-XLA on TPU: HBM; not
   gRPC's ``StatusCode.RESOURCE_EXHAUSTED`` / "message larger than max", a message-size limit).
   PyTorch's "Tried to allocate more than 1EB memory" is NOT an OOM: ``CUDACachingAllocator`` raises
   it for a request of 2^60 bytes or more, i.e. a corrupted size (e.g. ``all_gather_object`` after
   ranks desynchronised) -- ``unknown``. These are the only classes a warning-level line may report
   (Megatron-LM logs the OOM that ends a run as ``WARNING:megatron.core.utils:CUDA out of memory``);
6b. ``divergence`` (the fp16 loss scale at its minimum, "Loss became infinite or NaN", "Loss is NaN",
   Megatron's "found NaN in local grad norm", clip_grad_norm_'s non-finite norm, TensorFlow's "Model
   diverged with loss = NaN", a logged loss or grad norm that is NaN/inf -- HF Trainer's
   ``{'loss': nan, ...}``, Megatron's ``grad norm: nan`` --; status ``failed``) and ``invalid_config``
   (a setup check refusing the layout: "96 is not divisible by 64", "must be divisible by", DeepSpeed's
   batch check, torchtitan's "Invalid parallel dims");
7. ``rendezvous_failure`` (DistNetworkError, DistStoreError, Rendezvous*Error, c10d store and
   socket failures, including the TCPStore client's warning-level ``[c10d] recvValue failed on
   SocketImpl(...): Connection reset by peer`` -- the store is gone; its "retrying" lines and a
   ``sendBytes failed ... Broken pipe`` at teardown are not failures): before the NCCL/network rules
   because store errors quote socket errors
   ("DistNetworkError: Connection reset by peer" is a rendezvous failure);
8. NCCL result codes -- the code a wrapper line names wins over the "Last error" detail quoted in
   the same line; NCCL's proxy thread reports the code as a number (``[Proxy Service 9] Failed
   to execute operation Connect from rank 9, retcode 6``, ``Error encountered progressing
   operation=Connect, res=2``), read with ``ncclResult_t`` (``src/nccl.h.in``: 1 unhandled CUDA
   error, 2 system error, 3 internal error, 4 invalid argument, 5 invalid usage, 6 remote error);
   ``nccl_remote_error`` (ncclRemoteError / "remote process exited or there was a
   network error"), ``nccl_system_error``, ``nccl_unhandled_cuda_error``,
   ``nccl_invalid_usage_or_internal`` (also ncclCommEnsureReady's "Attempt to use communicator before the
   previous operation returned ncclSuccess": the communicator's pending error, or invalid argument);
9. ``collective_timeout`` (watchdog / "Timeout at NCCL work" / heartbeat / gloo timeouts; following
   the labelled data, the watchdog's generic "Exception (either an error or timeout) detected by
   watchdog" line counts as a timeout too);
10. NCCL ``WARN`` details without a result code: ``Cuda failure`` -> unhandled CUDA error; ibverbs,
    shared-memory and host-allocation failures -> system error; "Duplicate GPU detected" and
    mismatched collectives ("collective mismatch", "message truncated") -> invalid usage;
11. ``nccl_remote_error`` for "Connection reset by peer" (the labelled data's convention: a reset
    means the peer process went away), then ``nccl_network_error`` (NET/IB, NET/OFI, NET/Socket,
    socket recv/send failures, "Connection closed by remote peer", broken pipe, ...);
12. ``child_process_failed`` (ChildFailedError, elastic agent "failed (exitcode: N) local_rank" --
    also a negative exit code, i.e. a child killed by a signal such as SIGKILL (-9), srun task
    exits, SignalException, the shell's "line 9:  4727 Killed") -- a symptom: the root cause
    (an OOM, an NCCL error) is looked for in the rest of the log;
13. ``unknown``: generic error lines (``Traceback``, ``SomethingError: ...``, a bare ``Exception:
    ...`` (Python's ``raise Exception(...)``, e.g. DeepSpeed's "Current loss scale already at
    minimum"), segfaults, c10 ``[E`` lines, unmatched ``CUDA error:``/``NCCL error``, ``srun:
    error:``).

Lines that match none of these are not error lines (``None``).

Root cause of a whole log
-------------------------
:func:`classify_text` classifies every line (a line whose only evidence is a logged NaN/inf metric,
``rules.NAN_METRIC``, is no root cause: a framework may skip such a step and recover), then:

* *refinement*: an NCCL result-code line (unhandled CUDA error, system error, internal/invalid usage,
  remote error) whose next few lines (:data:`REFINE_WINDOW`) quote a process-local fault (the
  ``Last error:`` block, e.g. ``Cuda failure 'out of memory'``) takes that fault's class and line;
* *symptoms* (``child_process_failed``, ``unknown``) are skipped while any other class is present;
  among symptoms alone, the first ``child_process_failed`` beats the first ``unknown``;
* otherwise the FIRST remaining line wins, except that a communication-level consequence
  (``collective_timeout``, ``nccl_remote_error``, ``nccl_network_error``,
  ``rendezvous_failure``: the store's host process may be the one that died, and
  ``scheduler_cancelled``: srun cancels the whole step -- ``*** STEP 9411285.0 ON gpu20-15 CANCELLED
  AT ... ***`` -- once one task died, e.g. of an OOM kill) yields to a
  process-local fault (:data:`PRIMARY_FAULTS`: ``oom_gpu``, ``oom_gpu_nccl_buffer``, ``oom_host``,
  ``cuda_illegal_memory_access``, ``gpu_hardware_fault``, ``node_failure``, ``divergence``,
  ``invalid_config``) found anywhere in the log: a dying process makes its peers time out and
  lose their connections, never the reverse, and interleaved multi-rank output does not guarantee
  that the dying rank's message is printed first. A timeout after an NCCL system or network error
  is won by that earlier error through the first-wins rule.

``scalebook classify`` (:func:`main`, :func:`classify_stream`) prints one word per input line: the
class, or ``none`` for lines that are not error lines.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from core.record import status_for_error_class
from ingest import failure_rules as rules
from ingest.failure_rules import RULES

__all__ = [
    "Classification",
    "RULES",
    "classify_line",
    "classify_text",
    "classify_stream",
    "status_for",
    "main",
]

#: Process-local faults: they kill a process, and its peers then time out or lose connections.
PRIMARY_FAULTS = frozenset(
    {"oom_gpu", "oom_gpu_nccl_buffer", "oom_host", "cuda_illegal_memory_access", "gpu_hardware_fault",
     "node_failure", "divergence", "invalid_config"}
)
#: Communication-level errors that a process-local fault elsewhere in the log explains.
CONSEQUENCES = frozenset(
    {"collective_timeout", "nccl_remote_error", "nccl_network_error", "rendezvous_failure", "scheduler_cancelled"}
)
#: Classes that never name a root cause while anything more specific is present.
SYMPTOMS = ("child_process_failed", "unknown")  # in order of preference among themselves
#: NCCL result-code classes whose following "Last error:" lines may name a more specific fault.
NCCL_WRAPPERS = frozenset(
    {
        "nccl_unhandled_cuda_error",
        "nccl_system_error",
        "nccl_invalid_usage_or_internal",
        "nccl_remote_error",
    }
)
#: How many following lines a wrapper line may be refined from.
REFINE_WINDOW = 4




@dataclass(frozen=True)
class Classification:
    """The first root cause found in a log.

    ``error_class`` is a DESIGN §6 class or ``None`` when the log shows no failure; ``line`` is the
    root-cause line (stripped), ``line_no`` its 1-based number, ``status`` the run status it implies.
    """

    error_class: str | None
    line: str | None = None
    line_no: int | None = None
    status: str | None = None


def status_for(error_class: str | None) -> str | None:
    """Run status implied by an error class (``None`` for no failure): core.record's one table."""
    return status_for_error_class(error_class)


def _has_keyword(lowered: str) -> bool:
    for keyword in rules.KEYWORDS:
        if keyword in lowered:
            return True
    return False


def classify_line(line: str) -> str | None:
    """The DESIGN §6 error class of one log line, or ``None`` if it is not an error line."""
    return _line_class(line)[0]


def _line_class(line: str) -> tuple[str | None, bool]:
    """``(class, metric_only)``: the line's class as :func:`classify_line` reports it, and whether the
    only evidence is a logged NaN/inf metric (``rules.NAN_METRIC``), which :func:`classify_text` does not
    take as a root cause."""
    cls = _classify(line)
    if cls == "divergence" and rules.NAN_METRIC.search(line):
        other = next(p for c, p in RULES if c == "divergence" and p is not rules.NAN_METRIC)
        return cls, not other.search(line)
    return cls, False


def _classify(line: str) -> str | None:
    if not line or "NCCL INFO" in line:
        return None
    if "\x1b" in line:
        line = rules.ANSI.sub("", line)
    if not _has_keyword(line.lower()):
        return None
    core = rules.PREFIX.sub("", line.rstrip("\r\n"))
    if rules.BENIGN.search(line) or rules.CODE_LINE.match(core):
        return None
    if rules.WARNING_LINE.match(core) and not rules.FAILING_WARNING.search(core):
        # a warning is not a failure, unless it reports one: Megatron-LM logs the OOM that ends the run
        # through its logger first ("WARNING:megatron.core.utils:CUDA out of memory. Tried to ...")
        for error_class, pattern in RULES:
            if error_class in rules.FAILURES_WARNED and pattern.search(line):
                return error_class
        return None
    core = core.strip()
    proxy = rules.NCCL_PROXY_CODE.search(line)
    if proxy and int(proxy.group(1)) in rules.NCCL_RESULT:
        return rules.NCCL_RESULT[int(proxy.group(1))]
    xid = rules.XID_CODE.search(line)
    if xid and int(xid.group(1)) in rules.XID_APPLICATION:
        return rules.XID_APPLICATION[int(xid.group(1))]
    for error_class, pattern in RULES:
        target = core if error_class == "unknown" else line
        if pattern.search(target):
            return error_class
    return None


def classify_text(text: str) -> Classification:
    """The first root cause in a whole log (see the module docstring for the rules)."""
    lines = (rules.ANSI.sub("", text) if "\x1b" in text else text).splitlines()
    found: list[tuple[int, str]] = []  # (0-based index, class) of every error line
    classes: dict[int, str] = {}
    for i, line in enumerate(lines):
        cls, metric_only = _line_class(line)
        if cls is not None and not metric_only:
            found.append((i, cls))
            classes[i] = cls
    if not found:
        return Classification(None)

    # Refinement: an NCCL result code followed by its "Last error:" detail naming a local fault.
    refined: list[tuple[int, str]] = []
    for i, cls in found:
        if cls in NCCL_WRAPPERS:
            for j in range(i + 1, min(i + 1 + REFINE_WINDOW, len(lines))):
                if classes.get(j) in PRIMARY_FAULTS:
                    i, cls = j, classes[j]
                    break
        refined.append((i, cls))

    specific = [(i, c) for i, c in refined if c not in SYMPTOMS]
    if specific:
        i, cls = specific[0]
        if cls in CONSEQUENCES:
            primary = next(((j, c) for j, c in specific if c in PRIMARY_FAULTS), None)
            if primary is not None:
                i, cls = primary
    else:
        for symptom in SYMPTOMS:
            hit = next(((j, c) for j, c in refined if c == symptom), None)
            if hit is not None:
                i, cls = hit
                break
    return Classification(cls, lines[i].strip(), i + 1, status_for(cls))


def classify_stream(lines: Iterable[str]) -> Iterator[str]:
    """One word per input line: its error class, or ``"none"`` when it is not an error line."""
    for line in lines:
        yield classify_line(line) or "none"


def main(argv: Sequence[str] | None = None) -> int:
    """``scalebook classify``: classify stdin line by line (or, with ``--root-cause``, as a whole).

    Per-line mode prints one word per input line (a class, or ``none``). ``--root-cause`` prints
    ``<error_class>\\t<status>\\t<line_no>\\t<line>`` for the whole input, or ``none``.
    """
    parser = argparse.ArgumentParser(prog="scalebook classify", description=main.__doc__)
    parser.add_argument("--root-cause", action="store_true", help="classify stdin as one log")
    args = parser.parse_args(argv)
    if args.root_cause:
        result = classify_text(sys.stdin.read())
        if result.error_class is None:
            print("none")
        else:
            print(f"{result.error_class}\t{result.status}\t{result.line_no}\t{result.line}")
        return 0
    for word in classify_stream(sys.stdin):
        print(word)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
