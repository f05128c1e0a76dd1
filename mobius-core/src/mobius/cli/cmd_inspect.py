"""``mobius inspect PACKAGE``: what a package holds (components, ports, edges, sizes)."""

from __future__ import annotations

from typing import Any

import typer

from mobius.cli._common import DEBUG_HELP, user_errors


def describe(package: Any) -> dict[str, Any]:
    """A JSON-ready summary of a :class:`mobius.package.Package`."""
    manifest = package.manifest
    entries = manifest.get("components", {})
    contract = package.contract

    def ports(items: Any) -> list[dict[str, Any]]:
        return [{"name": p.name, "dtype": p.dtype, "shape": list(p.shape)} for p in items]

    components = []
    for component in contract.components:
        entry = entries.get(component.name, {})
        components.append(
            {
                "name": component.name,
                "path": entry.get("path"),
                "size": entry.get("size"),
                "presence": component.presence,
                "inputs": ports(component.inputs),
                "outputs": ports(component.outputs),
            }
        )
    return {
        "path": str(package.root),
        "format_version": manifest.get("format_version"),
        "model_type": manifest.get("model_type"),
        "task": manifest.get("task"),
        "dtype": manifest.get("dtype"),
        "target": manifest.get("target"),
        "components": components,
        "edges": [f"{e.producer} -> {e.consumer}" for e in contract.edges],
        "states": [f"{s.producer} -> {s.consumer}" for s in contract.states],
        "externals": [f"{x.name} -> {x.consumer} ({x.kind})" for x in contract.externals],
        "optionals": [f"{o.consumer} when {o.presence}" for o in contract.optionals],
        "outputs": list(contract.outputs),
        "source": manifest.get("source"),
        "versions": manifest.get("versions"),
        "quantization": manifest.get("quantization"),
    }


def _form(t: dict[str, Any]) -> str:
    """``MatMulNBits int4 b32 zp float`` (``MatMulNBits int4 b32 zp none + block-sums
    correction``) of one quantized tensor's manifest entry."""
    ops = "+".join(t.get("ops", []))
    text = f"{ops} int{t.get('bits')}"
    if "block_size" in t:
        text += f" b{t['block_size']} zp {t.get('zero_points')}"
    if t.get("correction"):
        text += f" + {t['correction']} correction"
    return text


def _print_source_types(info: dict[str, Any]) -> None:
    """Every tensor of a GGUF source with its type, and the form it took."""
    types = (info.get("source") or {}).get("tensor_types")
    if not isinstance(types, dict):
        return
    forms: dict[str, str] = {}
    for c in ((info.get("quantization") or {}).get("components") or {}).values():
        for t in (c.get("tensors") or {}).values():
            if t.get("source"):
                forms[t["source"]] = _form(t)
    counts: dict[str, int] = {}
    for kind in types.values():
        counts[kind] = counts.get(kind, 0) + 1
    listing = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    typer.echo(f"source tensors (GGUF types): {len(types)} ({listing})")
    for name, kind in types.items():
        form = forms.get(name)
        typer.echo(f"    {name}: {kind}" + (f" -> {form}" if form else ""))


def _print_quantization(q: dict[str, Any]) -> None:
    from mobius.cli.cmd_build import human_size

    echo = typer.echo
    if q.get("method") == "kept-from-source":
        echo(
            f"quantization: kept from the {q.get('format')} file's blocks, accuracy level "
            f"{q.get('accuracy_level')}, activations {q.get('activation_dtype')}"
        )
    else:
        sym = "symmetric" if q.get("symmetric") else "asymmetric"
        echo(
            f"quantization: {q.get('format')} ({q.get('method')}), block "
            f"{q.get('block_size')}, {sym}, accuracy level {q.get('accuracy_level')}, "
            f"activations {q.get('activation_dtype')}"
        )
    if q.get("exclude"):
        echo(f"    excluded: {', '.join(q['exclude'])}")
    for name, c in (q.get("components") or {}).items():
        tensors = c.get("tensors", {})
        ops: dict[str, int] = {}
        for t in tensors.values():
            for op in t.get("ops", []):
                key = _form({**t, "ops": [op]})
                ops[key] = ops.get(key, 0) + 1
        listing = ", ".join(f"{n} {k}" for k, n in sorted(ops.items())) or "none"
        # a tied table feeds both ops: counted under each, stored once (53 = 2 + 52 - 1)
        shared = sorted(n for n, t in tensors.items() if len(t.get("ops", [])) > 1)
        if shared:
            listing += (
                f"; read by several ops, counted under each, stored once: {', '.join(shared)}"
            )
        echo(
            f"    {name}: {len(tensors)} tensors quantized ({listing}); "
            f"{human_size(c.get('quantized_bytes', 0))} quantized, "
            f"{human_size(c.get('other_bytes', 0))} other, "
            f"{len(c.get('kept_float', {}))} kept float"
        )
        for tensor, why in c.get("kept_float", {}).items():
            echo(f"        float: {tensor} ({why})")


def _print_text(info: dict[str, Any]) -> None:
    from mobius.cli.cmd_build import human_size

    echo = typer.echo
    echo(f"package {info['path']}")
    echo(
        f"  model_type {info['model_type']}, task {info['task']}, "
        f"dtype {info['dtype']}, target {info['target']}"
    )
    for c in info["components"]:
        size = human_size(c["size"]) if isinstance(c["size"], int) else "?"
        presence = f" (when {c['presence']})" if c["presence"] else ""
        echo(f"component {c['name']}{presence}: {c['path']}, {size}")
        for kind in ("inputs", "outputs"):
            for p in c[kind]:
                shape = ", ".join(str(d) for d in p["shape"])
                echo(f"    {kind[:-1]:6} {p['name']}: {p['dtype']}[{shape}]")
    for title in ("edges", "states", "externals", "optionals", "outputs"):
        if info[title]:
            echo(f"{title}:")
            for line in info[title]:
                echo(f"    {line}")
    if info.get("quantization"):
        _print_quantization(info["quantization"])
    _print_source_types(info)


def register(app: typer.Typer) -> None:
    """Add the ``inspect`` command to ``app``."""

    @app.command("inspect")
    def inspect(
        ctx: typer.Context,
        package: str = typer.Argument(..., help="A package folder written by mobius build."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON instead."),
        debug: bool = typer.Option(False, "--debug", help=DEBUG_HELP),
    ) -> None:
        """Show a package's components, ports, edges and sizes."""
        with user_errors(ctx, debug):
            from mobius.package import read_package

            info = describe(read_package(package))
            if as_json:
                import json

                typer.echo(json.dumps(info, indent=2))
            else:
                _print_text(info)
