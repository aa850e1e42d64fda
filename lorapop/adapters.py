"""Adapters from outside a run's engine: PEFT directories and members of run directories.

A *source* names one LoRA adapter:

* a PEFT LoRA directory (``adapter_config.json`` + ``adapter_model.safetensors``), whoever wrote it: peft's
  ``save_pretrained``, ``lorapop export``, a checkpoint's ``adapters/<id>/``;
* ``RUN_DIR:best`` or ``RUN_DIR:<member id>`` (``runs/X:s1``): that member in the run's latest *complete* checkpoint
  (temp and unfinished checkpoint directories are never read, so a run still training can be named).

``best`` is the student with the highest conservative TrueSkill rating, ``expose = mu - k * sigma`` with TrueSkill's
``k = prior mu / prior sigma`` (3 with the defaults: mu - 3 sigma), the fitness PBT ranks by. The ratings are the
checkpoint's own (``trainer_state.json``), not ``population.json``, which a running trainer rewrites after every step
and may describe members the checkpoint does not hold. Ties go to the higher mu, then the lower slot. Teachers are
never ``best``: their rating measures how hard their tasks are, not how well they solve. In single mode the one agent
(``a0``, both roles) is ``best``.

``population.init_from`` (:func:`assign`, :func:`plan_init`, :func:`fit_weights`) starts a new run's members from
sources instead of fresh LoRA; see docs/METHOD.md, "Starting from existing adapters".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lorapop.configlib import ConfigError
from lorapop.records import RunDirError
from lorapop.records.members import AGENT, Member, role_from_id
from lorapop.records.rundir import RunDir

if TYPE_CHECKING:
    import torch

ROLES = ("teacher", "student", AGENT)
ADAPTER_CONFIG = "adapter_config.json"  # = engine.peft_io.CONFIG_NAME (not imported: that module loads torch)


# ---- members of a run, their ratings, best ------------------------------------------------------------------------

@dataclass(frozen=True)
class Rating:
    mu: float
    sigma: float
    expose: float  # mu - k * sigma (TrueSkill's expose)


def checkpoint_ratings(rd: RunDir, ckpt: Path) -> dict[str, Rating]:
    """Every rated member of ``ckpt`` (replaced ones included), from its trainer state."""
    state = rd.read_trainer_state(ckpt)
    prior = (state.get("config") or {}).get("rating") or {}
    k = float(prior.get("mu", 25.0)) / float(prior.get("sigma", 25.0 / 3))
    out = {}
    for mid, v in (state.get("ratings") or {}).items():
        mu, sigma = float(v[0]), float(v[1])
        out[str(mid)] = Rating(mu, sigma, mu - k * sigma)
    return out


def best_member(members: list[Member], ratings: dict[str, Rating]) -> Member:
    """The student with the highest expose (the agent in single mode); see the module docstring."""
    pool = [m for m in members if m.role == AGENT] or [m for m in members if m.role == "student"]
    if not pool:
        raise RunDirError(f"no student in this checkpoint (members: {', '.join(m.id for m in members)}); name one "
                          "by id instead of best")
    unrated = [m.id for m in pool if m.id not in ratings]
    if unrated:
        raise RunDirError(f"the checkpoint holds no rating for {', '.join(unrated)}; name a member by id instead of "
                          "best")
    return max(pool, key=lambda m: (ratings[m.id].expose, ratings[m.id].mu, -m.slot))


@dataclass(frozen=True)
class Picked:
    """A member chosen from a run: the complete checkpoint it was read from and its rating there."""
    run_dir: Path
    checkpoint: Path
    step: int
    member: Member
    rating: Rating | None
    is_best: bool
    trainer_state: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)


def pick_members(run_dir: str | Path, which: str, step: int | None = None) -> list[Picked]:
    """``which``: ``best``, ``all`` or a member id, from the complete checkpoint of ``step`` (else the latest)."""
    rd = RunDir(run_dir)
    ckpt = rd.find_checkpoint(step)
    state = rd.read_trainer_state(ckpt)
    members = rd.checkpoint_members(ckpt)
    ratings = checkpoint_ratings(rd, ckpt)
    best = best_member(members, ratings) if which == "best" else None
    if which == "all":
        chosen = members
    elif best is not None:
        chosen = [best]
    else:
        chosen = [m for m in members if m.id == which]
        if not chosen:
            raise RunDirError(f"{rd.path}: no member {which!r} in {ckpt.name} (members: "
                              f"{', '.join(m.id for m in members)}; or best, all)")
    step_no = int(state.get("step", 0))
    return [Picked(rd.path, ckpt, step_no, m, ratings.get(m.id), best is not None and m.id == best.id, state)
            for m in chosen]


def describe_best(picked: Picked, run_dir: str | Path) -> str:
    """One line saying which member is best and why, with the others' numbers."""
    rd = RunDir(run_dir)
    ratings = checkpoint_ratings(rd, picked.checkpoint)
    pool = [m for m in rd.checkpoint_members(picked.checkpoint)
            if m.role == picked.member.role and m.id in ratings]
    r = picked.rating
    others = ", ".join(f"{m.id} {ratings[m.id].expose:.2f}" for m in pool)
    why = "the agent (single mode)" if picked.member.role == AGENT else "highest expose = mu - 3 sigma among students"
    return (f"best: {picked.member.id} at step {picked.step} ({why}): mu {r.mu:.2f}, sigma {r.sigma:.2f}, "
            f"expose {r.expose:.2f}; {picked.member.role}s: {others}")


# ---- sources ------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Source:
    spec: str  # as written in the config
    dir: Path  # the PEFT directory it names
    picked: Picked | None = None  # when it names a run's member

    @property
    def label(self) -> str:
        if self.picked is None:
            return str(self.dir)
        p = self.picked
        return f"{p.run_dir}:{p.member.id} (step {p.step}{', best' if p.is_best else ''})"


def resolve_source(spec: str) -> Source:
    """The PEFT directory ``spec`` names (see the module docstring); a clear :class:`ConfigError` otherwise."""
    path = Path(spec).expanduser()
    if (path / ADAPTER_CONFIG).is_file():
        return Source(spec, path)
    run, sep, which = spec.rpartition(":")
    if sep and run and (which == "best" or role_from_id(which)) and Path(run).expanduser().is_dir():
        try:
            picked = pick_members(Path(run).expanduser(), which)[0]
        except RunDirError as e:
            raise ConfigError(f"{spec}: {e}") from e
        return Source(spec, picked.member.adapter_dir, picked)
    if path.is_dir() and RunDir(path).has_config():
        raise ConfigError(f"{spec} is a run directory: name one of its members, {spec}:best or {spec}:<member id>")
    raise ConfigError(f"{spec}: neither a PEFT adapter directory (no {ADAPTER_CONFIG}) nor RUN_DIR:best / "
                      "RUN_DIR:<member id> of an existing run directory")


# ---- population.init_from: which member starts from which source ---------------------------------------------------

def split_entries(entries: list[str]) -> tuple[list[str], dict[str, str]]:
    """``init_from`` entries -> (positional sources, {role or member id: source}). An entry ``KEY=SOURCE`` is keyed
    when KEY is a role (teacher, student, agent) or a member id (t0, s1, a0); anything else is a plain source."""
    positional, keyed = [], {}
    for e in entries:
        key, sep, rest = e.partition("=")
        if sep and (key in ROLES or role_from_id(key)):
            if not rest:
                raise ConfigError(f"population.init_from: '{e}' names no source after '='")
            if key in keyed:
                raise ConfigError(f"population.init_from: '{key}=' given twice")
            keyed[key] = rest
        else:
            positional.append(e)
    if positional and keyed:
        raise ConfigError("population.init_from: use either plain sources (one for every member, or one per member "
                          f"in slot order) or KEY=SOURCE entries, not both (plain: {positional})")
    return positional, keyed


def assign(entries: list[str], members: list[Member]) -> dict[str, str]:
    """{member id: source spec} for the members that start from a source (the others get fresh LoRA).

    * one plain source: every member starts from it;
    * as many plain sources as members: one each, in slot order (teachers t0.. then students s0..; a0 alone in
      single mode);
    * ``KEY=SOURCE`` entries: a member takes its id's entry, else its role's; members named by neither start fresh.
    """
    if not entries:
        return {}
    positional, keyed = split_entries(entries)
    ids = [m.id for m in members]
    if positional:
        if len(positional) == 1:
            return {i: positional[0] for i in ids}
        if len(positional) == len(members):
            return dict(zip(ids, positional))
        raise ConfigError(f"population.init_from: {len(positional)} sources for {len(members)} members; give one "
                          f"(for all), {len(members)} (one per member, in the order {', '.join(ids)}), or "
                          "ROLE=SOURCE / ID=SOURCE entries")
    roles = {m.role for m in members}
    unknown = [k for k in keyed if k not in ids and k not in roles]
    if unknown:
        raise ConfigError(f"population.init_from: {', '.join(unknown)} names no member of this run (members: "
                          f"{', '.join(f'{m.id} ({m.role})' for m in members)})")
    out = {}
    for m in members:
        spec = keyed.get(m.id, keyed.get(m.role))
        if spec is not None:
            out[m.id] = spec
    return out


@dataclass(frozen=True)
class InitPlan:
    member: Member
    source: Source
    config: dict[str, Any]  # the source's adapter_config.json
    notes: tuple[str, ...] = ()

    def record(self) -> dict[str, Any]:
        """What the trainer state keeps of where a member started."""
        rec: dict[str, Any] = {"source": self.source.spec, "dir": str(self.source.dir), "r": self.config["r"],
                               "lora_alpha": self.config.get("lora_alpha", self.config["r"])}
        if self.source.picked is not None:
            p = self.source.picked
            rec.update(run_dir=str(p.run_dir), member=p.member.id, step=p.step)
        if self.notes:
            rec["notes"] = list(self.notes)
        return rec


def _targets(cfg: dict) -> list[str] | str:
    tm = cfg.get("target_modules") or []
    return tm if isinstance(tm, str) else sorted(tm)


def check_source(source: Source, *, rank: int, target_modules: list[str], model_name: str,
                 check_base: bool = True) -> tuple[dict[str, Any], list[str]]:
    """Read ``source``'s adapter_config.json and check it against the run: rank <= ``rank`` (smaller is padded),
    the same target modules, the same base model. Returns (its config, notes); raises :class:`ConfigError` naming
    what was expected and what was found."""
    from lorapop.model import base_identity

    where = f"population.init_from: {source.spec}"
    try:
        cfg = json.loads((source.dir / ADAPTER_CONFIG).read_text())
        r = int(cfg["r"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{where}: unreadable {ADAPTER_CONFIG} ({type(e).__name__}: {e})") from e
    if cfg.get("peft_type", "LORA") != "LORA":
        raise ConfigError(f"{where}: expected a LoRA adapter, found peft_type {cfg.get('peft_type')!r}")
    notes = []
    if r > rank:
        raise ConfigError(f"{where}: rank mismatch: expected r <= {rank} (engine.rank), found r={r}; set "
                          f"--engine.rank={r} (and engine.lora_alpha) to start from it")
    found = _targets(cfg)
    if found != sorted(target_modules):
        raise ConfigError(f"{where}: target-module mismatch: expected {sorted(target_modules)} "
                          f"(engine.target_modules), found {found}; set engine.target_modules to match")
    mine, theirs = base_identity(model_name), base_identity(cfg.get("base_model_name_or_path"))
    if theirs is None:
        notes.append("names no base model; its shapes are checked against the base when it loads")
    elif check_base and mine != theirs:
        raise ConfigError(f"{where}: base-model mismatch: expected {model_name!r} (model.name), found "
                          f"base_model_name_or_path {cfg.get('base_model_name_or_path')!r}; if it is the same "
                          "base under another name, set population.init_check_base: false")
    if r < rank:
        notes.append(f"rank {r} < engine.rank {rank}: padded to {rank} (new A rows PEFT-initialised, B columns "
                     "zero), so its weight delta is unchanged and the new rank can still learn")
    return cfg, notes


def plan_init(entries: list[str], members: list[Member], *, rank: int, target_modules: list[str],
              model_name: str, check_base: bool = True) -> list[InitPlan]:
    """Resolve and check every source ``init_from`` assigns, before any model loads."""
    plans, cache, specs = [], {}, assign(entries, members)
    for m in members:
        spec = specs.get(m.id)
        if spec is None:
            continue
        if spec not in cache:
            src = resolve_source(spec)
            cache[spec] = (src, *check_source(src, rank=rank, target_modules=target_modules, model_name=model_name,
                                              check_base=check_base))
        src, cfg, notes = cache[spec]
        plans.append(InitPlan(m, src, cfg, tuple(notes)))
    return plans


def fit_weights(plan: InitPlan, like: dict[str, tuple[torch.Tensor, torch.Tensor]], *, lora_alpha: float,
                generator: torch.Generator) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The source's weights in the engine's layout ``like`` (an adapter as the engine returns it: every module, rank
    R): the same modules and shapes required (else a base-model / target mismatch error), B rescaled when the
    source's scaling (its alpha / r, or rslora's) differs from the engine's lora_alpha / R, and a smaller rank
    padded (A rows PEFT-initialised, B columns zero), so the weight delta equals the source's."""
    import torch

    from lorapop.engine.lora import kaiming_uniform_A
    from lorapop.engine.peft_io import load_peft_adapter

    where = f"population.init_from: {plan.source.spec}"
    weights, pcfg = load_peft_adapter(plan.source.dir)
    missing, unknown = sorted(set(like) - set(weights)), sorted(set(weights) - set(like))
    if missing or unknown:
        raise ConfigError(f"{where}: target-module mismatch: the engine adapts {len(like)} modules, the adapter "
                          f"{len(weights)}; missing {missing[:3]}{' ...' if len(missing) > 3 else ''}, not in the "
                          f"engine {unknown[:3]}{' ...' if len(unknown) > 3 else ''}")
    rank = next(iter(like.values()))[0].shape[0]
    ratio = pcfg["scaling"] / (lora_alpha / rank)
    out = {}
    for name, (a0, b0) in like.items():
        a, b = weights[name]
        if a.shape[1] != a0.shape[1] or b.shape[0] != b0.shape[0]:
            raise ConfigError(f"{where}: base-model mismatch at {name}: expected A [r, {a0.shape[1]}] and B "
                              f"[{b0.shape[0]}, r], found A {list(a.shape)} and B {list(b.shape)}")
        r = a.shape[0]
        if r < rank:
            a = torch.cat([a, kaiming_uniform_A(rank - r, a.shape[1], generator)])
            b = torch.cat([b, torch.zeros(b.shape[0], rank - r)], dim=1)
        out[name] = (a, b * ratio if ratio != 1.0 else b)
    return out
