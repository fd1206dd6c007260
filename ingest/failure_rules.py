"""The failure classifier's line rules (DESIGN §6): the patterns :mod:`ingest.classify` applies, in
precedence order, with the not-an-error filters and the keyword pre-filter. Standard library only.

The order of :data:`RULES` is the precedence (most specific first); :mod:`ingest.classify`'s
docstring explains each rule and the root-cause selection over a whole log.
"""

from __future__ import annotations

import re

from core.record import ERROR_CLASSES

__all__ = ["ANSI", "BENIGN", "CODE_LINE", "FAILING_WARNING", "FAILURES_WARNED", "KEYWORDS", "NAN_METRIC",
           "NCCL_PROXY_CODE",
           "NCCL_RESULT", "PREFIX", "RULES", "WARNING_LINE", "XID_APPLICATION", "XID_CODE"]

_I = re.IGNORECASE


def _rx(*patterns: str, flags: int = 0) -> re.Pattern[str]:
    """One compiled alternation of ``patterns``."""
    return re.compile("|".join(f"(?:{p})" for p in patterns), flags)


# --- not error lines ---------------------------------------------------------------------------
BENIGN = _rx(
    r"\bNCCL INFO\b",
    # NCCL WARN lines printed by healthy jobs: net plugin discovery and connection retries.
    r"NCCL WARN.*(?:NET/Plugin|No plugin found|Could not find|Failed to open lib|"
    r"iommu_group|retrying|aws-ofi-nccl initialization failed)",
    r"\b(?:User|Future|Deprecation|Runtime)Warning\b",
)
# Warning-level lines after the prefix: c10 "[W<mmdd> ...]"/"[W file:line]", glog "W0101 12:00:00",
# Python logging "WARNING:"/"[WARNING]". torch prints such lines in healthy runs too (TCPStore
# retries and teardown: "Failed to check the "should dump" flag ... Connection reset by peer").
WARNING_LINE = re.compile(r"^\s*(?:\[W\d{0,4}[\s\]]|W\d{4} \d\d:\d\d:\d\d|WARNING:|\[WARNING\])")
# Python source lines quoted inside a traceback ("    raise ChildFailedError(") and carets.
CODE_LINE = re.compile(r"^\s+(?:File \"|raise\b|return\b|[~^]{3,})")
# Warning-level lines that are failures nonetheless: the TCPStore client losing its server.
# (recv side only: a send failing with "Broken pipe" is also printed at a healthy run's teardown)
FAILING_WARNING = re.compile(r"\[c10d\] recv\w* failed on SocketImpl")
# Classes a warning-level line may report (classify_line): the memory exhaustion that ends the run.
FAILURES_WARNED = frozenset({"oom_gpu", "oom_gpu_nccl_buffer", "oom_host"})
# NCCL proxy thread lines carrying an ncclResult_t number (src/nccl.h.in).
NCCL_PROXY_CODE = re.compile(r"(?:Proxy Service \d+\].*\bretcode|operation=\w+, res)[ =](\d)\b")
NCCL_RESULT = {1: "nccl_unhandled_cuda_error", 2: "nccl_system_error", 3: "nccl_invalid_usage_or_internal",
                4: "nccl_invalid_usage_or_internal", 5: "nccl_invalid_usage_or_internal", 6: "nccl_remote_error"}
# The NVIDIA driver's Xid report (kernel log): "NVRM: Xid (PCI:0000:02:00): 31, pid=56543, ...", and
# the GSP firmware's recovery of all channels after one ("NVRM: kgspRcAndNotifyAllChannels_IMPL: RC all
# channels for critical error 79."), whose number is the Xid code.
XID_CODE = re.compile(
    r"(?:\bXid\b\s*(?:\([^)]*\))?\s*:?\s*|\bRC all channels for critical error )(\d+)\b", re.IGNORECASE
)
# Xid codes NVIDIA's Xid catalog attributes to the application rather than the GPU (docstring, rule 3).
XID_APPLICATION = {13: "unknown", 31: "cuda_illegal_memory_access", 43: "unknown", 45: "unknown"}
# A logged metric that is NaN or inf: HF Trainer's dict ("{'loss': nan, 'grad_norm': nan, ...}"),
# Megatron's iteration line ("lm loss: NAN | ... | grad norm: nan |"), torchtitan's "loss: nan", Lightning's
# "train_loss=nan". On its own
# such a line reads as divergence (classify_line); over a whole log it is not a root cause (classify_text
# skips it): a framework may skip a non-finite step and recover, which only the series shows
# (ingest/parsers/logs.py counts the non-finite steps and decides).
NAN_METRIC = re.compile(
    r"(?<![\w.])['\"]?(?:[a-z]+_)?(?:lm loss|loss|grad norm|grad_norm)['\"]?\s*[:=]\s*['\"]?(?:nan|[-+]?inf)\b",
    re.IGNORECASE,
)
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # terminal colours (torchtitan, rich, ...)
# Prefixes in front of the message: "[rank3]:", "[default0]:", "[1,0]<stderr>:", srun -l "12: ".
PREFIX = re.compile(r"^(?:\s*(?:\[[^\]]{0,60}\](?:<\w+>)?:|\d{1,5}:(?=\s)))+")

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
            # the driver's status NV_ERR_GPU_IS_LOST, whose text is "GPU lost from the bus"
            # ("NVRM: nvCheckOkFailedNoLog: Check failed: GPU lost from the bus [NV_ERR_GPU_IS_LOST]"), and
            # NVML's NVML_ERROR_GPU_IS_LOST as pynvml raises it ("NVMLError_GpuIsLost: GPU is lost")
            r"GPU lost from the bus|NV_ERR_GPU_IS_LOST|\bGpuIsLost\b",
            r"\bRC all channels for critical error \d+",
            # ROCr (the HSA runtime under HIP) reporting a memory fault whose cause is an ECC failure:
            # "Memory access fault by GPU node-%u (Agent handle: %p) on address %p%s. Reason: %s." with the
            # reason "ECC failure (if supported by HW)" or "SRAM ECC failure" (runtime/core/runtime.cpp)
            r"Memory access fault by GPU\b.*\bReason: (?:SRAM )?ECC failure",
            r"Unable to determine the device handle for GPU",
            r"uncorrectable NVLink error|NVLink: fatal error",
            r"row remapp\w* fail",
            r"HW Exception by GPU",
            # the amdgpu kernel driver timing out a GPU job and resetting the GPU (a GPU hang, like
            # NVIDIA's Xid 8/109): "[drm:amdgpu_job_timedout [amdgpu]] *ERROR* ring gfx_0.0.0 timeout"
            r"\bamdgpu_job_timedout\b|\bamdgpu: GPU reset begin\b",
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
            # ROCr's page fault report (AMD GPUs; see gpu_hardware_fault for the ECC reasons):
            # "Memory access fault by GPU node-2 (Agent handle: 0x...) on address 0x1000. Reason: Page not
            # present or supervisor privilege." -- the process touched an address it does not own
            r"Memory access fault by GPU node-\d+",
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
            # Kubernetes: the kubelet's container status when the kernel's OOM killer ended the container
            # for exceeding its memory limit ("Reason: OOMKilled" in `kubectl describe pod`, the STATUS
            # column of `kubectl get pods`), and runc's "container init was OOM-killed"
            r"\bOOMKilled\b",
            r"\bOOM-killed\b",
            # the rest of the kernel OOM killer's report (mm/oom_kill.c): dump_header's "python invoked
            # oom-killer: gfp_mask=...", dump_oom_summary's "oom-kill:constraint=CONSTRAINT_MEMCG,...",
            # the oom_reaper's "oom_reaper: reaped process 4242 (python), now anon-rss:0kB"
            r"\binvoked oom-killer\b",
            r"\boom-kill:constraint=",
            r"\boom_reaper: reaped process\b",
            # NumPy's MemoryError subclass: "numpy.core._exceptions._ArrayMemoryError: Unable to allocate
            # 3.00 GiB for an array with shape ..."
            r"_ArrayMemoryError\b|\bUnable to allocate [\d.]+ [KMGTP]?i?B for an array\b",
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
            # XLA / TF stream executor, CUDA and ROCm ("failed to allocate 8.00G from device:
            # hipError_t(1002)" in the older ROCm port prints no byte count)
            r"failed to allocate \S+ (?:\(\d+ bytes\) )?from device",
            # XLA (JAX, PyTorch/XLA, TF on TPU/GPU): the device memory allocator's status code; not
            # gRPC's status of the same name ("StatusCode.RESOURCE_EXHAUSTED", "8 RESOURCE_EXHAUSTED:
            # Received message larger than max (5013781 vs. 4194304)"): a message-size limit or quota
            r"(?<!StatusCode\.)\bRESOURCE_EXHAUSTED\b(?!.*message larger than max)",
            # the same status in older TensorFlow/XLA, whose Status printed the code as "Resource exhausted"
            r"\bResource exhausted: (?:Attempting to (?:allocate|reserve)|Out of memory|Failed to allocate)",
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
            # InternEvo/InternLM's "Nan grad norm occurs, please check it"
            r"\bnan grad(?:ient)?[ _]norm\b",
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
    # a logged metric that is NaN or inf (NAN_METRIC): a line of its own, but no root cause of a whole log
    ("divergence", NAN_METRIC),
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
            # ncclCommEnsureReady (src/init.cc): a call on a communicator whose last operation has not
            # returned ncclSuccess; it returns that error, or ncclInvalidArgument while still in progress
            r"Attempt to use communicator before the previous operation returned ncclSuccess",
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
        # NCCL's CUDACHECK; RCCL (hipified NCCL) names the HIP call ("NCCL WARN hipIpcGetMemHandle failed :
        # invalid argument")
        _rx(r"\bCuda failure\b", r"NCCL WARN.*\b(?:cuda|hip)\w*\b.*failed", flags=_I),
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
            # discovery warnings of healthy jobs are benign (BENIGN)
            r"NCCL WARN NET/OFI\b",
            r"NET/Socket\s*:.*(?:error|fail|closed)",
            r"Socket (?:recv|send) failed",
            r"Connection closed by (?:remote )?peer",
            r"Net\s*:\s*Call to \w+ .*failed",
            r"socket\w*:.*(?:failed|error)",
            r"Broken pipe",
            r"Software caused connection abort|No route to host",
            r"NCCL WARN.*(?:Connection (?:refused|timed out)|exceeded retries|Network is unreachable|No route to host)",
            # a failed ibverbs work completion asserted by a transport ("Check failed: wc->status ==
            # IBV_WC_SUCCESS RC send CQ state error: 12, 0")
            r"Check failed: .*\bIBV_WC_SUCCESS\b",
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
            # HIP runtime errors not classified above ("hipErrorNoBinaryForGpu: Unable to find code object
            # for all current devices!")
            r"\bhipError[A-Z]\w*",
        ),
    ),
)

assert all(cls in ERROR_CLASSES for cls, _ in RULES), "RULES name a class outside ERROR_CLASSES"


#: Lower-case substrings of which every line matched by a rule contains at least one: a cheap
#: pre-filter that lets the (much more common) ordinary log lines skip the regular expressions.
#: Keep it in step with RULES (the tests classify every labelled line and variant through it).
KEYWORDS = (
    "error", "fail", "exception", "traceback", "timeout", "timed out", "timing out", "time limit",
    "walltime", "wall clock", "wallclock", "cancel", "terminat", "term_", "xid", "ecc", "bus", "lost",
    "handle", "nvlink", "remapp", "dbe", "double bit", "illegal", "misaligned", "out of memory",
    "out_of_memory", "invalid", "internal", "watchdog", "process down", "flight recorder", "nccl warn",
    "connection", "net/", "broken pipe", "no route", "ibv_", "return code", "segmentation", "fatal",
    "core dumped", "srun", "slurmstepd", "[e", "alloc", "retcode", "res=", "exhausted", "barrier", "killed", "aborted",
    "nan", "infinite", "non-finite", "nonfinite", "is inf", "loss scale", "divisib", "multiple of", "not equal to",
    "invalid parallel", "node failure", "node_fail", "not responding", "memoryerror", "memory limit", "net/ofi",
    "diverged", "attach gpu", "gpu lost", "gpu_is_lost", "gpuislost", "memory access fault", "oomkilled", "oom-killed",
    ": inf", "=inf", "': inf", "duplicate gpu", "hiperror", "ibv_wc", "oom-kill", "oom_reaper", "unable to allocate",
    "gpu reset",
)
