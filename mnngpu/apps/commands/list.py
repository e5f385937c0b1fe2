"""`mnngpu list`: the MNN models in huggingface_hub's cache (HF_HUB_CACHE): id, revision, size, path.

A copy that lacks a file the model needs (a download cut short) says which; `mnngpu pull` completes it.
"""

from __future__ import annotations


def register(subparsers) -> None:
    parser = subparsers.add_parser("list", help="list the MNN models downloaded from the Hugging Face Hub",
                                   description="The MNN models in huggingface_hub's cache (HF_HOME, or "
                                               "HF_HUB_CACHE): repo id, revision, size on disk, path.")
    parser.set_defaults(func=run)


def run(args) -> int:
    from mnngpu import hub

    models = hub.cached_models()
    if not models:
        print(f"no MNN models in the cache ({hub.cache_dir()}); mnngpu pull ORG/NAME fetches one")
        return 0
    rows = [("MODEL", "REVISION", "SIZE", "PATH")]
    rows += [(model.repo_id, model.revision, f"{model.size_on_disk / 1e6:.1f} MB",
              str(model.path) + (f"  (missing {', '.join(model.missing)})" if model.missing else ""))
             for model in models]
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[3])
    return 0
