"""Plot the loss traces of train_tiny_lm.py runs on one figure (PNG).

    python examples/plot_loss_curves.py runs/tiny runs/killed --killed-at 130 --output loss.png

Each argument is a run folder (its ``loss.jsonl``). The first is drawn as a
solid line, the others dashed on top of it; a run that was resumed (its
``timing.json`` says from which step) gets a marker at that step, and
``--killed-at`` marks where the killed process died. With identical traces
the dashed curve lies exactly on the solid one, and the legend says how many
steps of each later run after its resume equal the first run's, bit for bit
(loss, plan position and batch fingerprint).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from umlos_cuda.files.writer import atomic_output


def trace(run: str) -> list[dict]:
    with open(os.path.join(run, "loss.jsonl"), encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def resumed_from(run: str) -> int | None:
    path = os.path.join(run, "timing.json")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as handle:
        step = json.load(handle).get("resumed_from")
    return step or None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run folders of examples/train_tiny_lm.py")
    parser.add_argument("--killed-at", type=int, help="the step the killed run died at (a marker)")
    parser.add_argument("--output", required=True, help="the PNG to write")
    parser.add_argument("--force", action="store_true", help="replace an existing PNG")
    args = parser.parse_args(argv)

    traces = [trace(run) for run in args.runs]
    first = {line["step"]: line for line in traces[0]}
    figure, axes = plt.subplots(figsize=(7, 3.6), dpi=110)
    for number, (run, lines) in enumerate(zip(args.runs, traces)):
        steps = [line["step"] for line in lines]
        losses = [float.fromhex(line["loss"]) for line in lines]
        label = os.path.basename(os.path.normpath(run))
        if number == 0:
            axes.plot(steps, losses, color="tab:blue", linewidth=2.2, alpha=0.55, label=label)
            continue
        start = resumed_from(run) or 0
        after = [line for line in lines if line["step"] > start]
        same = sum(1 for line in after if first.get(line["step"]) == line)
        note = f", resumed from step {start}" if start else ""
        axes.plot(steps, losses, color="tab:red", linewidth=0.9, linestyle=(0, (4, 3)),
                  label=f"{label}{note}: {same} of its {len(after)} later steps bit-identical")
        if start:
            axes.axvline(start, color="tab:green", linewidth=1, label=f"checkpoint restored (step {start})")
    if args.killed_at:
        axes.axvline(args.killed_at, color="black", linewidth=1, linestyle=":",
                     label=f"SIGKILL (step {args.killed_at})")
    axes.set_xlabel("step")
    axes.set_ylabel("training loss (per microbatch)")
    axes.set_title("Tiny Llama on packed plan batches: killed, resumed, same losses")
    axes.legend(fontsize=8)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    with atomic_output(args.output, force=args.force) as handle:
        figure.savefig(handle, format="png", metadata={"Software": None})
    plt.close(figure)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
