"""File names shared by the writers of shard folders and run folders and every reader of them, and the
rule a shard's name follows (kept free of heavy imports, so configuration checks can use them)."""
from __future__ import annotations

import re

MANIFEST = "manifest.json"  # each shard folder's index: shard names, sizes, digests, what made it
EXPORT_FILE = "export.json"  # an export folder's description: its config, format, what it trained on
TRAINED_FILE = "trained.safetensors"  # an export folder's trained parameters
# A pipeline output's shard folders and indexes (a run's data.* settings name them).
CLIPS_DIR = "clips"
FEATURES_DIR = "features"
REPRESENTATIONS_DIR = "representations"
SESSION_SHARDS_DIR = "session_shards"
ADAPTATION_DIR = "adaptation"
SHOTS_FILE = "shots.json"  # beside the clip shards: each clip's shot
SESSIONS_FILE = "sessions.json"
# A training run's folder and an evaluation's.
RECORD_FILE = "run_config.json"  # the config and data digests a resume is checked against
# A CPU run's thread count, which its float sums depend on: a resume uses it again, so that it ends bitwise
# equal to an uninterrupted run.
CPU_THREADS_FILE = "cpu_threads.json"
LOSS_HISTORY = "loss_history.json"  # a run folder's [step, seconds, loss] rows, resumed attempts' included
EXPORT_DIR = "export"
METRICS_FILE = "metrics.json"
GAME_PAGE_FILE = "index.html"  # a played game's storyboard page, beside its clips
# game.json's record of the model preset a game was played with, and of its MLLM's window (the new turn included).
GAME_MODEL_KEY, GAME_WINDOW_KEY = "model", "window_turns"
SHARD_SUFFIX = ".tar"  # every shard set is tar files of webdataset records
SHARD_NAME_MAX = 255  # bytes in one file name on the usual file systems (and object-key segments)
# Letters, digits, '.', '_' and '-', starting with a letter or a digit: no separator, no scheme, no
# '..' part, no NUL, nothing a shell or an option parser reads; what the pipeline writes (shard-000000.tar).
SHARD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*" + re.escape(SHARD_SUFFIX))
SHARD_NAME_RULE = (f"a shard is named by a plain file name of its folder: letters, digits, '.', '_', '-', starting "
                   f"with a letter or digit, ending in {SHARD_SUFFIX} (as the pipeline writes them)")


def shard_name_problem(name: object) -> str | None:
    """None when ``name`` may name a shard in a manifest, else what is wrong with it.

    The one rule for every reader of a manifest: a shard is a plain file of the folder (or URL prefix)
    the manifest belongs to, so a name never escapes it (``..``, ``/``, an absolute path, another host)
    and never reaches a reader as a command or a scheme (``pipe:``, ``file:``, ``x://``).
    """
    if not isinstance(name, str):
        return f"not a string but {type(name).__name__}"
    checks = (
        (not name, "empty"),
        ("\0" in name, "holds a NUL character"),
        (len(name.encode()) > SHARD_NAME_MAX, f"longer than {SHARD_NAME_MAX} bytes"),
        (":" in name, "holds ':' (a URL or a scheme such as pipe: or file:, not a file name of the folder)"),
        ("/" in name or "\\" in name, "holds a path separator (a path, not a file name of the folder)"),
        (name in (".", ".."), "names a folder, not a file"),
        (not name.endswith(SHARD_SUFFIX), f"does not end in {SHARD_SUFFIX}"),
        (SHARD_NAME.fullmatch(name) is None, "holds characters other than letters, digits, '.', '_', '-', or "
                                             "starts with neither a letter nor a digit"),
    )
    return next((why for failed, why in checks if failed), None)
