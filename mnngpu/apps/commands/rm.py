"""`mnngpu rm ORG/NAME[@REVISION]`: delete a model from huggingface_hub's cache.

Without a revision every cached revision of the repo goes; with one, only the revision that branch,
tag or commit (or a commit's first characters) names. The deletion is huggingface_hub's own
(scan_cache_dir, delete_revisions), so files another revision shares stay.
"""

from __future__ import annotations


def register(subparsers) -> None:
    parser = subparsers.add_parser("rm", help="delete a downloaded model from the cache",
                                   description="Delete a model from huggingface_hub's cache (HF_HOME, or "
                                               "HF_HUB_CACHE): every revision, or the one @REVISION names.")
    parser.add_argument("model", help="Hub repo id ORG/NAME, or ORG/NAME@REVISION for one revision")
    parser.set_defaults(func=run)


def run(args) -> int:
    from mnngpu import hub

    name = hub.required_model_name(args.model)
    commits, freed = hub.remove(name, every_revision="@" not in args.model)
    print(f"removed {name.repo_id} ({', '.join(commit[:12] for commit in commits)}), {freed / 1e6:.1f} MB freed")
    return 0
