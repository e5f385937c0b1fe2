"""Models by name against a local hub: a small HTTP server with the Hugging Face Hub's URL layout serves
the demo model's folder, HF_ENDPOINT points huggingface_hub at it, and the real client library does the
download, the resume and the cache. Each `mnngpu` runs as its own process, as a user runs it, because
huggingface_hub reads HF_ENDPOINT, HF_HOME and HF_HUB_OFFLINE once, when it is imported."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from mnngpu.demo import demo_model_dir

DEMO = {path.name: path.read_bytes() for path in demo_model_dir().iterdir() if path.is_file()}
EXTRAS = {"README.md": b"# a model card\n", "model.safetensors": b"\0" * 4096}   # on the Hub, not needed to run
WEIGHT = "llm.mnn.weight"
# huggingface_hub writes a download in chunks of this many bytes, and resumes after the last one written;
# a file three chunks long, cut off halfway, has one written
CHUNK = 10 * 1024 * 1024
LORA = {"lora.mnn": bytes(range(256)) * (3 * CHUNK // 256)}


def commit_of(repo: str) -> str:
    return hashlib.sha1(repo.encode()).hexdigest()


class LocalHub(ThreadingHTTPServer):
    """The Hub's routes huggingface_hub's snapshot_download asks for, over a dict of repos {id: {file: bytes}}."""

    daemon_threads = True

    def __init__(self, repos: dict[str, dict[str, bytes]]):
        super().__init__(("127.0.0.1", 0), HubHandler)
        self.repos = repos
        self.requests: list[tuple[str, str, str | None]] = []   # (method, path, Range header)
        self.cut_once: set[tuple[str, str]] = set()              # (repo, file): the first GET stops halfway
        self.gone: set[tuple[str, str]] = set()                  # (repo, file): listed, but answers 404

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def file_gets(self, file: str) -> list[str | None]:
        """The Range header of each GET of `file`, in order."""
        return [ranged for method, path, ranged in self.requests if method == "GET" and path.endswith("/" + file)]


class HubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: LocalHub

    def log_message(self, *args) -> None:
        pass

    def do_HEAD(self) -> None:
        self.answer(send_body=False)

    def do_GET(self) -> None:
        self.answer(send_body=True)

    def answer(self, send_body: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        self.server.requests.append((self.command, path, self.headers.get("Range")))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] in ("revision", "tree"):
            return self.api(f"{parts[2]}/{parts[3]}", parts[4], parts[5])
        if len(parts) >= 5 and parts[2] == "resolve":
            return self.resolve(f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]), send_body)
        self.reply(404, b"{}", {"X-Error-Code": "EntryNotFound"})

    def api(self, repo: str, route: str, revision: str) -> None:
        files = self.known(repo, revision)
        if files is None:
            return
        if route == "revision":
            siblings = [{"rfilename": name, "size": len(data)} for name, data in files.items()]
            body = {"id": repo, "modelId": repo, "sha": commit_of(repo), "private": False, "siblings": siblings}
        else:
            body = [{"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                    for name, data in files.items()]
        self.reply(200, json.dumps(body).encode(), {"Content-Type": "application/json"})

    def resolve(self, repo: str, revision: str, name: str, send_body: bool) -> None:
        files = self.known(repo, revision)
        if files is None:
            return
        commit = {"X-Repo-Commit": commit_of(repo)}
        if name not in files or (repo, name) in self.server.gone:
            return self.reply(404, b"{}", {**commit, "X-Error-Code": "EntryNotFound"})
        data = files[name]
        headers = {**commit, "ETag": f'"{hashlib.sha256(data).hexdigest()}"', "Accept-Ranges": "bytes"}
        start = int(self.headers["Range"].removeprefix("bytes=").split("-")[0]) if self.headers["Range"] else 0
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        if not send_body:
            return self.reply(200, b"", {**headers, "Content-Length": str(len(data))}, send_body=False)
        if (repo, name) in self.server.cut_once:
            self.server.cut_once.discard((repo, name))
            return self.cut(data, headers)
        self.reply(206 if start else 200, data[start:], headers)

    def cut(self, data: bytes, headers: dict) -> None:
        """Promise the whole file, send half of it, and drop the connection."""
        self.send_response(200)
        for key, value in {**headers, "Content-Length": str(len(data))}.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data[: len(data) // 2])
        self.wfile.flush()
        self.close_connection = True

    def known(self, repo: str, revision: str) -> dict[str, bytes] | None:
        if repo not in self.server.repos:
            self.reply(404, b"{}", {"X-Error-Code": "RepoNotFound"})
            return None
        if revision not in ("main", commit_of(repo)):
            self.reply(404, b"{}", {"X-Error-Code": "RevisionNotFound"})
            return None
        return self.server.repos[repo]

    def reply(self, status: int, body: bytes, headers: dict, send_body: bool = True) -> None:
        self.send_response(status)
        headers = {"Content-Length": str(len(body)), **headers}
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if send_body and self.command != "HEAD":
            self.wfile.write(body)


@pytest.fixture
def hub():
    repos = {
        "mnn-test/demo": {**DEMO, **EXTRAS},
        "mnn-test/lora": {**DEMO, **LORA},
        "mnn-test/no-tokenizer": {name: data for name, data in DEMO.items() if name != "tokenizer.mtok"},
        "mnn-test/transformers": {"config.json": b'{"model_type": "qwen2"}', **EXTRAS},
    }
    server = LocalHub(repos)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def hf_home(tmp_path):
    return tmp_path / "hf"


def hub_env(hub: LocalHub, hf_home: Path, offline: bool = False) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("HF_", "HUGGING"))}
    env.update(HF_ENDPOINT=hub.url, HF_HOME=str(hf_home), HF_HUB_DISABLE_TELEMETRY="1",
               HF_HUB_DISABLE_UPDATE_CHECK="1", MNNGPU_BACKGROUND_COMPILE="0")
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return env


def mnngpu(hub: LocalHub, hf_home: Path, *args: str, offline: bool = False, cwd: Path | None = None,
           stdin: str | None = None):
    return subprocess.run([sys.executable, "-m", "mnngpu", *args], check=False, capture_output=True, text=True,
                          input=stdin, env=hub_env(hub, hf_home, offline), cwd=cwd, timeout=120)


def repo_folder(hf_home: Path, repo: str) -> Path:
    return hf_home / "hub" / ("models--" + repo.replace("/", "--"))


def reply(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout


def run(model: str) -> tuple[str, ...]:
    """`mnngpu run MODEL`'s arguments for a short greedy reply."""
    return ("run", model, "-n", "4", "-p", "hi", "--sampler", "greedy")


def test_run_by_name_downloads_what_mnn_needs_and_replies_as_the_local_folder(hub, hf_home):
    local = reply(mnngpu(hub, hf_home, *run(str(demo_model_dir()))))
    first = mnngpu(hub, hf_home, *run("mnn-test/demo"))
    assert reply(first) == local and local.strip()
    assert "fetching mnn-test/demo" in first.stderr
    snapshot = repo_folder(hf_home, "mnn-test/demo") / "snapshots" / commit_of("mnn-test/demo")
    assert sorted(path.name for path in snapshot.iterdir()) == sorted(DEMO)    # no README, no safetensors
    for name, data in DEMO.items():
        assert (snapshot / name).read_bytes() == data

    hub.requests.clear()
    again = mnngpu(hub, hf_home, *run("mnn-test/demo"))
    assert reply(again) == local and "fetching" not in again.stderr
    assert not [path for method, path, _ in hub.requests if method == "GET" and "/resolve/" in path]

    hub.requests.clear()
    assert reply(mnngpu(hub, hf_home, *run("mnn-test/demo"), offline=True)) == local
    assert hub.requests == []


def test_a_download_cut_off_midway_resumes_where_it_stopped(hub, hf_home):
    from huggingface_hub import constants

    assert constants.DOWNLOAD_CHUNK_SIZE == CHUNK
    hub.cut_once.add(("mnn-test/lora", "lora.mnn"))
    done = mnngpu(hub, hf_home, "pull", "mnn-test/lora")
    assert done.returncode == 0, done.stderr
    assert hub.file_gets("lora.mnn") == [None, f"bytes={CHUNK}-"]   # the second asks only for the rest
    snapshot = repo_folder(hf_home, "mnn-test/lora") / "snapshots" / commit_of("mnn-test/lora")
    assert (snapshot / "lora.mnn").read_bytes() == LORA["lora.mnn"]
    assert done.stdout == f"{snapshot}\n"


def test_a_terminal_shows_huggingface_hubs_progress_bars(hub, hf_home):
    import fcntl
    import pty
    import struct
    import termios

    env = hub_env(hub, hf_home)
    pid, terminal = pty.fork()
    if pid == 0:   # the child: a 100-column terminal, as a user's (a new pty has none, and tqdm draws nothing)
        try:
            fcntl.ioctl(1, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
            os.execve(sys.executable, [sys.executable, "-m", "mnngpu", "pull", "mnn-test/demo"], env)
        finally:
            os._exit(127)   # never back into pytest
    shown = b""
    while chunk := _read_or_end(terminal):
        shown += chunk
    os.close(terminal)
    os.waitpid(pid, 0)
    assert re.search(r"Fetching 6 files: 100%\|█+\| 6/6", shown.decode(errors="replace"))


def _read_or_end(terminal: int) -> bytes:
    try:
        return os.read(terminal, 65536)
    except OSError:   # the child closed the terminal
        return b""


def test_a_repo_without_the_tokenizer_its_config_names_is_refused_before_any_download(hub, hf_home):
    done = mnngpu(hub, hf_home, *run("mnn-test/no-tokenizer"))
    assert done.returncode == 2
    assert done.stderr.startswith("error: model: 'mnn-test/no-tokenizer' is not an MNN model folder: the repo has "
                                  "no tokenizer.mtok") and done.stderr.count("\n") == 1
    assert not hub.file_gets(WEIGHT) and not (repo_folder(hf_home, "mnn-test/no-tokenizer") / "snapshots").exists()


def test_a_file_the_repo_lists_but_does_not_serve_leaves_nothing_that_runs(hub, hf_home):
    hub.gone.add(("mnn-test/demo", WEIGHT))
    done = mnngpu(hub, hf_home, "pull", "mnn-test/demo")
    assert done.returncode == 2 and done.stderr.splitlines()[-1] == (
        f"error: model: 'mnn-test/demo': the repo lists {WEIGHT}, but the server answered 404 for it; the files "
        "fetched so far stay in the cache, and a later run fetches the rest")
    offline = mnngpu(hub, hf_home, *run("mnn-test/demo"), offline=True)
    assert offline.returncode == 2 and "the cached copy of 'mnn-test/demo' is incomplete" in offline.stderr
    listed = mnngpu(hub, hf_home, "list")
    assert re.search(rf"^mnn-test/demo .*\(missing .*{WEIGHT}.*\)$", listed.stdout, re.MULTILINE)

    hub.gone.clear()   # the Hub serves it again: the next run fetches only what is missing
    hub.requests.clear()
    assert reply(mnngpu(hub, hf_home, *run("mnn-test/demo"))).strip()
    assert [path.rsplit("/", 1)[1] for method, path, _ in hub.requests if method == "GET" and "/resolve/" in path
            and not path.endswith(".json")] == [WEIGHT]


def test_a_repo_that_is_not_an_mnn_folder_is_one_clear_error_and_downloads_nothing(hub, hf_home):
    done = mnngpu(hub, hf_home, *run("mnn-test/transformers"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "'mnn-test/transformers' is not an MNN model folder: the repo has no llm.mnn, llm.mnn.weight, " \
           "tokenizer.txt" in done.stderr
    assert not (repo_folder(hf_home, "mnn-test/transformers") / "snapshots").exists()


def test_unknown_repo_revision_and_offline_without_a_cached_copy(hub, hf_home):
    unknown = mnngpu(hub, hf_home, "pull", "mnn-test/absent")
    assert unknown.returncode == 2 and f"{hub.url} has no model repo of that name" in unknown.stderr
    revision = mnngpu(hub, hf_home, "pull", "mnn-test/demo@v9")
    assert revision.returncode == 2 and "'mnn-test/demo' has no revision 'v9'" in revision.stderr
    hub.requests.clear()
    offline = mnngpu(hub, hf_home, *run("mnn-test/demo"), offline=True)
    assert offline.returncode == 2 and "'mnn-test/demo' is not in the cache" in offline.stderr
    assert "HF_HUB_OFFLINE is set" in offline.stderr and hub.requests == []


def test_list_shows_and_rm_removes_a_cached_model(hub, hf_home):
    assert mnngpu(hub, hf_home, "list").stdout.startswith("no MNN models in the cache")
    other = "from huggingface_hub import snapshot_download; snapshot_download('mnn-test/transformers')"
    subprocess.run([sys.executable, "-c", other], check=True, env=hub_env(hub, hf_home), timeout=120)
    assert (repo_folder(hf_home, "mnn-test/transformers") / "snapshots").is_dir()   # not an MNN model: not listed
    assert mnngpu(hub, hf_home, "list").stdout.startswith("no MNN models in the cache")
    assert mnngpu(hub, hf_home, "pull", f"mnn-test/demo@{commit_of('mnn-test/demo')}").returncode == 0
    assert mnngpu(hub, hf_home, "pull", "mnn-test/demo").returncode == 0
    lines = mnngpu(hub, hf_home, "list").stdout.splitlines()
    snapshot = repo_folder(hf_home, "mnn-test/demo") / "snapshots" / commit_of("mnn-test/demo")
    size = sum(len(data) for data in DEMO.values())
    assert [re.split(r"\s{2,}", line) for line in lines] == [
        ["MODEL", "REVISION", "SIZE", "PATH"], ["mnn-test/demo", "main", f"{size / 1e6:.1f} MB", str(snapshot)]]

    removed = mnngpu(hub, hf_home, "rm", "mnn-test/demo")
    assert removed.returncode == 0, removed.stderr
    assert f"removed mnn-test/demo ({commit_of('mnn-test/demo')[:12]}), {size / 1e6:.1f} MB freed" in removed.stdout
    assert not repo_folder(hf_home, "mnn-test/demo").exists()
    assert mnngpu(hub, hf_home, "list").stdout.startswith("no MNN models in the cache")
    again = mnngpu(hub, hf_home, "rm", "mnn-test/demo")
    assert again.returncode == 2 and "'mnn-test/demo' is not in the cache" in again.stderr


def test_chat_inspect_and_serve_take_a_repo_id_and_serve_names_the_model_by_it(hub, hf_home):
    snapshot = repo_folder(hf_home, "mnn-test/demo") / "snapshots" / commit_of("mnn-test/demo")
    pulled = mnngpu(hub, hf_home, "pull", "mnn-test/demo")
    assert pulled.stdout == f"{snapshot}\n" and pulled.stderr.startswith("fetching mnn-test/demo (")
    assert pulled.stderr.count("\n") == 1   # no progress bars in a pipe
    assert json.loads(reply(mnngpu(hub, hf_home, "inspect", "--json", "mnn-test/demo")))["path"] == str(snapshot)
    chat = ("chat", "-n", "4", "--sampler", "greedy")
    assert reply(mnngpu(hub, hf_home, *chat, "mnn-test/demo", stdin="hi\n")) == reply(
        mnngpu(hub, hf_home, *chat, str(demo_model_dir()), stdin="hi\n"))

    server = subprocess.Popen([sys.executable, "-m", "mnngpu", "serve", "mnn-test/demo", "--port", "0"],
                              stderr=subprocess.PIPE, text=True, env=hub_env(hub, hf_home, offline=True))
    try:
        line = next(line for line in server.stderr if line.startswith(("serving ", "error")))
        assert line.startswith("serving mnn-test/demo on http://127.0.0.1:"), line
        with urllib.request.urlopen(line.split()[3] + "/models/mnn-test/demo", timeout=60) as answer:
            assert json.load(answer)["id"] == "mnn-test/demo"
    finally:
        server.kill()
        server.wait()


def test_a_local_folder_wins_over_a_repo_of_the_same_name_and_a_bad_name_is_one_error(hub, hf_home, tmp_path):
    shutil.copytree(demo_model_dir(), tmp_path / "mnn-test" / "demo")
    local = mnngpu(hub, hf_home, *run("mnn-test/demo"), cwd=tmp_path)
    assert reply(local).strip() and hub.requests == []
    bad = mnngpu(hub, hf_home, *run("no such model"), cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr == (
        "error: model: 'no such model' is neither a file or folder here nor a Hub repo id ORG/NAME or "
        "ORG/NAME@REVISION\n")
    scope = mnngpu(hub, hf_home, *run("modelscope:MNN/Qwen3-0.6B-MNN"), cwd=tmp_path)
    assert scope.returncode == 2 and "ModelScope downloads are not supported yet" in scope.stderr


def test_model_names_parse_as_the_hub_spells_repo_ids():
    from mnngpu.hub import ModelName, parse_model_name

    assert parse_model_name("taobao-mnn/Qwen3-0.6B-MNN") == ModelName("taobao-mnn/Qwen3-0.6B-MNN", "main")
    assert parse_model_name("org/name@v1.0") == ModelName("org/name", "v1.0")
    assert str(parse_model_name("org/name@v1.0")) == "org/name@v1.0"
    for text in ("name", "a/b/c", "org/na..me", "org--x/y", "/abs/path", "./org/name", "org/name@", "http://x/y"):
        assert parse_model_name(text) is None, text
