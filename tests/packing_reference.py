"""The definitions of packing, written as plainly as possible (O(n x rows) loops).

docs/batching.md, "Packing", states them; the fast implementations
(umlos_cuda/batching/packing/trees.py, umlos_cuda/_packing.cpp) must give
exactly these rows. Nothing here is clever: every open row is scanned for
every sequence, and rows are built token by token.
"""

from __future__ import annotations


def reference_pack_lengths(lengths, max_length: int, mode: str, separator_len: int = 0) -> list[int]:
    """Row of each sequence; rows numbered in the order they are opened.

    A row holding sequences uses their lengths plus ``separator_len`` between
    each two of them; a sequence fits an open row when the row's used tokens
    plus ``separator_len`` plus its length are at most ``max_length``.
    """
    lengths = [int(x) for x in lengths]
    order = list(range(len(lengths)))
    if mode == "greedy":
        order = sorted(order, key=lambda i: -lengths[i])  # Python's sort is stable
    used: list[int] = []  # tokens used by each open row
    rows = [-1] * len(lengths)
    for i in order:
        length = lengths[i]
        fitting = [r for r in range(len(used)) if used[r] + separator_len + length <= max_length]
        if not fitting:
            used.append(length)
            rows[i] = len(used) - 1
            continue
        # first_fit, and greedy after its sort, take the first row with room
        chosen = min(fitting, key=lambda r: (max_length - used[r], r)) if mode == "best_fit" else fitting[0]
        used[chosen] += separator_len + length
        rows[i] = chosen
    return rows


def reference_pack_sequences(sequences, max_length: int, mode: str, separator_ids=(), oversize: str = "refuse"):
    """``(rows, counts)``: each row as a dict of plain lists, built token by token,
    and the oversize counts. ``sequences`` are ``(sample_id, ids, mask)``; a
    refused oversize sequence returns ``None``."""
    pieces = []  # (sample_id, ids, mask, offset)
    counts = {"skipped": 0, "truncated": 0, "truncated_tokens": 0, "split": 0, "skipped_ids": []}
    for sample_id, ids, mask in sequences:
        if len(ids) <= max_length:
            pieces.append((sample_id, list(ids), list(mask), 0))
        elif oversize == "refuse":
            return None
        elif oversize == "skip":
            counts["skipped"] += 1
            counts["skipped_ids"].append(sample_id)
        elif oversize == "truncate":
            counts["truncated"] += 1
            counts["truncated_tokens"] += len(ids) - max_length
            pieces.append((sample_id, list(ids[:max_length]), list(mask[:max_length]), 0))
        else:  # split
            counts["split"] += 1
            for start in range(0, len(ids), max_length):
                pieces.append((sample_id, list(ids[start:start + max_length]), list(mask[start:start + max_length]),
                               start))
    row_of = reference_pack_lengths([len(p[1]) for p in pieces], max_length, mode, len(separator_ids))
    rows = []
    for r in range(max(row_of, default=-1) + 1):
        members = [p for p, row in zip(pieces, row_of) if row == r]
        row = {"input_ids": [], "loss_mask": [], "segment_ids": [], "position_ids": [], "cu_seqlens": [0],
               "sample_ids": [], "sample_offsets": []}
        for k, (sample_id, ids, mask, offset) in enumerate(members):
            tokens = list(zip(ids, mask))
            if k + 1 < len(members):
                tokens += [(t, 0) for t in separator_ids]
            for position, (token, loss) in enumerate(tokens):
                row["input_ids"].append(token)
                row["loss_mask"].append(loss)
                row["segment_ids"].append(k)
                row["position_ids"].append(position)
            row["cu_seqlens"].append(len(row["input_ids"]))
            row["sample_ids"].append(sample_id)
            row["sample_offsets"].append(offset)
        rows.append(row)
    return rows, counts
