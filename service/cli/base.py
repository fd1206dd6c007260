"""Shared pieces of the CLI: the typer app, the HTTP client to the API, output helpers."""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated, Any, NoReturn

import httpx
import typer
from rich.console import Console

#: the exit-code rule of every command (also in `scalebook --help`)
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
HELP = ("scalebook: results database for distributed LLM-training benchmark sweeps.\n\n"
        "Exit codes (every command): 0 = done; 1 = the command could not do its job (the API is unreachable or "
        "answered an error, an import rejected rows, a check failed); 2 = usage error (unknown option, missing or "
        "malformed argument).\n\n"
        "Tables fit the terminal (80 columns when piped; set COLUMNS to change): cells wrap, never cut; columns "
        "that do not fit are left out and named below the table; --json prints the API's answer unchanged.")
app = typer.Typer(help=HELP, no_args_is_help=True, pretty_exceptions_enable=False)
console = Console()

# The options that name a target (the model, the node count, the hardware, the shapes): one copy,
# shared by recommend, suggest and the other commands that answer for a target.
ModelOpt = Annotated[str, typer.Option("--model", help="model size: 8B (the heatmap's 7–8B row), 8.03B or "
                                       "8030261248 (one model), 8e9")]
NodesOpt = Annotated[int, typer.Option("--nodes", help="node count of the target")]
GpusPerNodeOpt = Annotated[int, typer.Option("--gpus-per-node")]
GpuTypeOpt = Annotated[str | None, typer.Option("--gpu-type", help="H100, A100-80GB, ... (default: the evidence's)")]
SeqLenOpt = Annotated[int | None, typer.Option("--seq-len", help="tokens per sequence (default: the evidence's)")]
GlobalBatchOpt = Annotated[int | None, typer.Option("--global-batch-tokens",
                                                   help="tokens per optimizer step (default: the evidence's)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the API's JSON")]
# What the target is costed for: the framework, the precision and the model's shape (default: the records')
FrameworkOpt = Annotated[str | None, typer.Option(
    "--framework", help="nanotron, Megatron-LM, torchtitan, nemo … (a recorded name or part of one; default: the "
    "runs')")]
PrecisionOpt = Annotated[str | None, typer.Option("--precision", help="bf16 | fp8 | fp16 … (default bf16)")]
NumLayersOpt = Annotated[int | None, typer.Option("--num-layers", min=1, help="model dims (default: the recorded "
                                                  "model's, else inferred from --model)")]
HiddenSizeOpt = Annotated[int | None, typer.Option("--hidden-size", min=1)]
NumHeadsOpt = Annotated[int | None, typer.Option("--num-heads", min=1)]
NumKvHeadsOpt = Annotated[int | None, typer.Option("--num-kv-heads", min=1, help="GQA key/value heads")]
FfnHiddenSizeOpt = Annotated[int | None, typer.Option("--ffn-hidden-size", min=1)]
VocabSizeOpt = Annotated[int | None, typer.Option("--vocab-size", min=1)]
GatedOpt = Annotated[bool | None, typer.Option("--gated/--no-gated", help="gated MLP (SwiGLU, 3 matrices) or GPT's "
                                               "GELU (2); default: the records'", show_default=False)]


def shape_params(framework: str | None, precision: str | None, num_layers: int | None, hidden_size: int | None,
                 num_heads: int | None, num_kv_heads: int | None, ffn_hidden_size: int | None,
                 vocab_size: int | None, gated: bool | None) -> dict[str, Any]:
    """The API's names for the framework, precision and model-shape options (None = not given)."""
    return {"framework": framework, "precision": precision, "num_layers": num_layers, "hidden_size": hidden_size,
            "num_heads": num_heads, "num_kv_heads": num_kv_heads, "ffn_hidden_size": ffn_hidden_size,
            "vocab_size": vocab_size, "gated_linear_unit": gated}
err_console = Console(stderr=True)

DEFAULT_API_URL = "http://127.0.0.1:8000"


def api_url() -> str:
    """SCALEBOOK_API_URL or http://127.0.0.1:8000."""
    return os.environ.get("SCALEBOOK_API_URL", DEFAULT_API_URL).rstrip("/")


class ApiError(Exception):
    """An error answer from the API, carrying its status and error body."""

    def __init__(self, status: int, body: dict[str, Any]):
        self.status = status
        self.body = body
        err = body.get("error", {}) if isinstance(body, dict) else {}
        super().__init__(f"HTTP {status} {err.get('code', '')}: {err.get('message', body)}")


class Api:
    """Thin synchronous client of the scalebook API (sends SCALEBOOK_TOKEN as a bearer token)."""

    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 60.0):
        self.url = (url or api_url()).rstrip("/")
        token = token if token is not None else os.environ.get("SCALEBOOK_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def request(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        try:
            resp = self.http.request(method, f"/api/v1{path}", **kwargs)
        except httpx.TransportError as exc:
            fail(f"cannot reach the scalebook API at {self.url} ({exc.__class__.__name__}): start it with "
                 "`scalebook serve` or set SCALEBOOK_API_URL", EXIT_FAILED)
            raise  # pragma: no cover - fail() always exits
        try:
            body = resp.json()
        except ValueError:
            body = {"error": {"code": "bad_response", "message": resp.text[:500]}}
        return resp.status_code, body

    def get(self, path: str, **params: Any) -> Any:
        status, body = self.request("GET", path, params={k: v for k, v in params.items() if v is not None})
        if status >= 400:
            raise ApiError(status, body)
        return body

    def post(self, path: str, payload: Any) -> tuple[int, Any]:
        return self.request("POST", path, json=payload)


def fail(message: str, code: int = EXIT_FAILED) -> NoReturn:
    """Print an error to stderr and exit with `code` (1: could not do the job; 2: usage error)."""
    err_console.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(code)


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


def fetch(path: str, as_json: bool, **params: Any) -> Any | None:
    """GET an API path for a read-only command. Exits with the API's error message on an error
    answer; with --json prints the body and returns None (the command is done); otherwise returns
    the body for the command to render."""
    try:
        body = Api().get(path, **params)
    except ApiError as exc:
        fail(str(exc))
    if as_json:
        print_json(body)
        return None
    return body
