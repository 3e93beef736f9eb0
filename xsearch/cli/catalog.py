"""``xsearch list`` (the attention variants) and ``xsearch spaces`` (the shipped search spaces)."""

from __future__ import annotations

import argparse


def register(name: str, p: argparse.ArgumentParser) -> None:
    if name == "list":
        p.add_argument("--causal", action="store_true", help="only decoder-capable variants")
        p.add_argument("--markdown", action="store_true", help="a Markdown table (for the README)")
        p.set_defaults(func=cmd_list)
    else:
        p.add_argument("--show", metavar="NAME", help="print one space as YAML (a starting point for your own)")
        p.set_defaults(func=cmd_spaces)


def cmd_list(args: argparse.Namespace) -> int:
    from xsearch.attention import attention_spec, list_attentions

    names = list_attentions(causal=True if args.causal else None)
    rows = []
    for name in names:
        s = attention_spec(name)
        params = ", ".join(f"{k}={v}" for k, v in s.params.items()) or "-"
        rows.append((name, s.paper, "+".join(s.family) or "-", s.complexity, "yes" if s.causal else "no", params))
    if args.markdown:
        print("| name | paper | family | complexity | causal | parameters (defaults) |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            print("| " + " | ".join(f"`{r[0]}`" if i == 0 else r[i] for i in range(len(r))) + " |")
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{len(rows)} attention variants")
    for col in ("name", "family", "complexity", "causal", "parameters", "paper"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r[0], r[2], r[3], r[4], r[5], r[1])
    Console().print(table)
    return 0


def cmd_spaces(args: argparse.Namespace) -> int:
    from xsearch.search_spaces import list_spaces, load_space

    if args.show:
        print(load_space(args.show).to_yaml(), end="")
        return 0
    for name in list_spaces():
        space = load_space(name)
        size = f"{len(space.attention):2d} variants  {space.size():.3g} configurations"
        print(f"{name:10s} {size}  {space.description.strip()}")
    return 0
