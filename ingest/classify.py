"""Failure classifier: log line -> DESIGN §6 ``error_class``; whole log -> first root cause.

Standard library only (``ingest/`` must import without third-party packages).

Line rules
----------
:func:`classify_line` tries the rules of :data:`RULES` in order and returns the class of the first
rule that matches; the order *is* the precedence, most specific first:

0. ANSI colour codes are removed; a line with none of the lower-case keywords of ``_KEYWORDS``
   (which every rule below needs) is not an error line -- a cheap pre-filter for the common case;
1. not an error at all (checked before anything else) -> ``None``: ``NCCL INFO`` lines; benign
   ``NCCL WARN`` lines (net-plugin discovery such as "NET/Plugin : Could not find ...", connection
   "retrying"); warning-level lines (c10 ``[W...]``, glog ``W0101 ...``, ``WARNING:``, Python
   ``*Warning``) -- torch prints TCPStore retry/teardown warnings ("Failed to check the "should
   dump" flag on TCPStore ... Connection reset by peer") in healthy runs; Python source lines
   quoted inside a traceback (``    raise ChildFailedError(``);
2. ``scheduler_time_limit`` then ``scheduler_cancelled`` (Slurm ``*** JOB|STEP ... CANCELLED AT``
   banners, PBS walltime, LSF ``TERM_RUNLIMIT``/``TERM_OWNER``): unambiguous, never wrap another error;
3. ``gpu_hardware_fault`` (Xid, uncorrectable ECC, fallen off the bus, GPU lost) -- except the Xid
   codes that NVIDIA's Xid catalog attributes to the application, not the GPU: 31 (MMU fault: the
   process touched an invalid address; it sees ``CUDA_ERROR_ILLEGAL_ADDRESS``) is
   ``cuda_illegal_memory_access``; 13 (graphics engine exception), 43 (GPU stopped processing) and 45
   (preemptive cleanup after an earlier error or a killed process) are ``unknown``;
4. ``cuda_illegal_memory_access`` -- beats any NCCL wrapper around it ("Cuda failure 'an illegal
   memory access...'", "watchdog thread terminated with exception: CUDA error: an illegal...");
5. ``oom_gpu_nccl_buffer``: NCCL's own allocations (``Failed to CUDA calloc``, ``NCCL WARN Cuda
   failure 'out of memory'``, ``ncclUnhandledCudaError ... out of memory``, ``[Rem Allocator]``);
   checked before the generic OOM and before the NCCL result codes;
6. ``oom_gpu`` (``CUDA out of memory``, ``HIP out of memory``, ``OutOfMemoryError``, ``CUDA error:
   out of memory``, ``CUBLAS_STATUS_ALLOC_FAILED``, XLA/TF ``failed to allocate ... from device``,
   ``HIP_ERROR_OutOfMemory``, XLA's ``RESOURCE_EXHAUSTED`` (JAX / PyTorch-XLA on TPU: HBM; not
   gRPC's ``StatusCode.RESOURCE_EXHAUSTED`` / "message larger than max", a message-size limit);
   also host memory -- the allocator's ``DefaultCPUAllocator: can't allocate memory``, the Linux
   OOM killer (``Out of memory: Killed process``), Slurm's cgroup OOM kill (``slurmstepd: error:
   Detected 1 oom-kill event(s)`` / ``oom_kill event``) and srun's ``task 0: Out Of Memory``: the
   taxonomy has no host-memory class, and the run's status is ``oom`` either way). PyTorch's
   "Tried to allocate more than 1EB memory" is NOT an OOM: ``CUDACachingAllocator`` raises it for a
   request of 2^60 bytes or more, i.e. a corrupted size (e.g. ``all_gather_object`` after ranks
   desynchronised) -- ``unknown``;
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
   ``nccl_invalid_usage_or_internal``;
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
:func:`classify_text` classifies every line, then:

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
  process-local fault (``oom_gpu``, ``oom_gpu_nccl_buffer``, ``cuda_illegal_memory_access``,
  ``gpu_hardware_fault``) found anywhere in the log: a dying process makes its peers time out and
  lose their connections, never the reverse, and interleaved multi-rank output does not guarantee
  that the dying rank's message is printed first. A timeout after an NCCL system or network error
  is won by that earlier error through the first-wins rule.

``scalebook classify`` (:func:`main`, :func:`classify_stream`) prints one word per input line: the
class, or ``none`` for lines that are not error lines.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from core.record import ERROR_CLASSES, status_for_error_class

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

_I = re.IGNORECASE


def _rx(*patterns: str, flags: int = 0) -> re.Pattern[str]:
    """One compiled alternation of ``patterns``."""
    return re.compile("|".join(f"(?:{p})" for p in patterns), flags)


# --- not error lines ---------------------------------------------------------------------------
_BENIGN = _rx(
    r"\bNCCL INFO\b",
    # NCCL WARN lines printed by healthy jobs: net plugin discovery and connection retries.
    r"NCCL WARN.*(?:NET/Plugin|No plugin found|Could not find|Failed to open lib|"
    r"iommu_group|retrying|aws-ofi-nccl initialization failed)",
    r"\b(?:User|Future|Deprecation|Runtime)Warning\b",
)
# Warning-level lines after the prefix: c10 "[W<mmdd> ...]"/"[W file:line]", glog "W0101 12:00:00",
# Python logging "WARNING:"/"[WARNING]". torch prints such lines in healthy runs too (TCPStore
# retries and teardown: "Failed to check the "should dump" flag ... Connection reset by peer").
_WARNING_LINE = re.compile(r"^\s*(?:\[W\d{0,4}[\s\]]|W\d{4} \d\d:\d\d:\d\d|WARNING:|\[WARNING\])")
# Python source lines quoted inside a traceback ("    raise ChildFailedError(") and carets.
_CODE_LINE = re.compile(r"^\s+(?:File \"|raise\b|return\b|[~^]{3,})")
# Warning-level lines that are failures nonetheless: the TCPStore client losing its server.
# (recv side only: a send failing with "Broken pipe" is also printed at a healthy run's teardown)
_FAILING_WARNING = re.compile(r"\[c10d\] recv\w* failed on SocketImpl")
# Classes a warning-level line may report (classify_line): the memory exhaustion that ends the run.
_FAILURES_WARNED = frozenset({"oom_gpu", "oom_gpu_nccl_buffer", "oom_host"})
# NCCL proxy thread lines carrying an ncclResult_t number (src/nccl.h.in).
_NCCL_PROXY_CODE = re.compile(r"(?:Proxy Service \d+\].*\bretcode|operation=\w+, res)[ =](\d)\b")
_NCCL_RESULT = {1: "nccl_unhandled_cuda_error", 2: "nccl_system_error", 3: "nccl_invalid_usage_or_internal",
                4: "nccl_invalid_usage_or_internal", 5: "nccl_invalid_usage_or_internal", 6: "nccl_remote_error"}
# The NVIDIA driver's Xid report (kernel log): "NVRM: Xid (PCI:0000:02:00): 31, pid=56543, ...".
_XID_CODE = re.compile(r"\bXid\b\s*(?:\([^)]*\))?\s*:?\s*(\d+)\b", re.IGNORECASE)
# Xid codes NVIDIA's Xid catalog attributes to the application rather than the GPU (docstring, rule 3).
_XID_APPLICATION = {13: "unknown", 31: "cuda_illegal_memory_access", 43: "unknown", 45: "unknown"}
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # terminal colours (torchtitan, rich, ...)
# Prefixes in front of the message: "[rank3]:", "[default0]:", "[1,0]<stderr>:", srun -l "12: ".
_PREFIX = re.compile(r"^(?:\s*(?:\[[^\]]{0,60}\](?:<\w+>)?:|\d{1,5}:(?=\s)))+")

# --- the rules, in precedence order ------------------------------------------------------------
RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "scheduler_time_limit",
        _rx(
            r"CANCELLED AT \S+.*DUE TO TIME LIMIT",
            r"\bDUE TO TIME LIMIT\b",
            r"PBS: job killed: walltime",
            r"walltime \d+ exceeded limit",
            r"\bTERM_RUNLIMIT\b",
            r"exceeded (?:its |the )?(?:hard )?wall ?clock (?:time )?limit",
        ),
    ),
    (
        "node_failure",
        _rx(
            # Slurm losing a node: "salloc: error: Node failure on gpu-12", "srun: error: Node failure
            # on ...", "*** JOB 313 ON hgx-17 CANCELLED AT ... DUE TO NODE FAILURE ***", job state
            # NODE_FAIL; a task dying with its node's hardware ("srun: error: node: task 3: Bus error",
            # SIGBUS); slurmctld's "Nodes gpu-17 not responding"
            r"\bNode failure\b",
            r"\bNODE_FAIL\b",
            r"srun: error: [^:\n]*: tasks? [\d,\-\[\]]+: Bus error",
            r"(?:srun|salloc|sbatch|slurm\w*)(?:-\S+)?: error: .*\bnot responding\b",
            flags=_I,
        ),
    ),
    (
        "scheduler_cancelled",
        _rx(
            r"\*\*\*\s*(?:JOB|STEP)\s+\S+.*\bCANCELLED AT\b",
            r"\bCANCELLED AT \d{4}-\d\d-\d\dT",
            r"\*\*\*\s*(?:JOB|STEP)\s+\S+\s+STEPD TERMINATED ON\b",
            r"\bTERM_OWNER\b",
            r"DUE TO PREEMPTION",
        ),
    ),
    (
        "gpu_hardware_fault",
        _rx(
            r"\bXid\b\s*(?:\(|\d|:)",
            r"uncorrectable ECC",
            r"ECC[ _]UNCORRECTABLE|ErrorECCUncorrectable|ECC error.*(?:uncorrectable|double bit)",
            r"(?:contained|uncontained) ECC error",
            r"double bit error|\bDBE\b",
            r"fallen off the bus",
            r"\bGPU is lost\b",
            r"Unable to determine the device handle for GPU",
            r"uncorrectable NVLink error|NVLink: fatal error",
            r"row remapp\w* fail",
            r"HW Exception by GPU",
            # the driver failing to bring a GPU up (NVRM: "RmInitAdapter failed!", "Cannot attach gpu")
            r"RmInitAdapter failed|Cannot attach gpu",
            flags=_I,
        ),
    ),
    (
        "cuda_illegal_memory_access",
        _rx(
            r"illegal memory access",
            r"cudaErrorIllegalAddress|CUDA_ERROR_ILLEGAL_ADDRESS|illegal address",
            r"misaligned address",
            flags=_I,
        ),
    ),
    # c10/cuda/CUDACachingAllocator.cpp: a request >= 2^60 bytes is a corrupted size, not a shortage.
    ("unknown", _rx(r"Tried to allocate more than 1EB memory")),
    (
        "oom_gpu_nccl_buffer",
        _rx(
            r"Failed to CUDA \w+",  # include/alloc.h: "Failed to CUDA calloc [async] N bytes"
            r"\[Rem Allocator\] Allocation failed",
            r"(?:NCCL WARN|ncclUnhandledCudaError|unhandled cuda error|NCCL error|Cuda failure)"
            r".*(?:out of memory|OUT_OF_MEMORY|cudaErrorMemoryAllocation)",
            flags=_I,
        ),
    ),
    (
        "oom_host",
        _rx(
            # host memory (docstring, rule 6): the allocator's "DefaultCPUAllocator: can't allocate
            # memory", the Linux OOM killer (mm/oom_kill.c; also the cgroup form "Memory cgroup out of
            # memory: Killed process N" and older kernels' "Out of memory: Kill process N (...) score ...
            # or sacrifice child"), Slurm's task/cgroup plugin ("Detected 1 oom-kill event(s) in
            # StepId=..." / "Detected 1 oom_kill event in StepId=..."; "Job N exceeded memory limit
            # (X > Y), being killed"), srun reporting the task's end ("srun: error: node: task 0: Out Of
            # Memory"), C++'s std::bad_alloc and Python's MemoryError
            r"DefaultCPUAllocator: (?:can't allocate|not enough) memory",
            r"\b(?i:out of memory: kill(?:ed)? process) \d+",
            r"Detected \d+ oom[-_]kill event",
            r"srun: error: [^:\n]*: tasks? [\d,\-\[\]]+: Out Of Memory",
            r"exceeded (?:job )?memory limit\b.*\bkill|Exceeded job memory limit",
            r"std::bad_alloc",
            r"(?<![\w.])MemoryError(?::|\s*$)",
        ),
    ),
    (
        "oom_gpu",
        _rx(
            r"(?:CUDA|HIP|XPU|MPS) out of memory",
            r"OutOfMemoryError",
            r"CUDA error: out of memory",
            r"CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED|CUDA_ERROR_OUT_OF_MEMORY",
            r"cudaErrorMemoryAllocation|hipErrorOutOfMemory|HIP_ERROR_OutOfMemory",
            r"failed to allocate \S+ \(\d+ bytes\) from device",  # XLA / TF stream executor
            # XLA (JAX, PyTorch/XLA, TF on TPU/GPU): the device memory allocator's status code; not
            # gRPC's status of the same name ("StatusCode.RESOURCE_EXHAUSTED", "8 RESOURCE_EXHAUSTED:
            # Received message larger than max (5013781 vs. 4194304)"): a message-size limit or quota
            r"(?<!StatusCode\.)\bRESOURCE_EXHAUSTED\b(?!.*message larger than max)",
            r"\bResource exhausted: Attempting to (?:allocate|reserve)",
        ),
    ),
    (
        "divergence",
        _rx(
            # DeepSpeed's / Megatron's fp16 loss scaler giving up, fairseq's and detectron2's checks
            r"loss scale (?:is )?already at (?:its )?minimum",
            r"Minimum loss scale reached",
            r"Loss became infinite or NaN",
            # TensorFlow's NanTensorHook ("Model diverged with loss = NaN.", NanLossDuringTrainingError:
            # "NaN loss during training."), scikit-neuralnetwork ("Training diverged and returned NaN.")
            r"\b(?:model|loss|training)\s+diverged\b",
            r"NanLossDuringTrainingError|NaN loss during training",
            # "Loss is NaN", "loss is nan, stopping training", "grad norm is inf", "The loss returned in
            # `training_step` is nan", "loss went NaN"
            r"\b(?:loss|grad(?:ient)?s?[ _]norm)\b[^|\n]{0,40}?\b(?:is|are|became|was|went|got|turned)\s+"
            r"(?:a\s+)?(?:nan|inf|non-?finite|infinite)\b",
            r"\bnan (?:loss|detected|encountered|values? (?:found|detected) in)\b|\bNaN or Inf (?:found|detected)",
            r"\bnon-?finite (?:loss|value|gradients?|grad norm)\b.*(?:detected|found|encountered|stop|abort)",
            # Megatron-LM's checks (training.py / rerun_state_machine.py): "Rank 3: found NaN in local
            # grad norm in backward pass ...", "found NaN in local forward loss calculation"
            r"found (?:NaN|Inf) in (?:local )?(?:grad|forward|loss|the loss)",
            # torch.nn.utils.clip_grad_norm_(error_if_nonfinite=True); autograd's anomaly mode
            r"for gradients from `parameters` is non-finite",
            r"returned nan values in its \d+\w* output",
            # JAX's jax_debug_nans
            r"FloatingPointError: invalid value \((?:nan|inf)\) encountered",
            flags=_I,
        ),
    ),
    (
        "invalid_config",
        _rx(
            # layout/batch checks refusing a configuration (Megatron's ensure_divisibility "96 is not
            # divisible by 64", "num_attention_heads must be divisible by tensor_model_parallel_size",
            # HF "The hidden size (4096) is not a multiple of the number of attention heads (3)",
            # DeepSpeed "Check batch related parameters. train_batch_size is not equal to
            # micro_batch_per_gpu * gradient_acc_step * world_size", torchtitan "Invalid parallel dims")
            r"\b(?:is |are )?not (?:evenly )?divisible by\b",
            r"\b(?:must|should|has to|needs to) be (?:evenly )?divisible by\b",
            r"\b(?:is not|must be|should be|needs to be) (?:a )?multiples? of\b",
            r"Check batch related parameters",
            r"is not equal to micro_batch_per_gpu",
            r"Invalid parallel dims",
            r"does not divide (?:evenly )?(?:the )?(?:number|world|global|num_)",
            flags=_I,
        ),
    ),
    (
        "rendezvous_failure",
        _rx(
            r"DistNetworkError|DistStoreError",
            r"Rendezvous\w*(?:Error|Timeout)",
            r"rendezvous\b.*\b(?:timed out|failed)",
            r"store based barrier",
            r"c10d key-value store|store->(?:get|set|wait)\(.*(?:error|timeout)",
            r"(?:client|server) socket has (?:timed out|failed)",
            r"Timed out after \d+ seconds waiting for (?:workers|clients)",
            r"wait timeout after \d+ ?ms, keys:",
            r"connection to the C10d store has failed",
            r"\[c10d\] recv\w* failed on SocketImpl",
            r"Error waiting on exit barrier",  # torchelastic agent's store barrier
            r"\bSocket Timeout\b",
            # JAX / XLA's coordination service: "DEADLINE_EXCEEDED: Barrier timed out. Barrier_id:
            # PjRT_Client_Connect"
            r"DEADLINE_EXCEEDED: Barrier timed out",
            # the TCPStore client of init_process_group (torch/distributed/rendezvous.py) giving up
            r"(?:RuntimeError|DistNetworkError): (?:connect\(\) timed out|Connection timed out\s*$)",
            flags=_I,
        ),
    ),
    (
        "nccl_remote_error",
        _rx(
            r"\bncclRemoteError\b",
            r"remote process exited or there was a network error",
            r"remote process exiting prematurely",
        ),
    ),
    (
        "nccl_system_error",
        _rx(r"\bncclSystemError\b", r"unhandled system error", flags=_I),
    ),
    (
        "nccl_unhandled_cuda_error",
        _rx(r"\b(?:nccl)?UnhandledCudaError\b", r"unhandled cuda error", r"Call to CUDA function failed", flags=_I),
    ),
    (
        "nccl_invalid_usage_or_internal",
        _rx(
            r"\bncclInvalidUsage\b|\bncclInternalError\b|\bncclInvalidArgument\b",
            r"NCCL (?:error|failure)\b.*\b(?:invalid usage|invalid argument|internal error)",
            r"internal error - please report this issue to the NCCL developers",
            r"^\s*invalid usage\b.*(?:NCCL|for details)",  # the result string on a line of its own
            # XLA (JAX, PyTorch/XLA) quoting ncclGetErrorString: "NCCL operation ncclAllReduce(...)
            # failed: invalid usage: while running replica 0 ..."
            r"NCCL operation \w+\(.*\) failed: (?:invalid usage|invalid argument|internal error)",
            r"Internal check failed",
            flags=_I,
        ),
    ),
    (
        "collective_timeout",
        _rx(
            r"Watchdog caught collective operation timeout",
            r"collective operation timeout",
            r"Timeout at NCCL work",
            r"detected by watchdog",
            r"due to a collective timeout",
            r"ran for \d+ milliseconds before timing out",
            r"WorkNCCL\(.*\) timed out",
            r"Heartbeat monitor timed out",
            r"watchdog (?:got|thread) stuck|watchdog got stuck",
            r"Some NCCL operations have failed or timed out",
            r"taking the entire process down",
            r"flight recorder dump signal",
            r"Timed out waiting \d+ ?ms for (?:send|recv) operation",
            r"failed to pass monitoredBarrier",
            flags=_I,
        ),
    ),
    (
        "nccl_unhandled_cuda_error",
        _rx(r"\bCuda failure\b", r"NCCL WARN.*\bcuda\w*\b.*failed", flags=_I),
    ),
    (
        "nccl_system_error",
        _rx(
            r"Call to ibv_\w+ failed|\bibv_\w+ failed",
            r"shared memory segment|failed to extend /dev/shm|posix_fallocate",
            r"NCCL WARN.*(?:No space left on device|Cannot allocate memory)",
            r"NCCL WARN.*Failed to (?:malloc|calloc|realloc)\b",
            r"NCCL WARN.*Call to (?:bind|listen|socket|open|mmap|ioctl)\b.*failed",
            flags=_I,
        ),
    ),
    (
        "nccl_invalid_usage_or_internal",
        _rx(
            r"Duplicate GPU detected",
            r"collective mismatch|message truncated",  # mismatched collectives across ranks
            r"NCCL WARN.*\binvalid (?:rank|root|communicator|comm|device|datatype|type|op|usage)\b",
            flags=_I,
        ),
    ),
    ("nccl_remote_error", _rx(r"Connection reset by peer", flags=_I)),
    (
        "nccl_network_error",
        _rx(
            r"NET/IB\w*\s*:.*(?:error|fail|Got completion)",  # NET/IB, NET/IBP (vendor plugins)
            r"Got completion from peer .*(?:error|status=|vendor err)",
            r"NET/OFI\b.*(?:error|fail)",
            # aws-ofi-nccl's warnings in a running job ("NET/OFI Unexpected status (0) for message 246",
            # "Write complete from unexpected request type!", "Unable to insert remote address into
            # address vector", "Unexpected number of remote rails") precede its failure; the plugin
            # discovery warnings of healthy jobs are benign (_BENIGN)
            r"NCCL WARN NET/OFI\b",
            r"NET/Socket\s*:.*(?:error|fail|closed)",
            r"Socket (?:recv|send) failed",
            r"Connection closed by (?:remote )?peer",
            r"Net\s*:\s*Call to \w+ .*failed",
            r"socket\w*:.*(?:failed|error)",
            r"Broken pipe",
            r"Software caused connection abort|No route to host",
            r"NCCL WARN.*(?:Connection (?:refused|timed out)|exceeded retries)",
            r"ibv_poll_cq|IBV_WC_\w+_ERR|RETRY_EXC_ERR",
            flags=_I,
        ),
    ),
    (
        "child_process_failed",
        _rx(
            r"ChildFailedError",
            r"failed \(exitcode:\s*-?\d+\)\s*local_rank",
            r"srun: error: [^:\n]*: tasks? [\d,\-\[\]]+: (?:Exited with exit code|Killed|Terminated)",
            r"SignalException: Process \d+ got signal",
            # the shell reporting a child killed by a signal: "line 9:  4727 Killed" (SIGKILL),
            # "2324239 Aborted (core dumped)" (SIGABRT)
            r"line \d+:\s+\d+ (?:Killed|Aborted|Segmentation fault|Bus error)\b",
            r"exits with return code\s*=\s*-?[1-9]",
        ),
    ),
    (
        "unknown",
        _rx(
            r"^Traceback \(most recent call last\)",
            r"^Exception: \S",  # Python's `raise Exception(...)`
            r"(?:^|[\s:>\]])(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)(?::|\s*$)",
            r"Segmentation fault|Fatal Python error|core dumped|terminate called after throwing",
            r"^\[E\s?\d{0,4}[\s\]]",
            r"\bCUDA error\b|\bNCCL error\b",
            r"(?:srun|slurmstepd)(?:-\S+)?: error:",
        ),
    ),
)

assert all(cls in ERROR_CLASSES for cls, _ in RULES), "RULES name a class outside ERROR_CLASSES"


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


#: Lower-case substrings of which every line matched by a rule contains at least one: a cheap
#: pre-filter that lets the (much more common) ordinary log lines skip the regular expressions.
#: Keep it in step with RULES (the tests classify every labelled line and variant through it).
_KEYWORDS = (
    "error", "fail", "exception", "traceback", "timeout", "timed out", "timing out", "time limit",
    "walltime", "wall clock", "wallclock", "cancel", "terminat", "term_", "xid", "ecc", "bus", "lost",
    "handle", "nvlink", "remapp", "dbe", "double bit", "illegal", "misaligned", "out of memory",
    "out_of_memory", "invalid", "internal", "watchdog", "process down", "flight recorder", "nccl warn",
    "connection", "net/", "broken pipe", "no route", "ibv_", "return code", "segmentation", "fatal",
    "core dumped", "srun", "slurmstepd", "[e", "alloc", "retcode", "res=", "exhausted", "barrier", "killed", "aborted",
    "nan", "infinite", "non-finite", "nonfinite", "is inf", "loss scale", "divisib", "multiple of", "not equal to",
    "invalid parallel", "node failure", "node_fail", "not responding", "memoryerror", "memory limit", "net/ofi",
    "diverged", "attach gpu",
)


def _has_keyword(lowered: str) -> bool:
    for keyword in _KEYWORDS:
        if keyword in lowered:
            return True
    return False


def classify_line(line: str) -> str | None:
    """The DESIGN §6 error class of one log line, or ``None`` if it is not an error line."""
    if not line or "NCCL INFO" in line:
        return None
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    if not _has_keyword(line.lower()):
        return None
    core = _PREFIX.sub("", line.rstrip("\r\n"))
    if _BENIGN.search(line) or _CODE_LINE.match(core):
        return None
    if _WARNING_LINE.match(core) and not _FAILING_WARNING.search(core):
        # a warning is not a failure, unless it reports one: Megatron-LM logs the OOM that ends the run
        # through its logger first ("WARNING:megatron.core.utils:CUDA out of memory. Tried to ...")
        for error_class, pattern in RULES:
            if error_class in _FAILURES_WARNED and pattern.search(line):
                return error_class
        return None
    core = core.strip()
    proxy = _NCCL_PROXY_CODE.search(line)
    if proxy and int(proxy.group(1)) in _NCCL_RESULT:
        return _NCCL_RESULT[int(proxy.group(1))]
    xid = _XID_CODE.search(line)
    if xid and int(xid.group(1)) in _XID_APPLICATION:
        return _XID_APPLICATION[int(xid.group(1))]
    for error_class, pattern in RULES:
        target = core if error_class == "unknown" else line
        if pattern.search(target):
            return error_class
    return None


def classify_text(text: str) -> Classification:
    """The first root cause in a whole log (see the module docstring for the rules)."""
    lines = (_ANSI.sub("", text) if "\x1b" in text else text).splitlines()
    found: list[tuple[int, str]] = []  # (0-based index, class) of every error line
    classes: dict[int, str] = {}
    for i, line in enumerate(lines):
        cls = classify_line(line)
        if cls is not None:
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
