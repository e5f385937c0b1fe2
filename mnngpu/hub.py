"""Models by name: an MNN model folder fetched from the Hugging Face Hub into huggingface_hub's cache.

    folder = model_folder(parse_model_name("taobao-mnn/Qwen3-0.6B-MNN"))   # ORG/NAME or ORG/NAME@REVISION

The transfer is huggingface_hub's own: its shared cache (HF_HOME, HF_HUB_CACHE), its endpoint
(HF_ENDPOINT), its offline switch (HF_HUB_OFFLINE=1: the cached copy, no network) and its progress
bars (shown on a terminal only). A transfer cut off mid-file is resumed from the last part written;
a download that fails keeps the files it finished.

Only the files an MNN folder can name are fetched: those the keys of config.json and llm_config.json
name (FILE_KEYS) and what llmexport writes beside them (FILE_PATTERNS); a repo's README, images or
original safetensors stay on the Hub. The repo's file list is checked before anything is written to
the cache: a repo without config.json, the graph, its weights or the tokenizer is not an MNN folder,
and nothing of it is downloaded. A cached copy is checked again before it is used, so a download cut
short never passes for a model.

ModelScope (`modelscope:ORG/NAME`) is refused with a clear error: it is not supported yet.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mnngpu.errors import MnnGpuError

CONFIG_FILE = "config.json"
# The keys of mnngpu/config/keys.py whose value is a file name under base_dir; their defaults come from there.
FILE_KEYS = ("llm_config", "llm_model", "llm_weight", "tokenizer_file", "embedding_file", "context_file",
             "ple_embed_file", "visual_model", "audio_model", "eagle_model", "eagle_fc", "eagle_d2t", "lookup_file")
REQUIRED_KEYS = ("llm_model", "llm_weight", "tokenizer_file")   # Llm.load fails without these
# What llmexport writes beside them: every graph with its external weights (vision, audio, LoRA, drafts),
# the embedding rows of a quantized export, the tokenizer.
FILE_PATTERNS = ("*.mnn", "*.mnn.weight", "embeddings_*.bin", "tokenizer.*")
DEFAULT_REVISION = "main"
MODEL_NAME = re.compile(r"(?:(?P<source>[a-z]+):)?(?P<repo>[^/@\s:]+/[^/@\s:]+)(?:@(?P<revision>[^@\s]+))?")
NAME_FORM = "a Hub repo id ORG/NAME or ORG/NAME@REVISION"


class HubError(MnnGpuError):
    """A model named by its Hub repo id could not be fetched, found in the cache, or is not an MNN folder."""


@dataclass(frozen=True)
class ModelName:
    repo_id: str
    revision: str = DEFAULT_REVISION   # a branch, a tag or a commit hash

    def __str__(self) -> str:
        return self.repo_id if self.revision == DEFAULT_REVISION else f"{self.repo_id}@{self.revision}"


@dataclass(frozen=True)
class CachedModel:
    repo_id: str
    revision: str        # the branches and tags that point at it, or its commit hash
    commit: str
    size_on_disk: int    # bytes of the files it holds
    path: Path
    missing: tuple[str, ...]   # files an MNN folder needs that this copy lacks (an interrupted download)


def parse_model_name(text: str) -> ModelName | None:
    """The repo id and revision `text` names, or None when it does not read as one."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    match = MODEL_NAME.fullmatch(text)
    if match is None or match["source"] not in (None, "modelscope"):
        return None
    if match["source"] == "modelscope":
        raise HubError(f"'{text}': ModelScope downloads are not supported yet; download the folder with "
                       "modelscope's own tools and give its path", field="model")
    try:
        validate_repo_id(match["repo"])
    except HFValidationError:
        return None
    return ModelName(match["repo"], match["revision"] or DEFAULT_REVISION)


def required_model_name(text: str) -> ModelName:
    """parse_model_name for a command that takes only a repo id: one HubError when `text` is not one."""
    name = parse_model_name(text)
    if name is None:
        raise HubError(f"'{text}' is not {NAME_FORM}", field="model")
    return name


def model_folder(name: ModelName) -> Path:
    """The cached folder of `name`: fetched (or brought up to date) first, unless HF_HUB_OFFLINE is set."""
    from huggingface_hub import constants

    return cached_folder(name) if constants.is_offline_mode() else fetch(name)


def fetch(name: ModelName) -> Path:
    """Check the repo's file list, then download what an MNN folder needs into the cache."""
    import httpx2
    from huggingface_hub import HfApi, snapshot_download

    api = HfApi()
    sha, sizes = _repo_files(api, name)
    try:   # huggingface_hub's HTTP errors are OSErrors; its transport's are httpx2's
        configs = _read_configs(api, name, sha, sizes)
        _check_mnn_folder(name, sizes, configs)
        patterns = allow_patterns(configs)
        _announce(name, sha, sizes, patterns, api.endpoint)
        with _progress_bars_on_terminal():
            folder = snapshot_download(name.repo_id, revision=name.revision, allow_patterns=patterns)
    except (OSError, httpx2.TransportError) as exc:
        raise _download_error(name, exc) from None
    return _checked(name, Path(folder))


def cached_folder(name: ModelName) -> Path:
    """The cached copy of `name`, with no network (HF_HUB_OFFLINE=1)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import IncompleteSnapshotError, LocalEntryNotFoundError

    try:
        folder = Path(snapshot_download(name.repo_id, revision=name.revision, local_files_only=True,
                                        allow_patterns=[CONFIG_FILE]))
        configs = _configs_in(folder)
        folder = Path(snapshot_download(name.repo_id, revision=name.revision, local_files_only=True,
                                        allow_patterns=allow_patterns(configs)))
    except IncompleteSnapshotError as exc:   # a LocalEntryNotFoundError too: this one first
        raise HubError(f"the cached copy of '{name}' is incomplete (a download cut short: {_first_line(exc)}) and "
                       f"HF_HUB_OFFLINE is set: run mnngpu pull {name} with the network on", field="model") from None
    except LocalEntryNotFoundError:
        raise HubError(f"'{name}' is not in the cache ({cache_dir()}) and HF_HUB_OFFLINE is set: fetch it first "
                       f"(mnngpu pull {name}) with the network on", field="model") from None
    return _checked(name, folder)


def allow_patterns(configs: dict) -> list[str]:
    """The file names and patterns of an MNN folder: FILE_PATTERNS and every file its config names."""
    return sorted({CONFIG_FILE, *FILE_PATTERNS, *named_files(configs, FILE_KEYS)})


def named_files(configs: dict, keys: tuple[str, ...]) -> list[str]:
    """The file names `keys` have in the merged config (their MNN defaults where unset)."""
    from mnngpu.config.keys import KEYS

    names = [configs.get(key, KEYS[key].default) for key in keys]
    return [name for name in names if isinstance(name, str) and name]


def missing_files(folder: Path) -> tuple[str, ...]:
    """The files Llm.load needs that `folder` lacks (config.json's defaults name them where it is missing)."""
    names = [CONFIG_FILE, *named_files(_configs_in(folder), REQUIRED_KEYS)]
    return tuple(name for name in names if not (folder / name).is_file())


def _missing_or_unreadable(folder: Path) -> tuple[str, ...]:
    try:
        return missing_files(folder)
    except HubError:   # one damaged copy is a line of the list, not the end of it
        return (f"a readable {CONFIG_FILE}",)


def cached_models() -> list[CachedModel]:
    """Every cached revision of a model repo that holds an MNN folder, whole or in part."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        cache = scan_cache_dir()
    except CacheNotFound:
        return []
    models = []
    for repo in sorted(cache.repos, key=lambda repo: repo.repo_id):
        for revision in sorted(repo.revisions, key=lambda revision: revision.last_modified):
            if repo.repo_type == "model" and _looks_like_mnn(revision.snapshot_path):
                refs = ",".join(sorted(revision.refs)) or revision.commit_hash
                models.append(CachedModel(repo.repo_id, refs, revision.commit_hash, revision.size_on_disk,
                                          revision.snapshot_path, _missing_or_unreadable(revision.snapshot_path)))
    return models


def remove(name: ModelName, every_revision: bool) -> tuple[list[str], int]:
    """Delete `name` from the cache through huggingface_hub's cache API: its revision, or every revision.
    Returns the commit hashes removed and the bytes freed."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        cache = scan_cache_dir()
    except CacheNotFound:
        cache = None
    repos = [repo for repo in (cache.repos if cache else ()) if repo.repo_type == "model"
             and repo.repo_id == name.repo_id]
    revisions = [revision.commit_hash for repo in repos for revision in repo.revisions
                 if every_revision or name.revision in revision.refs or revision.commit_hash.startswith(name.revision)]
    if not revisions:
        raise HubError(f"'{name}' is not in the cache ({cache_dir()}); mnngpu list shows what is",
                       field="model")
    strategy = cache.delete_revisions(*revisions)
    strategy.execute()
    return revisions, strategy.expected_freed_size


def _repo_files(api, name: ModelName) -> tuple[str, dict[str, int | None]]:
    """The commit `name` resolves to, and the repo's files there with their sizes."""
    import httpx2
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        info = api.model_info(name.repo_id, revision=name.revision, files_metadata=True)
    except RevisionNotFoundError:
        raise HubError(f"'{name.repo_id}' has no revision '{name.revision}' on {api.endpoint}", field="model") from None
    except RepositoryNotFoundError:
        raise HubError(f"'{name}' is not a local file or folder, and {api.endpoint} has no model repo of that name "
                       "(or it is private: huggingface_hub's login or HF_TOKEN gives access)", field="model") from None
    except HfHubHTTPError as exc:
        raise HubError(f"{api.endpoint} refused '{name}': {_first_line(exc)}", field="model") from None
    except httpx2.TransportError as exc:
        raise HubError(f"could not reach {api.endpoint} ({exc}); HF_HUB_OFFLINE=1 runs a model already in the cache",
                       field="model") from None
    return info.sha, {sibling.rfilename: sibling.size for sibling in info.siblings or ()}


def _read_configs(api, name: ModelName, sha: str, sizes: dict) -> dict:
    """config.json with llm_config.json merged on top, read from the Hub without touching the cache."""
    if CONFIG_FILE not in sizes:
        raise _not_mnn(name, [CONFIG_FILE])
    with tempfile.TemporaryDirectory(prefix="mnngpu-hub-") as folder:
        config = _read_json(Path(api.hf_hub_download(name.repo_id, CONFIG_FILE, revision=sha, local_dir=folder)),
                            name)
        llm_config = named_files(config, ("llm_config",))
        if llm_config and llm_config[0] in sizes:
            path = Path(api.hf_hub_download(name.repo_id, llm_config[0], revision=sha, local_dir=folder))
            return {**config, **_read_json(path, name)}
    return config


def _check_mnn_folder(name: ModelName, sizes: dict, configs: dict) -> None:
    missing = [file for file in named_files(configs, REQUIRED_KEYS) if file not in sizes]
    if missing:
        raise _not_mnn(name, missing)


def _not_mnn(name: ModelName, missing: list[str]) -> HubError:
    return HubError(f"'{name}' is not an MNN model folder: the repo has no {', '.join(missing)} (an MNN export "
                    "holds config.json, llm.mnn, llm.mnn.weight and the tokenizer file config.json names); "
                    "nothing was downloaded", field="model")


def _configs_in(folder: Path) -> dict:
    config = _read_json(folder / CONFIG_FILE, None) if (folder / CONFIG_FILE).is_file() else {}
    llm_config = named_files(config, ("llm_config",))
    if llm_config and (folder / llm_config[0]).is_file():
        return {**config, **_read_json(folder / llm_config[0], None)}
    return config


def _read_json(path: Path, name: ModelName | None) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        where = f"'{name}': {path.name}" if name else str(path)
        raise HubError(f"{where}: not readable JSON ({exc})", field="model") from None
    if not isinstance(value, dict):
        raise HubError(f"{path.name}: expected a JSON object", field="model")
    return value


def _checked(name: ModelName, folder: Path) -> Path:
    missing = missing_files(folder)
    if missing:
        raise HubError(f"the cached copy of '{name}' ({folder}) lacks {', '.join(missing)}: run mnngpu pull {name} "
                       "with the network on", field="model")
    return folder


def _looks_like_mnn(folder: Path) -> bool:
    """A graph, or a config.json that names an MNN file (a transformers config.json names none)."""
    if any(folder.glob("*.mnn")) or any(folder.glob("*.mnn.weight")):
        return True
    try:
        return any(key in _configs_in(folder) for key in FILE_KEYS)
    except HubError:
        return False


def _announce(name: ModelName, sha: str, sizes: dict, patterns: list[str], endpoint: str) -> None:
    """One line when files are to be downloaded: which, how much, from where."""
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.utils import filter_repo_objects

    wanted = list(filter_repo_objects(sizes, allow_patterns=patterns))
    todo = [file for file in wanted if not isinstance(try_to_load_from_cache(name.repo_id, file, revision=sha), str)]
    if todo:
        megabytes = sum(sizes[file] or 0 for file in todo) / 1e6
        print(f"fetching {name} ({sha[:12]}) from {endpoint}: {len(todo)} of its {len(sizes)} files, "
              f"{megabytes:.1f} MB, into {cache_dir()}", file=sys.stderr, flush=True)


@contextmanager
def _progress_bars_on_terminal():
    """huggingface_hub's progress bars on a terminal; nothing in a pipe or a log."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    if sys.stderr.isatty() or are_progress_bars_disabled():
        yield
        return
    disable_progress_bars()
    try:
        yield
    finally:
        enable_progress_bars()


def _download_error(name: ModelName, exc: Exception) -> HubError:
    from huggingface_hub.errors import RemoteEntryNotFoundError

    if isinstance(exc, RemoteEntryNotFoundError):
        file = str(exc.response.url).rsplit("/", 1)[-1]
        return HubError(f"'{name}': the repo lists {file}, but the server answered {exc.response.status_code} for it; "
                        "the files fetched so far stay in the cache, and a later run fetches the rest", field="model")
    return HubError(f"'{name}': the download stopped ({type(exc).__name__}: {_first_line(exc)}); the files fetched "
                    "so far stay in the cache, and a later run fetches the rest", field="model")


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def cache_dir() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE
