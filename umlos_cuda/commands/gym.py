"""``umlos-cuda gym serve|info|run|replay``: online episodes from the puzzle server.

``serve`` runs the puzzle server (``chuk-puzzles-gym``) on a chosen address
(``--port 0``: a free one, announced on stdout and in ``--port-file``);
``info`` lists a server's games and difficulties; ``run`` plays episodes
into a replay buffer and builds rolling plan windows, recording every window
in ``OUTPUT/windows.jsonl``; ``replay`` rebuilds every window of such a log
offline and checks each fingerprint (exit 2, ``WINDOW_REPLAY_MISMATCH``, on
the first that differs). docs/streams.md shows each with a local server.

A run folder is written like every folder of this project
(umlos_cuda/files/writer.py): filled under a hidden name, with its artifact
marker (``"artifact": "gym run"``), and renamed to ``OUTPUT`` when the run
ends well; a failed run (server down, unknown game, Ctrl-C) leaves nothing at
``OUTPUT``, so the same command runs again as it is, and ``--force`` replaces
a finished run (and nothing else).
"""

from __future__ import annotations

import json
import os
import sys
import time

from ._args import add_option, add_pack_arguments, integer_list, non_negative_int, positive_int


def register(subparsers) -> None:
    gym = subparsers.add_parser(
        "gym", help="play puzzle-server episodes into a replay buffer; replay recorded windows",
        description="Online streams from the chuk-puzzles-gym telnet server: serve it locally, list its games, run "
        "episodes into a replay buffer with rolling batch-plan windows, and replay a recorded run offline.",
    )
    actions = gym.add_subparsers(dest="gym_action", metavar="ACTION")

    serve = actions.add_parser("serve", help="run the puzzle server on HOST:PORT (foreground)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=non_negative_int("port"), default=0, help="port (default 0: a free one)")
    serve.add_argument("--port-file", help="write 'HOST PORT' to this file once listening")
    serve.set_defaults(func=run_serve)

    info = actions.add_parser("info", help="list a server's games, difficulties and version")
    _address(info)
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.set_defaults(func=run_info)

    run = actions.add_parser("run", help="play episodes into a replay buffer and build rolling plan windows")
    _address(run)
    run.add_argument("--game", required=True, metavar="G[,G...]", help="game names (e.g. sudoku,kenken)")
    run.add_argument("--difficulty", default="easy", metavar="D[,D...]", help="difficulties, cycled (default easy)")
    run.add_argument("--policy", dest="player", choices=("hint", "random"), default="hint",
                     help="the player: who plays (default hint)")
    run.add_argument("--episodes", required=True, type=positive_int("episodes"), metavar="N")
    run.add_argument("--max-steps", type=positive_int("max steps"), default=200, metavar="S",
                     help="commands per episode before giving up (default 200)")
    run.add_argument("--output-mode", choices=("episode", "steps"), default="episode",
                     help="one sample per episode (default) or per command")
    run.add_argument("--tokenizer", required=True, metavar="PATH", help="tokenizer.json or a model directory")
    add_option(run, "--eos", old=("--eos-token",), dest="eos_token", metavar="TEXT",
               help="the end-of-sequence token (a bare tokenizer.json names none)")
    run.add_argument("--buffer-size", required=True, type=positive_int("buffer size"), metavar="B")
    run.add_argument("--eviction", choices=("fifo", "lowest_priority", "reservoir"), default="fifo")
    add_option(run, "--window", old=("--window-mbs",), dest="window_mbs", required=True,
               type=positive_int("window microbatches"), metavar="K", help="microbatches per window")
    run.add_argument("--window-every", type=positive_int("window every"), default=10, metavar="E",
                     help="build a window after every E episodes (default 10), and after the last")
    run.add_argument("--policy-yaml", metavar="POLICY.yaml", help="sampling policies (docs/streams.md)")
    add_option(run, "--window-samples", old=("--samples-per-window",), dest="samples_per_window",
               type=positive_int("samples per window"), metavar="N",
               help="draws per window with --policy-yaml (default: the buffer's size)")
    run.add_argument("--token-budget", type=positive_int("token budget"), default=16384, metavar="T")
    run.add_argument("--bucket-edges", default="256,512,1024,2048", metavar="E1,E2,...")
    run.add_argument("--overflow-max", type=positive_int("overflow max"), default=4096, metavar="L")
    add_pack_arguments(run, what="packed windows (--pack-max-len at least --overflow-max)", default_max_len=4096)
    run.add_argument("--seed", type=non_negative_int("seed"), default=0, metavar="S",
                     help="run seed: puzzles, player draws, and the buffer's RNG without --manifest (default 0)")
    run.add_argument("--manifest", metavar="MANIFEST.yaml", help="the run manifest that keys the buffer's RNG")
    run.add_argument("--output", required=True, metavar="DIR", help="a new folder for windows.jsonl and run.json")
    run.add_argument("--force", action="store_true", help="replace an existing gym run folder (nothing else)")
    run.add_argument("--quiet", action="store_true", help="no progress lines")
    run.set_defaults(func=run_run)

    replay = actions.add_parser("replay", help="rebuild every window of a recorded run and check its fingerprints")
    replay.add_argument("log", metavar="DIR|LOG", help="a gym run folder or its windows.jsonl")
    replay.add_argument("--plot", metavar="PNG", help="also plot the sampling distribution per window (matplotlib)")
    replay.set_defaults(func=run_replay)


def _address(parser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="the server's host (default 127.0.0.1)")
    parser.add_argument("--port", type=positive_int("port"), default=8023, help="the server's port (default 8023)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds one command may take (default 10)")


def run_serve(args) -> int:
    import asyncio

    from ..streams.gym.server import serve

    asyncio.run(serve(args.host, args.port, args.port_file))
    return 0


def run_info(args) -> int:
    from ..streams.gym.server import server_version
    from ..streams.gym.telnet_client import TelnetGymClient

    with TelnetGymClient(host=args.host, port=args.port, timeout=args.timeout) as client:
        games, difficulties = client.games(), client.difficulties()
    info = {"server": f"{args.host}:{args.port}", "games": [g.__dict__ for g in games],
            "difficulties": list(difficulties),
            "server_version": None, "installed_chuk_puzzles_gym": server_version()}
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"server {info['server']}: {len(games)} games")
    for g in games:
        print(f"  {g.number:>2}) {g.name} - {g.description}")
    print(f"difficulties: {', '.join(difficulties)}")
    print("server version: not reported by the telnet protocol; chuk-puzzles-gym installed here: "
          f"{info['installed_chuk_puzzles_gym'] or 'none'}")
    return 0


def run_run(args) -> int:
    from ..batching import BatchingConfig
    from ..batching.packing.config import PackingConfig
    from ..batching.lengths.fingerprints import tokenizer_fingerprint
    from ..batching.lengths.tokenizer import load_tokenizer
    from ..streams import GymConfig, GymEpisodeStream, ReplayBuffer, load_policies
    from ..streams.failures import failure
    from ..files.writer import check_output_folder, output_folder
    from ..streams.window.log import GYM_RUN, LOG_NAME
    from .. import errors

    inputs = (args.tokenizer, args.policy_yaml, args.manifest)
    output = check_output_folder(args.output, GYM_RUN, force=args.force, inputs=inputs,
                                 operator=errors.STREAMS_OPERATOR)  # fail before connecting
    edges = integer_list(args.bucket_edges, "--bucket-edges", None, None,  # the config checks them
                         fail=lambda message: failure(errors.GYM_CONFIG_INVALID, message))
    pack = (PackingConfig(max_length=args.pack_max_len, mode=args.pack_mode, separator_len=args.pack_separator_len)
            if args.pack else None)
    batching = BatchingConfig.throughput(args.token_budget, edges, args.overflow_max, pack=pack)
    tokenizer = load_tokenizer(args.tokenizer)
    config = GymConfig(host=args.host, port=args.port, games=tuple(args.game.split(",")),
                       difficulties=tuple(args.difficulty.split(",")), player=args.player, episodes=args.episodes,
                       max_steps=args.max_steps, seed=args.seed, output=args.output_mode, timeout=args.timeout)
    policy = load_policies(args.policy_yaml) if args.policy_yaml else None
    buffer = ReplayBuffer(args.buffer_size, args.eviction, manifest=args.manifest, seed=args.seed)
    stream = GymEpisodeStream(config, tokenizer, eos_token=args.eos_token)
    with output_folder(output, GYM_RUN, force=args.force, inputs=inputs, operator=errors.STREAMS_OPERATOR) as folder:
        summary = _play(args, stream, buffer, batching, policy, folder.join(LOG_NAME),
                        tokenizer_fingerprint(tokenizer), os.path.join(args.output, LOG_NAME))
        folder.write_bytes("run.json", json.dumps(summary, indent=2).encode("utf-8"))
    print(json.dumps(summary, indent=2))
    return 0


def _play(args, stream, buffer, batching, policy, log: str, tokenizer_hash: str, final_log: str) -> dict:
    """Play the episodes, building a window every ``--window-every`` episodes
    and after the last; the run's summary (run.json)."""
    from ..streams import RollingBatchPlanWindow

    window = RollingBatchPlanWindow(buffer, args.window_mbs, batching=batching, policy=policy,
                                    samples_per_window=args.samples_per_window, log=log,
                                    tokenizer_hash=tokenizer_hash)
    built, build_seconds = [], []
    started = time.perf_counter()

    def close_window() -> None:
        w = window.next_window()
        built.append(w)
        build_seconds.append(w.build_seconds)
        if not args.quiet:
            m = stream.metrics
            print(f"window {w.index}: {len(w.microbatches)} microbatches over {len(w.snapshot)} samples; "
                  f"episodes {m.episodes}/{args.episodes} ({m.episodes_per_s:.1f}/s), solved {m.solved}, "
                  f"hit rate {w.metrics['replay_hit_rate']:.2f}", file=sys.stderr)

    last_episode = 0
    for sample in stream:
        window.add(sample)
        if stream.metrics.episodes != last_episode:
            last_episode = stream.metrics.episodes
            if last_episode % args.window_every == 0:
                close_window()
    if buffer.pending:
        close_window()
    elapsed = time.perf_counter() - started
    return {
        "episodes": stream.metrics.to_dict(),
        "episodes_per_s": round(stream.metrics.episodes / elapsed, 3) if elapsed > 0 else None,
        "buffer": {"size": len(buffer), "max_size": buffer.max_size, "eviction": buffer.eviction.value,
                   "added": buffer.added},
        "windows": {"count": len(built), "microbatches": sum(len(w.microbatches) for w in built),
                    "mean_build_s": round(sum(build_seconds) / len(build_seconds), 6) if build_seconds else None,
                    "last_fingerprint": built[-1].fingerprint if built else None},
        "log": final_log,
    }


def run_replay(args) -> int:
    from ..streams import plot_curriculum, replay_log

    report = replay_log(args.log)
    print(f"replayed {report.windows} windows ({report.samples} samples, {report.microbatches} microbatches): "
          f"every snapshot, plan and window fingerprint equals the log's; last window {report.last_window_fingerprint}")
    if args.plot:
        print(f"plot: {plot_curriculum(args.log, args.plot)}")
    return 0
