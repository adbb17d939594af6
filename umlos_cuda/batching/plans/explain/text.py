"""The text ``plan explain`` prints for an explanation (:func:`~.explainer.explain`'s dict): per step and rank,
each unit on a line of its own and its rows as a compact table.

A column is printed only when some row has a value in it (``component`` in a mixture, ``piece`` in a split
plan, ``pack`` in a packed one), ``row`` only where it differs from ``doc`` (a mixture's rows, a listed source's),
and each source's path once, above the steps, as ``s0``, ``s1``, ...
"""

from __future__ import annotations

#: ``(heading, row key)`` of the table's columns, in order (``range`` is ``start:stop``, ``src`` the source's tag).
COLUMNS = (("sample", "sample"), ("row", "row"), ("component", "component"), ("c.epoch", "component_epoch"),
           ("doc", "document"), ("piece", "piece"), ("pack", "pack"), ("range", "start"), ("tokens", "tokens"),
           ("loss", "loss_tokens"), ("src", "source"))


def lines(report: dict) -> list[str]:
    """The text of ``report`` (module docstring)."""
    origin = report["origin"]
    edited = "" if not origin.get("edits") else f", edited from {origin['parent']} ({len(origin['edits'])} edit(s))"
    batch = f", {report['batch_size']} {report['unit']}s a rank a step" if report["batch_size"] > 1 else ""
    start = report["start"]
    resumed = "" if (start["epoch"], start["index"]) == (0, 0) else f", from cursor {start['epoch']}:{start['index']}"
    name = report["kind"] if report["plan"] is None else f"{report['kind']} {report['plan']}"
    out = [f"{name} (fingerprint {report['fingerprint']}){edited}",
           f"  world size {report['world_size']}{batch}{resumed}: {report['run_steps']} steps"]
    tags: dict[str | None, str] = {}
    for step in report["steps"]:
        for rank in step["ranks"]:
            for unit in rank["units"]:
                for row in unit["rows"]:
                    if row["source"] is not None and row["source"] not in tags:
                        tags[row["source"]] = f"s{len(tags)}"
    out += [f"  {tag}: {path}" for path, tag in tags.items()]
    for step in report["steps"]:
        out.append(f"step {step['step']}: epoch {step['epoch']}, cursor {step['cursor']}")
        for rank in step["ranks"]:
            if not rank["units"]:
                out.append(f"  rank {rank['rank']}: no {report['unit']} (the epoch's last step is short)")
            for unit in rank["units"]:
                out.append(f"  rank {rank['rank']}, {report['unit']} {unit['index']}{_unit_words(unit)}")
                out += ["    " + line for line in _table(unit["rows"], tags)]
    return out


def _unit_words(unit: dict) -> str:
    where = [f"{name} {unit[key]}" for name, key in (("parent's unit", "parent_index"), ("window", "window"),
                                                      ("bucket", "bucket_id"), ("max_len", "max_len"))
             if unit.get(key) is not None]
    loss = "" if unit["loss_tokens"] is None else f", {unit['loss_tokens']:,} loss tokens"
    return (f" ({', '.join(where)})" if where else "") + \
        f": {_count(len(unit['rows']), 'row')}, {unit['tokens']:,} tokens{loss}"


def _count(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _table(rows: list[dict], tags: dict) -> list[str]:
    """The rows as aligned columns (module docstring)."""
    shown = [(heading, key) for heading, key in COLUMNS if any(row[key] is not None for row in rows)]
    if all(row["row"] == row["document"] for row in rows):
        shown = [column for column in shown if column[1] != "row"]
    cells = [[heading for heading, _ in shown]]
    for row in rows:
        cells.append([_cell(row, key, tags) for _, key in shown])
    widths = [max(len(line[i]) for line in cells) for i in range(len(shown))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in cells]


def _cell(row: dict, key: str, tags: dict) -> str:
    if key == "start":
        return f"{row['start']}:{row['stop']}"
    if key == "source":
        return tags.get(row["source"], "-")
    return "-" if row[key] is None else str(row[key])
