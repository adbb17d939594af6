"""The puzzle-server client: framing, and every failure a server can cause
(a close, a stall, malformed lines), against fake servers on 127.0.0.1; and
reconnects through a relay that breaks one connection of the real server,
losing and repeating no sample."""

from __future__ import annotations

import pytest

from umlos_cuda import errors
from umlos_cuda.streams import GymConfig, GymEpisodeStream, TelnetGymClient
from umlos_cuda.streams.gym.telnet_wire import IAC, NOP, SB, SE, WILL, TelnetLines, TelnetStripper, answer_of
from streams_support import EOS, TcpServer, expect, puzzle_server, relay, scripted, tokenizer



# ------------------------------------------------------------------ framing
def test_stripper_removes_telnet_commands_split_across_chunks():
    data = bytes([IAC, WILL, 1]) + b"ab" + bytes([IAC, SB, 24, 1, IAC, SE]) + b"c" + bytes([IAC, IAC, IAC, NOP]) + b"d"
    whole = TelnetStripper().feed(data)
    assert whole == b"abc\xffd"
    stripper = TelnetStripper()
    assert b"".join(stripper.feed(data[i:i + 1]) for i in range(len(data))) == whole  # byte by byte


def test_answer_is_what_follows_the_echo():
    lines = ["Unknown command 'zzsync3'.", "> show", '{"type":"x"}', "", "> "]
    assert answer_of(lines, "show") == ['{"type":"x"}']
    assert answer_of(["menu line", "  1) A - b"], None) == ["menu line", "  1) A - b"]
    expect(errors.GYM_PROTOCOL_ERROR, answer_of, ["no echo here"], "show", mention="did not echo")


def test_a_command_is_one_printable_line():
    replies = {}
    with TcpServer(scripted(replies)) as server, TelnetLines("127.0.0.1", server.port, timeout=5) as lines:
        expect(errors.GYM_CONFIG_INVALID, lines.exchange, "place 1 1 1\nquit")


# ------------------------------------------------------------------ failures
def test_refused_connection():
    with TcpServer(scripted({})) as server:
        port = server.port
    expect(errors.GYM_CONNECTION_FAILED, TelnetGymClient, host="127.0.0.1", port=port, timeout=2,
           mention="cannot connect")


@pytest.mark.parametrize("replies,code,mention", [
    ({"<greeting>": b"<close>"}, errors.GYM_CONNECTION_FAILED, "closed the connection"),
    ({"zzsync1": b"<close>"}, errors.GYM_CONNECTION_FAILED, "closed the connection"),
    ({"<greeting>": b"<stall>"}, errors.GYM_TIMEOUT, "sent no complete answer"),
    ({"zzsync1": b"<stall>"}, errors.GYM_TIMEOUT, "sent no complete answer"),
    ({"<greeting>": b"menu \xc3\x28 broken\r\n"}, errors.GYM_PROTOCOL_ERROR, "not UTF-8"),
    ({"<greeting>": b"x" * (1 << 20) + b"y\r\n"}, errors.GYM_PROTOCOL_ERROR, "bytes"),
    ({"<greeting>": b"no games here\r\n"}, errors.GYM_PROTOCOL_ERROR, "lists no game"),
])
def test_a_misbehaving_server_raises_its_code(replies, code, mention):
    with TcpServer(scripted(replies)) as server:
        timeout = 0.5 if code == errors.GYM_TIMEOUT else 10  # only a stall may wait out its timeout
        expect(code, TelnetGymClient, host="127.0.0.1", port=server.port, timeout=timeout, mention=mention)


GAME = {"1 ?": b"Invalid difficulty. Choose from: easy, hard\r\nSeed: 9\r\n", "menu": b"\r\n",
        "1 easy 5": b"SUDOKU - EASY MODE\r\nSeed: 5\r\nrules\r\n", "mode json": b'{"type":"mode"}\r\n'}


@pytest.mark.parametrize("show,mention", [
    (b'{"type": "observation", "game": \r\n', "does not decode"),
    (b'{"game": "Sudoku"}\r\n', "without a 'type'"),
    (b'{"type": "observation", "game": "Sudoku"}\r\n', "lacks"),
])
def test_a_malformed_observation_is_a_protocol_error(show, mention):
    with (TcpServer(scripted({**GAME, "show": show})) as server,
          TelnetGymClient(host="127.0.0.1", port=server.port, timeout=10) as client):
        assert [g.name for g in client.games()] == ["Sudoku"]
        assert client.difficulties() == ("easy", "hard")
        expect(errors.GYM_PROTOCOL_ERROR, client.start, "sudoku", "easy", 5, mention=mention)


def test_an_unknown_difficulty_or_game_is_refused_before_the_server_falls_back():
    with (TcpServer(scripted(GAME)) as server,
          TelnetGymClient(host="127.0.0.1", port=server.port, timeout=10) as client):
        expect(errors.GYM_CONFIG_INVALID, client.start, "sudoku", "medium", 5, mention="easy, hard")
        expect(errors.GYM_CONFIG_INVALID, client.start, "chess", "easy", 5, mention="Sudoku")
        expect(errors.GYM_CONFIG_INVALID, client.start, "sudoku", "easy", -1, mention="puzzle seed")


def test_the_stream_gives_up_after_its_reconnect_budget():
    waits = []
    with TcpServer(scripted({"<greeting>": b"<close>"})) as server:
        config = GymConfig(port=server.port, episodes=2, max_reconnects=3, backoff_s=0.25, backoff_max_s=0.5,
                           timeout=1)
        stream = GymEpisodeStream(config, tokenizer(), eos_token=EOS, sleep=waits.append)
        expect(errors.GYM_CONNECTION_FAILED, list, stream, mention="gave up after 3 reconnects")
        assert server.connections == 4
    assert waits == [0.25, 0.5, 0.5]  # exponential backoff, capped
    assert stream.metrics.episodes == 0 and stream.state_dict() == {"next_episode": 0, "next_seq": 0}


def test_a_protocol_error_is_not_retried():
    with TcpServer(scripted({"<greeting>": b"\xff\xfb\x01garbage \xc3\x28\r\n"})) as server:
        stream = GymEpisodeStream(GymConfig(port=server.port, episodes=1, timeout=10), tokenizer(), eos_token=EOS,
                                  sleep=lambda s: None)
        expect(errors.GYM_PROTOCOL_ERROR, list, stream)
        assert server.connections == 1


# ------------------------------------------------------------------ reconnects with the real server
def run_stream(port, **overrides):
    config = GymConfig(port=port, games=("sudoku", "lights", "knapsack"), difficulties=("easy",), episodes=6, seed=4,
                       name="gym", timeout=overrides.pop("timeout", 10), **overrides)
    stream = GymEpisodeStream(config, tokenizer(), eos_token=EOS, sleep=lambda s: None)
    return list(stream), stream


@pytest.mark.parametrize("mode,after", [("close", 3000), ("close", 40000), ("stall", 20000)])
def test_a_broken_connection_loses_and_repeats_no_sample(tmp_path, mode, after):
    with puzzle_server(tmp_path) as (host, port):
        reference, _ = run_stream(port)
        with TcpServer(relay((host, port), break_connection=0, after_bytes=after, mode=mode)) as broken:
            samples, stream = run_stream(broken.port, timeout=2 if mode == "stall" else 10)
            assert broken.connections == 2
    assert stream.metrics.reconnects == 1
    assert [s.episode_id for s in samples] == [s.episode_id for s in reference]  # none lost, none repeated
    assert [s.seq for s in samples] == list(range(6))
    assert [s.digest for s in samples] == [s.digest for s in reference]  # the same puzzles, moves and tokens


@pytest.mark.parametrize("number", ["9" * 5000, "\u0663", "4294967296"], ids=["5000 digits", "Arabic-Indic 3", "2^32"])
def test_a_menu_number_the_one_parser_refuses_is_the_servers_protocol_error(number):
    """A menu line's number is read by checks.integer_text: 5000 digits tripped int()'s limit as a traceback,
    an Arabic-Indic digit read as 3; each is GYM_PROTOCOL_ERROR, and a plain menu still parses."""
    from umlos_cuda.streams.gym.telnet_client import parse_menu

    assert [g.number for g in parse_menu(["  1) Sudoku - numbers", " 12) Lights Out - toggles"])] == [1, 12]
    expect(errors.GYM_PROTOCOL_ERROR, parse_menu, [f"  {number}) Sudoku - numbers"], mention="numbered")
