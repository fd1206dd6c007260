"""Shared pieces of the CLI: the typer app, requests to the API (service/client.py), output helpers."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console

from service.client import Client, ClientError

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

#: seconds one request of a command may take: an import sends batches of 1,000 runs
TIMEOUT_S = 60.0


def client(url: str | None = None) -> Client:
    """The API client of every command (service/client.py: SCALEBOOK_API_URL, SCALEBOOK_TOKEN)."""
    return Client(url, timeout=TIMEOUT_S)


def call(method: str, path: str, *, params: dict[str, Any] | None = None, json: Any = None) -> Any:
    """One request to ``/api/v1{path}`` for a command: the JSON body, or exit 1 with the client's
    message (the API unreachable, a token refused, or the API's error answer)."""
    try:
        return client().request(method, path, params=params, json=json)
    except ClientError as exc:
        fail(str(exc))


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
    body = call("GET", path, params=params)
    if as_json:
        print_json(body)
        return None
    return body


def reflow(doc: str | None) -> str | None:
    """A command's docstring as paragraphs typer can wrap: the lines of a paragraph joined by spaces
    (typer ≥ 0.16 keeps the single line breaks of every paragraph after the first, so a docstring
    wrapped at 100 characters came out ragged in an 80-column terminal); a bullet ("- ") starts a
    line of its own; blank lines still separate paragraphs; text after a "\\f" line is kept as is."""
    if not doc:
        return doc
    import inspect

    text, cut, rest = inspect.cleandoc(doc).partition("\f")
    body = text.rstrip("\n")
    paragraphs = []
    for para in body.split("\n\n"):
        lines: list[str] = []
        for line in para.splitlines():
            stripped = line.strip()
            if lines and not stripped.startswith("- "):
                lines[-1] += " " + stripped
            else:
                lines.append(stripped)
        paragraphs.append("\n".join(lines))
    return "\n\n".join(paragraphs) + text[len(body):] + cut + rest


def reflow_help(typer_app: typer.Typer) -> None:
    """:func:`reflow` the help of every command and sub-command group of ``typer_app`` (in place)."""
    for info in typer_app.registered_commands:
        info.help = reflow(info.help or (info.callback.__doc__ if info.callback else None))
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            reflow_help(group.typer_instance)
