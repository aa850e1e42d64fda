"""`lorapop prepare-model [MODEL]`: make a base model ready to train (the embedded GGUF converted once to cached
safetensors, a hub id downloaded into the Hugging Face cache), check that it loads, print where it is and its size."""

from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default="embedded", help="'embedded' (default), a Hugging Face hub id "
                   "(e.g. Qwen/Qwen2.5-Coder-7B: needs the network once), a local checkpoint directory or a .gguf")


def run(args: argparse.Namespace) -> int:
    from lorapop.model import ModelNotFoundError, checkpoint_summary, download_model, prepare_model

    try:
        path = prepare_model(args.model)
        if not path.exists():  # a hub id: into the Hugging Face cache now, not inside the first train
            path = download_model(args.model)
        summary = checkpoint_summary(path)
    except ModelNotFoundError as e:
        print(f"lorapop prepare-model: {e}", file=sys.stderr)
        return 2
    print(f"model ready: {path} ({summary})")
    return 0
