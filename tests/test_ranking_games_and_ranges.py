"""``animegamer rank`` on runs whose games differ under one id (refused before anything is written or
served), and the byte ranges of a clip that a browser's player asks for (Safari plays nothing without them).
Evaluation folders are written by hand, with clips of known bytes: nothing is decoded or rendered."""
from __future__ import annotations

import http.client
import json
import threading
from pathlib import Path
from typing import Iterator, Optional
from urllib.parse import urlencode

import pytest

from animegamer.errors import InvalidInputError
from animegamer.ranking import RankingApp, RankingServer, load_runs
from animegamer.ranking.cli import main

CLIP = bytes(range(256)) * 4 + b"tail"  # 1028 known bytes: every slice is checkable
SIZE = len(CLIP)
STATES = {"ML": 2, "SC": 1, "ET": 0, "ST": -1}


def instruction(turn: int, motion: str = "walk") -> str:
    return f"Character: Qiqi; Motion: {motion} {turn}; Background: noon town."


def write_run(folder: Path, games: dict[str, list[str]], planned: Optional[dict[str, int]] = None) -> Path:
    """An evaluation folder: ``games`` maps a game id to the instructions of the turns it played;
    ``planned`` gives a game's benchmark turns where it stopped early (default: every turn played)."""
    records = []
    for gid, instructions in games.items():
        turns = []
        for number, text in enumerate(instructions):
            video = Path("games") / gid / f"turn_{number:03d}.mp4"
            (folder / video).parent.mkdir(parents=True, exist_ok=True)
            (folder / video).write_bytes(CLIP)
            turns.append({"instruction": text, "video": video.as_posix(), "states": STATES})
        count = (planned or {}).get(gid, len(turns))
        records.append({"id": gid, "turns": turns, "completed": len(turns), "planned": count,
                        **({"stopped": "a malformed generation"} if count > len(turns) else {})})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.json").write_text(json.dumps({"metrics": {}, "games": records}))
    return folder


def five(motion: str = "walk") -> list[str]:
    return [instruction(t, motion) for t in range(5)]


# --------------------------------------------------------------------------- one game id, other games
class NoServer:
    """Stands in for the server: a command that got this far would start serving the page."""

    def __init__(self, *args: object) -> None:
        raise AssertionError("the page was about to be served")


def test_a_game_with_other_turns_under_the_same_id_is_refused_naming_it_runs_and_counts(tmp_path, capsys,
                                                                                       monkeypatch):
    monkeypatch.setattr("animegamer.ranking.cli.RankingServer", NoServer)
    long = write_run(tmp_path / "long", {"g1": five(), "g2": five()})
    short = write_run(tmp_path / "short", {"g1": five()[:3], "g2": five()})
    out = tmp_path / "rankings"
    with pytest.raises(SystemExit) as exit_info:
        main(["--runs", str(long), str(short), "--out", str(out), "--port", "0"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err
    assert "1 game id(s)" in err and "game g1: " in err and "game g2" not in err
    assert f"long ({long / 'metrics.json'}) 5 turns" in err and f"short ({short / 'metrics.json'}) 3 turns" in err
    assert not out.exists()  # refused before the folder, its session or its report is written


def test_a_turn_with_another_instruction_is_refused_naming_the_turn_and_both_instructions(tmp_path, capsys):
    first = write_run(tmp_path / "first", {"g1": five()})
    other = five()
    other[3] = instruction(3, "jump")
    second = write_run(tmp_path / "second", {"g1": other})
    with pytest.raises(InvalidInputError, match="game g1: turn 4 has different instructions") as error:
        RankingApp(load_runs([first, second]), tmp_path / "rankings")
    assert "walk 3" in str(error.value) and "jump 3" in str(error.value)
    assert not (tmp_path / "rankings").exists()
    with pytest.raises(SystemExit) as exit_info:
        main(["--runs", str(first), str(second), "--out", str(tmp_path / "rankings"), "--report-only"])
    assert exit_info.value.code == 2 and "Traceback" not in capsys.readouterr().err
    assert not (tmp_path / "rankings").exists()


def test_a_game_one_run_stopped_early_is_the_same_game_and_every_turn_is_shown(tmp_path):
    """A run that stopped a game (played 2 of its 5 planned turns) ranks against one that played all 5:
    the page has a row, with its instruction, for every turn, even when the stopped run is listed first."""
    stopped = write_run(tmp_path / "stopped", {"g1": five()[:2]}, planned={"g1": 5})
    whole = write_run(tmp_path / "whole", {"g1": five()})
    app = RankingApp(load_runs([stopped, whole]), tmp_path / "rankings")
    assert app.games == ["g1"]
    page = app.page("alice", 0, "nonce")
    assert all(text in page for text in five())
    assert page.count("clip?") == 2 + 5


def test_games_one_run_did_not_play_are_still_left_out_with_a_warning(tmp_path, caplog):
    first = write_run(tmp_path / "first", {"g1": five(), "extra": five("run")})
    second = write_run(tmp_path / "second", {"g1": five()})
    with caplog.at_level("WARNING"):
        app = RankingApp(load_runs([first, second]), tmp_path / "rankings")
    assert app.games == ["g1"] and "left out: extra" in caplog.text


# --------------------------------------------------------------------------- byte ranges of a clip
@pytest.fixture(scope="module")
def serving(tmp_path_factory) -> Iterator[tuple[RankingServer, str]]:
    """A ranking server on a free port, and the address of one clip (with its rater's token)."""
    root = tmp_path_factory.mktemp("ranges")
    folders = [write_run(root / name, {"g1": five()[:2]}) for name in ("a", "b")]
    app = RankingApp(load_runs(folders), root / "rankings")
    server = RankingServer(app, port=0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    clip = "/clip?" + urlencode({"rater": "alice", "game": "g1", "column": "A", "turn": 0, "token": app.token("alice")})
    try:
        yield server, clip
    finally:
        server.shutdown()
        server.server_close()


def fetch(server: RankingServer, path: str, method: str = "GET", **headers: str) -> tuple[int, dict, bytes]:
    port = server.server_address[1]
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(method, path, headers={"Host": f"127.0.0.1:{port}", **headers})
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


@pytest.mark.parametrize("asked, first, last", [
    ("bytes=10-19", 10, 19),
    ("bytes=1000-", 1000, SIZE - 1),
    ("bytes=-4", SIZE - 4, SIZE - 1),
    ("bytes=0-0", 0, 0),
    ("bytes=0-99999999", 0, SIZE - 1),  # a last byte past the end: up to the end
    ("bytes=-5000", 0, SIZE - 1),  # a suffix longer than the file: all of it
])
def test_a_range_of_a_clip_gets_206_with_its_bytes(serving, asked, first, last):
    server, clip = serving
    status, headers, body = fetch(server, clip, Range=asked)
    assert status == 206, body
    assert headers["content-range"] == f"bytes {first}-{last}/{SIZE}" and headers["accept-ranges"] == "bytes"
    assert body == CLIP[first:last + 1] and headers["content-length"] == str(last - first + 1)
    assert headers["content-type"] == "video/mp4" and headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize("asked", [f"bytes={SIZE}-", f"bytes={SIZE + 5}-{SIZE + 9}", "bytes=-0"])
def test_a_range_past_the_end_gets_416(serving, asked):
    server, clip = serving
    status, headers, body = fetch(server, clip, Range=asked)
    assert status == 416 and headers["content-range"] == f"bytes */{SIZE}"
    assert "holds no byte" in json.loads(body)["error"]


@pytest.mark.parametrize("headers", [{}, {"Range": "bytes=0-1,5-6"}, {"Range": "items=0-1"}, {"Range": "bytes=9-3"},
                                     {"Range": "bytes=0-9", "If-Range": '"some-etag"'}])
def test_no_range_or_one_not_served_as_a_range_gets_the_whole_clip(serving, headers):
    server, clip = serving
    status, got, body = fetch(server, clip, **headers)
    assert status == 200 and got["accept-ranges"] == "bytes" and body == CLIP and "content-range" not in got


def test_head_of_a_range_gets_its_headers_without_a_body(serving):
    server, clip = serving
    status, headers, body = fetch(server, clip, "HEAD", Range="bytes=4-7")
    assert status == 206 and headers["content-range"] == f"bytes 4-7/{SIZE}" and body == b""


def test_a_range_asks_for_nothing_without_the_token_or_from_another_host(serving):
    server, clip = serving
    no_token = clip.split("&token=")[0]
    assert fetch(server, no_token, Range="bytes=0-9")[0] == 403
    assert fetch(server, clip, Range="bytes=0-9", Host="attacker.example:80")[0] == 403
    assert fetch(server, clip.replace("turn=0", "turn=7"), Range="bytes=0-9")[0] == 404
