"""`mnngpu pull ORG/NAME[@REVISION]`: fetch an MNN model folder from the Hugging Face Hub into the cache.

The same download `run ORG/NAME` does (mnngpu/hub.py), without loading the model; the folder's path is
printed on stdout.
"""

from __future__ import annotations

DESCRIPTION = ("Download the files of an MNN model folder from the Hugging Face Hub into huggingface_hub's cache "
               "(HF_HOME, or HF_HUB_CACHE), from HF_ENDPOINT (default: the Hub), and print the folder's path. "
               "With HF_HUB_OFFLINE=1 it prints the cached copy's path, with no network.")


def register(subparsers) -> None:
    parser = subparsers.add_parser("pull", help="download a model from the Hugging Face Hub into the cache",
                                   description=DESCRIPTION)
    parser.add_argument("model", help="Hub repo id ORG/NAME or ORG/NAME@REVISION (a branch, tag or commit)")
    parser.set_defaults(func=run)


def run(args) -> int:
    from mnngpu import hub

    name = hub.required_model_name(args.model)
    print(hub.model_folder(name))
    return 0
