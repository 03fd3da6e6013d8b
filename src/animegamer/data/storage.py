"""Where shard folders are read from: a local folder, or a URL (``s3://``, ``gs://``, ``https://``, any
fsspec protocol) read by range requests.

Every reader of a shard folder (the training datasets, the validation pass, the run record's data
digests, the held-out split) goes through :class:`ShardSource`. A local folder stays on plain
``open``: nothing changes there. For a URL:

- the shards are the ones the folder's ``manifest.json`` names (object stores and HTTP servers
  cannot be listed reliably, and the manifest is what the pipeline wrote anyway);
- a sample is one range request spanning its members; a tar index is built by reading the member
  headers only (:data:`HEADER_READAHEAD` bytes per request, never a whole shard) and kept in a local
  cache keyed by the shard's URL and version, so a resumed run, the validation split and every
  process on the machine reuse it instead of scanning again;
- a request that fails in a way that may pass (connection refused or reset, timeout, HTTP 5xx, 408,
  429) is sent again after a back-off, ``data.remote_retries`` times; then :class:`RemoteReadError`
  names the URL and the last failure. A file that is not there (404) is not retried.

A manifest names its shards; :meth:`ShardSource.shards` is the one way from a manifest to shard paths:
each name must pass :func:`animegamer.contracts.files.shard_name_problem` (a plain file name of the folder),
else :class:`ShardNameError` names the manifest and the entry. A shard read whole (:meth:`Shard.stream`)
is checked against the sha256 its manifest records.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, Mapping

from animegamer.config.schema import DEFAULT_RETRIES, DEFAULT_TIMEOUT_S
from animegamer.contracts.files import MANIFEST, SHARD_NAME_RULE, shard_name_problem
from animegamer.errors import InvalidInputError, UserError
from animegamer.utils.http import GenerationError, answer_with_retries
from animegamer.utils.io import read_json, write_json_atomic

log = logging.getLogger(__name__)

URL_MARK = "://"
HTTP_PROTOCOLS = ("http", "https")
S3_PROTOCOLS = ("s3", "s3a")
# Back-off before attempt k+1 is k times this: a busy or restarting server gets a few seconds.
REMOTE_BACKOFF_S = 0.5
# One tar header with the pax records webdataset writes is 1.5 KiB; 16 KiB also covers a small
# member (json) and the next header, so a clip sample's headers cost one request.
HEADER_READAHEAD = 16 * 1024
# A shard read from its start to its end (webdataset's streaming readers) asks for this much at a time.
STREAM_READAHEAD = 8 * 1024 * 1024
DIGEST_CHUNK = 1024 * 1024  # what is left of a shard after its tar end, hashed in reads of this size
INDEX_CACHE = ("animegamer", "shard-index")  # under $XDG_CACHE_HOME (default ~/.cache)
INDEX_CACHE_VERSION = 1
# info() fields that change when an object does (HTTP, S3, GCS, local spellings): a cached index is
# keyed on them with the size, so a shard rewritten in place is indexed again.
VERSION_FIELDS = ("ETag", "etag", "Last-Modified", "LastModified", "last_modified", "mtime", "updated",
                  "generation", "md5Hash", "Content-MD5")
RETRIED_STATUS = (408, 425, 429)  # plus every 5xx


class RemoteReadError(UserError):
    """A shard folder given as a URL could not be read after every retry (the message names the URL)."""


class ShardNameError(InvalidInputError):
    """A manifest names a shard by something other than a plain file name of its folder (the message names
    the manifest and the entry)."""


class ShardDigestError(InvalidInputError):
    """A shard's bytes differ from the sha256 its manifest records (the message names the shard)."""


@dataclass(frozen=True)
class RemoteSettings:
    """How URLs are read: ``retries`` after a failed request, each request at most ``timeout_s``."""

    retries: int = DEFAULT_RETRIES
    timeout_s: float = DEFAULT_TIMEOUT_S
    backoff_s: float = REMOTE_BACKOFF_S


def _field(data: Any, name: str, default: Any) -> Any:
    return data.get(name, default) if isinstance(data, Mapping) else getattr(data, name, default)


def remote_settings(data: Any) -> RemoteSettings:
    """The settings of a ``data`` config node (the typed one, or its resolved dict)."""
    return RemoteSettings(retries=int(_field(data, "remote_retries", DEFAULT_RETRIES)),
                          timeout_s=float(_field(data, "remote_timeout_s", DEFAULT_TIMEOUT_S)))


def check_remote_settings(data: Any) -> list[str]:
    settings, problems = remote_settings(data), []
    if settings.retries < 0:
        problems.append(f"data.remote_retries={settings.retries} must be >= 0")
    if settings.timeout_s <= 0:
        problems.append(f"data.remote_timeout_s={settings.timeout_s} must be > 0")
    return problems


def is_url(path: str | os.PathLike) -> bool:
    return URL_MARK in str(path)


def join(root: str | os.PathLike, *names: str) -> str:
    """``root/name/...`` for a folder or a URL; a name that is itself a URL or an absolute path replaces
    what comes before it, as in ``pathlib`` (``data.clips=/local/clips`` under a URL ``data.root``)."""
    path = str(root)
    for name in names:
        name = str(name)
        if is_url(name) or os.path.isabs(name):
            path = name
        elif is_url(path):
            path = path.rstrip("/") + "/" + name.strip("/")
        else:
            path = str(Path(path) / name)
    return path


def data_source(data: Any, folder: str) -> "ShardSource":
    """The shard folder ``data.<folder>`` under ``data.root`` (``folder``: the sub-folder's value)."""
    return ShardSource(join(_field(data, "root", ""), folder), remote_settings(data))


def transient(error: BaseException) -> bool:
    """Whether a failed request may succeed when sent again. fsspec's HTTP ``info`` reports every failure
    as FileNotFoundError from the real one, so the cause decides where there is one."""
    if isinstance(error, FileNotFoundError) and error.__cause__ is not None:
        return transient(error.__cause__)
    status = getattr(error, "status", None)
    if not isinstance(status, int):
        status = getattr(error, "code", None)
    if isinstance(status, int) and 100 <= status < 600:
        return status in RETRIED_STATUS or status >= 500
    if isinstance(error, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    if isinstance(error, OSError):  # refused or reset connections, time-outs (fsspec's FSTimeoutError too)
        return True
    try:
        import aiohttp
    except ImportError:  # fsspec's HTTP backend is the one that needs it
        return False
    return isinstance(error, aiohttp.ClientError)  # disconnects, payload errors


# One fsspec file system per (process, protocol, timeout), kept for the process's life. A forked child (a
# DataLoader worker) makes its own and never lets its parent's be garbage collected: closing them closes
# the parent's pooled connections, whose sockets the child shares, and unregisters those sockets from the
# epoll set the two processes' event loops also share, so the parent's next requests on them would hang
# until the timeout (measured: two 10 s time-outs after a loader with 2 workers).
_FILESYSTEMS: dict[tuple, Any] = {}
_FILESYSTEMS_LOCK = threading.Lock()


def _new_lock_in_child() -> None:
    global _FILESYSTEMS_LOCK
    _FILESYSTEMS_LOCK = threading.Lock()  # one held by another thread at the fork would never be released


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_in_child)


def remote_filesystem(protocol: str, timeout_s: float):
    """This process's file system for ``protocol`` with requests limited to ``timeout_s``."""
    key = (os.getpid(), protocol, timeout_s)
    with _FILESYSTEMS_LOCK:
        if key not in _FILESYSTEMS:
            import fsspec

            # skip_instance_cache: fsspec's own cache drops (and so closes) the parent's instances in a child.
            _FILESYSTEMS[key] = fsspec.filesystem(protocol, skip_instance_cache=True,
                                                  **_storage_options(protocol, timeout_s))
        return _FILESYSTEMS[key]


def _storage_options(protocol: str, timeout_s: float) -> dict:
    # A timeout <= 0 is refused by the validation pass, which still reads the manifest with it.
    timeout = timeout_s if timeout_s > 0 else DEFAULT_TIMEOUT_S
    if protocol in HTTP_PROTOCOLS:
        import aiohttp

        return {"client_kwargs": {"timeout": aiohttp.ClientTimeout(total=timeout)}}
    if protocol in S3_PROTOCOLS:  # botocore's Config; credentials come from the usual AWS variables
        return {"config_kwargs": {"connect_timeout": timeout, "read_timeout": timeout}}
    return {}  # other backends keep their own timeouts; failures are still retried here


def index_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).joinpath(*INDEX_CACHE)


class ShardSource:
    """One shard folder: its manifest, its shards, range reads of them (see the module's docstring).

    Picklable (DataLoader workers carry it): it holds no connection (see :func:`remote_filesystem`).
    """

    def __init__(self, folder: str | os.PathLike, settings: RemoteSettings = RemoteSettings()) -> None:
        self.remote = is_url(folder)
        self.folder = str(folder).rstrip("/") if self.remote else str(folder)
        self.settings = settings

    def __repr__(self) -> str:
        return f"ShardSource({self.folder!r})"

    def __str__(self) -> str:  # messages name the folder or URL
        return self.folder

    def path(self, name: str) -> str:
        return join(self.folder, name)

    # ------------------------------------------------------------------ the remote file system
    def _filesystem(self):
        protocol = self.folder.split(URL_MARK, 1)[0]
        try:
            return remote_filesystem(protocol, self.settings.timeout_s)
        except (ImportError, ValueError) as error:  # fsspec: backend not installed, or no such protocol
            raise RemoteReadError(f"{self.folder}: cannot read {protocol}{URL_MARK} URLs here: {error} "
                                  f"(pip install -e '.[remote]' adds s3:// and gs://)") from error

    def _retried(self, what: str, url: str, call: Callable[[], Any]) -> Any:
        """``call()`` with the retry rules; a failure that is not transient is raised as it is."""
        last: list[BaseException] = []

        def attempt(_feedback: str | None) -> Any:
            try:
                return call()
            except Exception as error:  # noqa: BLE001 - sorted into retried and raised ones just below
                if not transient(error):
                    raise
                last.append(error)
                raise GenerationError(f"{what}: {self._describe(error)}") from error

        # max(0, ...): the validation pass reads the manifest with the settings it is about to refuse.
        outcome = answer_with_retries(attempt, lambda value: value, max(0, self.settings.retries), f"reading {url}",
                                      self.settings.backoff_s)
        if outcome.ok:
            return outcome.value
        error = last[-1]
        raise RemoteReadError(
            f"{url}: {what} failed {outcome.attempts} times (data.remote_retries={self.settings.retries}, "
            f"data.remote_timeout_s={self.settings.timeout_s:g}); last error: {self._describe(error)}. "
            f"Check that the URL is right and the server or bucket is reachable from this machine (credentials: "
            f"the storage backend's usual environment)") from error

    def _describe(self, error: BaseException) -> str:
        name = type(error).__name__
        if isinstance(error, TimeoutError) or "Timeout" in name:  # fsspec's FSTimeoutError carries no text
            return f"{name}: no answer within {self.settings.timeout_s:g} s"
        return f"{name}: {error}" if str(error) else name

    def read_range(self, path: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of one file of the folder."""
        if not self.remote:
            with open(path, "rb") as f:
                f.seek(start)
                return f.read(end - start)
        data = self._retried(f"range request {start}-{end - 1}", path,
                             lambda: self._filesystem().cat_file(path, start=start, end=end))
        if len(data) != end - start:
            # A server that ignores Range sends the whole file (200): say so rather than read shards whole.
            raise RemoteReadError(f"{path}: asked for bytes {start}-{end - 1} ({end - start} bytes), got {len(data)}: "
                                  f"the server does not answer range requests, or the file changed")
        return data

    def read_bytes(self, name: str) -> bytes:
        """A whole small file of the folder (manifest, json indexes). FileNotFoundError when missing."""
        path = self.path(name)
        if not self.remote:
            return Path(path).read_bytes()
        return self._retried("download", path, lambda: self._filesystem().cat_file(path))

    def read_json(self, name: str) -> Any:
        if not self.remote:
            return read_json(self.path(name))
        return json.loads(self.read_bytes(name))

    def read_json_if_exists(self, name: str) -> Any:
        """:meth:`read_json`, or None where there is no such file (a URL that answers 404)."""
        try:
            return self.read_json(name)
        except FileNotFoundError:
            return None

    def info(self, path: str) -> dict:
        """Size and version fields of one remote file (``fsspec``'s ``info``)."""
        return self._retried("info", path, lambda: self._filesystem().info(path))

    def size(self, path: str, info: Mapping | None = None) -> int:
        """A remote file's size (from ``info`` when given): range reads stop there."""
        size = (self.info(path) if info is None else info).get("size")
        if size is None:
            raise RemoteReadError(f"{path}: the server gives no size for it (no Content-Length), so it cannot be "
                                  f"read by ranges")
        return int(size)

    # ------------------------------------------------------------------ the folder's contents
    def manifest(self) -> dict:
        try:
            return self.read_json(MANIFEST)
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.path(MANIFEST)}: no manifest; is {self.folder} a shard folder written "
                                    f"by the pipeline?") from None

    def manifest_problem(self) -> str | None:
        """None when the manifest reads as a json object; else what is wrong, naming it."""
        where = self.path(MANIFEST)
        try:
            manifest = self.read_json(MANIFEST)
        except FileNotFoundError:
            if self.remote:
                return f"{where}: missing (no such file there: is the URL right, and was the folder uploaded whole?)"
            return f"{where}: missing"
        except RemoteReadError as error:
            return str(error)
        except (OSError, ValueError) as error:
            return f"{where}: unreadable ({type(error).__name__}: {error})"
        if not isinstance(manifest, dict):
            return f"{where}: not a json object"
        # A manifest without a shard list is no shard folder's; the readers that need one say so.
        return self.shards_problem(manifest) if "shards" in manifest else None

    def shards(self, manifest: Mapping | None = None) -> list["Shard"]:
        """Every shard the folder's manifest names (``manifest``: that manifest, already read), in its order.

        Raises :class:`ShardNameError` naming the manifest and the entry where a name is not a plain file
        name of this folder (:func:`~animegamer.contracts.files.shard_name_problem`): nothing a manifest holds
        reaches a reader as a path elsewhere, a URL or a command."""
        where = self.path(MANIFEST)
        manifest = self.manifest() if manifest is None else manifest
        entries = manifest.get("shards") if isinstance(manifest, Mapping) else None
        if not isinstance(entries, list):
            raise InvalidInputError(f"{where}: no list of shards ('shards'); is {self.folder} a shard folder "
                                    f"written by the pipeline?")
        shards = []
        for number, entry in enumerate(entries):
            name = entry.get("name") if isinstance(entry, Mapping) else None
            why = "not an object with a 'name'" if name is None else shard_name_problem(name)
            if why is not None:
                shown = name if name is not None else entry
                raise ShardNameError(f"{where}: shards[{number}] {shown!r}: {why}; {SHARD_NAME_RULE}. Refused: "
                                     f"rewrite the manifest with the pipeline step that made the folder")
            shards.append(Shard(self, self._shard_path(name), dict(entry)))
        return shards

    def shards_problem(self, manifest: Mapping) -> str | None:
        """None when every shard of ``manifest`` (this folder's) is named as :meth:`shards` requires."""
        try:
            self.shards(manifest)
        except InvalidInputError as error:
            return str(error)
        return None

    def _shard_path(self, name: str) -> str:
        """The path of a checked shard name inside this folder (or under this URL prefix)."""
        return f"{self.folder}/{name}" if self.remote else str(Path(self.folder) / name)

    @contextmanager
    def open(self, path: str, readahead: int = HEADER_READAHEAD) -> Iterator[BinaryIO]:
        """A seekable binary file over one shard (``tarfile.open(fileobj=...)`` reads through it); a remote
        one reads ``readahead`` bytes per request (default :data:`HEADER_READAHEAD`: tar headers)."""
        if not self.remote:
            with open(path, "rb") as f:
                yield f
            return
        yield RangeReader(self, path, self.size(path), readahead)

    def cached(self, path: str, entry: Mapping, build: Callable[[BinaryIO], Any]) -> Any:
        """``build(file)`` of one shard: for a URL computed once per shard version and kept in the local
        cache (``entry``: the shard's manifest entry, whose sha256 names the version without a request).
        ``build``'s result must be json."""
        if not self.remote:
            with self.open(path) as f:
                return build(f)
        info = None if entry.get("sha256") else self.info(path)
        version = (f"sha256={entry['sha256']}" if info is None else
                   f"size={info.get('size')};" + ";".join(f"{k}={info[k]}" for k in VERSION_FIELDS if info.get(k)))
        key = hashlib.sha256(f"{INDEX_CACHE_VERSION}\n{path}\n{version}".encode()).hexdigest()
        file = index_cache_dir() / f"{key}.json"
        try:
            cached = read_json(file)
            if cached.get("url") == path and cached.get("version") == version:
                return cached["value"]
        except FileNotFoundError:
            pass
        except (OSError, ValueError, AttributeError, KeyError) as error:
            log.warning("%s: unreadable index cache for %s (%s); indexing again", file, path, error)
        size = self.size(path, info)
        value = build(RangeReader(self, path, size))
        write_json_atomic(file, {"url": path, "version": version, "value": value})
        log.info("indexed %s (%d bytes) by its headers; cached in %s", path, size, file)
        return value


@dataclass(frozen=True)
class Shard:
    """One shard of a folder: its ``path`` (a local path or a URL) and its manifest ``entry`` (name,
    count, sha256). Made by :meth:`ShardSource.shards`, which checks the name; :meth:`at` wraps a path
    the caller chose itself (a file it wrote), which no manifest named."""

    source: ShardSource
    path: str
    entry: Mapping = field(default_factory=dict, compare=False)

    @classmethod
    def at(cls, path: str | os.PathLike, settings: RemoteSettings = RemoteSettings()) -> "Shard":
        path = str(path)
        folder = path.rsplit("/", 1)[0] if is_url(path) else os.path.dirname(path)
        return cls(ShardSource(folder, settings), path)

    def __str__(self) -> str:  # messages name the shard's path or URL
        return self.path

    @property
    def name(self) -> str:
        return str(self.entry.get("name") or self.path.rsplit("/", 1)[-1])

    @property
    def sha256(self) -> str | None:
        return self.entry.get("sha256")

    @contextmanager
    def stream(self) -> Iterator[BinaryIO]:
        """The shard as a file read once from its start to its end (a remote one by requests of
        :data:`STREAM_READAHEAD` bytes). Where the manifest records a sha256, the bytes are hashed as they
        are read, and a block that ends normally reads what is left and checks the digest
        (:class:`ShardDigestError` naming the shard); a block left early (an error, a reader that stopped
        before the end) checks nothing."""
        with self.source.open(self.path, STREAM_READAHEAD) as raw:
            if not self.sha256:
                yield raw
                return
            reader = DigestReader(raw, self.path)
            yield reader
            found = reader.hexdigest()
            if found != self.sha256:
                raise ShardDigestError(
                    f"{self.path}: its sha256 is {found}, but {self.source.path(MANIFEST)} records {self.sha256}: the "
                    f"shard changed or was damaged after the manifest was written (run the pipeline step that "
                    f"wrote it again)")


class DigestReader:
    """A file read front to back whose bytes are hashed on the way (tar readers read through it)."""

    def __init__(self, raw: BinaryIO, name: str) -> None:
        self.raw, self.name = raw, name
        self._hash = hashlib.sha256()

    def __repr__(self) -> str:  # webdataset names the stream in its error messages
        return f"DigestReader({self.name!r})"

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self._hash.update(data)
        return data

    def hexdigest(self) -> str:
        """The sha256 of the whole file: what was not read yet is read now."""
        while self.read(DIGEST_CHUNK):
            pass
        return self._hash.hexdigest()


class RangeReader:
    """A read-only seekable file over a remote file: each read outside the current window fetches
    ``max(n, readahead)`` bytes from the position (tar headers are read through it by
    :data:`HEADER_READAHEAD`, never the members they describe; a whole shard by :data:`STREAM_READAHEAD`)."""

    def __init__(self, source: ShardSource, path: str, size: int, readahead: int = HEADER_READAHEAD) -> None:
        self.source, self.name, self.size, self.readahead = source, path, size, readahead
        self.mode = "rb"
        self._position = 0
        self._window_start, self._window = 0, b""

    def __enter__(self) -> "RangeReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._window = b""

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._position, os.SEEK_END: self.size}[whence]
        self._position = max(0, base + offset)
        return self._position

    def read(self, n: int = -1) -> bytes:
        end = self.size if n is None or n < 0 else min(self.size, self._position + n)
        if end <= self._position:
            return b""
        window_end = self._window_start + len(self._window)
        if not (self._window_start <= self._position and end <= window_end):
            self._window_start = self._position
            self._window = self.source.read_range(self.name, self._position,
                                                  min(self.size, max(end, self._position + self.readahead)))
        data = self._window[self._position - self._window_start: end - self._window_start]
        self._position = end
        return data
