"""What every framework's export and import share: the export and import records, refusals, the batch split,
the plan as a framework runs it (for comparing an import with the plan it came from), and the reading of
a launch command or script into its flags.

A framework derives some degrees from the others: every one here takes the data-parallel degree from the
world size (GPUs / (tp·cp·pp), torchtitan's ``data_parallel_shard_degree = -1``, Megatron's and DeepSpeed's
data-parallel size), and the gradient accumulation from the global batch (global batch = micro-batch x
data-parallel degree x accumulation steps). An export writes the degrees explicitly where the framework
takes them, and lists what the framework derives.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NoReturn

from meshplan.errors import SpecError
from meshplan.specs import ClusterSpec, JobSpec, ModelSpec, Plan
from meshplan.specs.plan import FRAMEWORK_CP, FRAMEWORK_EP_DISPATCH

STACKS = ("torchtitan", "megatron", "deepspeed")
FORMATS = {"torchtitan": ("script", "args"), "megatron": ("script", "args", "bridge"),
           "deepspeed": ("script", "json")}
"""Per stack the forms an export takes; the first is the default: a launch script (comments, then the
command), the arguments alone, Megatron-Bridge's ConfigContainer overrides, DeepSpeed's JSON config alone."""
VERSIONS = {"torchtitan": "torchtitan 0.3.0 (PyPI)",
            "megatron": "Megatron-LM NVIDIA/Megatron-LM@d98e8a64 (core_v0.19.0 and later, 2026-08-22); "
                        "Megatron-Bridge NVIDIA-NeMo/Megatron-Bridge@067f987d (v0.6.0 and later, 2026-08-22)",
            "deepspeed": "DeepSpeed 0.19.8 (PyPI); Megatron-DeepSpeed deepspeedai/Megatron-DeepSpeed@4efb479d"}
"""The framework versions each export is written for and checked against (tests/frameworks)."""


def refuse(stack: str, message: str) -> NoReturn:
    """A plan (or job) the framework cannot run: one line naming what it lacks."""
    raise SpecError(f"export.{stack}", message)


@dataclass(frozen=True, slots=True)
class Export:
    """A plan as a framework's settings."""

    stack: str
    format: str
    text: str
    """What is written: for a script, comments (the assumptions) and then the launch command."""
    args: tuple[str, ...] = ()
    """The command-line arguments of the training program (script and args forms)."""
    assumptions: tuple[str, ...] = ()
    """What meshplan assumed that the framework decides for itself."""
    env: tuple[tuple[str, str], ...] = ()
    """Environment variables the launch needs (the script form exports them)."""


@dataclass(frozen=True, slots=True)
class Imported:
    """An existing configuration read as a plan and a job."""

    stack: str
    plan: Plan
    job: dict[str, object]
    """JobSpec fields the configuration sets (global_batch_tokens, seq_len, precision, ...)."""
    model: str | None = None
    """The catalog model the configuration names, or None where it names none meshplan has."""
    world_size: int | None = None
    """GPUs, where the launch command says (torchrun --nnodes x --nproc-per-node)."""
    model_spec: ModelSpec | None = None
    """The architecture the flags describe (Megatron-LM's --num-layers, --hidden-size, ...), where they do."""
    unsupported: tuple[str, ...] = ()
    """Settings read and not modelled, or not understood: listed, never dropped silently."""
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Batch:
    """The batch split of a plan: global sequences = mbs x data-parallel degree x micro-batches per rank."""

    global_seqs: int
    dp: int
    mbs: int
    microbatches: int
    """Micro-batches each data-parallel rank runs per step (the pipeline's, or the accumulation steps)."""

    @property
    def local_seqs(self) -> int:
        """Sequences per data-parallel rank per step."""
        return self.mbs * self.microbatches


def resolved(stack: str, plan: Plan) -> Plan:
    """``plan`` with its micro-batch size and recomputation chosen (an evaluated plan), or a refusal."""
    missing = [k for k in ("mbs", "recompute") if getattr(plan, k) is None]
    if plan.offload_layers is None:
        missing.append("offload_layers")
    if missing:
        refuse(stack, f"needs the plan's {', '.join(missing)} chosen: export an evaluated plan (meshplan evaluate "
                      "or plan chooses them), or give them in the plan string")
    return plan


def batch_of(stack: str, plan: Plan, job: JobSpec) -> Batch:
    """The batch split; a refusal where the global batch does not split into whole micro-batches per rank."""
    seqs, dp, mbs = job.global_batch_seqs, plan.dp, plan.mbs or 1
    if seqs % (dp * mbs):
        refuse(stack, f"the global batch of {seqs} sequences does not split into micro-batches of {mbs} over "
                      f"{dp} data-parallel ranks")
    return Batch(global_seqs=seqs, dp=dp, mbs=mbs, microbatches=seqs // (dp * mbs))


def world_check(stack: str, plan: Plan, cluster: ClusterSpec) -> None:
    if plan.world_size != cluster.n_gpus:
        refuse(stack, f"the plan's degrees take {plan.world_size} GPUs and the cluster has {cluster.n_gpus}")


def as_run(plan: Plan, stack: str) -> Plan:
    """``plan`` with every option that equals what ``stack`` runs by default written as left to the default
    (None), so that two plans compare equal when the framework runs them the same way: an import cannot tell an
    option set to the framework's default from one left out."""
    sharding = plan.sharding
    changes: dict[str, object] = {}
    if plan.sp is not None and plan.sp == (plan.tp > 1):
        changes["sp"] = None
    if plan.cp_impl is not None and plan.cp_impl == FRAMEWORK_CP[sharding][0]:
        changes["cp_impl"] = None
    if plan.ep_dispatch is not None and plan.ep_dispatch == FRAMEWORK_EP_DISPATCH[sharding][0]:
        changes["ep_dispatch"] = None
    if plan.etp is not None and plan.etp == (plan.tp if plan.ep == 1 else 1):
        changes["etp"] = None
    base = replace(plan, **changes)  # type: ignore[arg-type]
    if plan.grad_sync is not None and replace(base, grad_sync=None).effective_grad_sync == plan.grad_sync:
        changes["grad_sync"] = None
    if plan.reshard_after_forward is not None and \
            replace(base, reshard_after_forward=None).effective_reshard_after_forward == plan.reshard_after_forward:
        changes["reshard_after_forward"] = None
    if stack == "torchtitan" and plan.is_ddp and plan.pp == 1 and plan.grad_sync == "every":
        changes["grad_sync"] = None  # torchtitan's DDP loop reduces every micro-batch (specs.plan.stack_defaults)
    if plan.pp == 1:
        changes["layout"] = ""
    return replace(plan, **changes)  # type: ignore[arg-type]


# ---- reading a launch command ----------------------------------------------------------------------------

@dataclass
class Command:
    """A launch command split into the launcher's flags (torchrun, deepspeed) and the program's."""

    launcher: list[str] = field(default_factory=list)
    program: list[str] = field(default_factory=list)

    @property
    def world_size(self) -> int | None:
        """GPUs from torchrun's --nnodes x --nproc-per-node (or deepspeed's --num_nodes x --num_gpus)."""
        flags = dict(flag_pairs(self.launcher))
        nodes = _first_int(flags, "--nnodes", "--num_nodes", "--num-nodes")
        per = _first_int(flags, "--nproc-per-node", "--nproc_per_node", "--num_gpus", "--num-gpus")
        return None if per is None else per * (nodes or 1)


def _first_int(flags: dict[str, list[str]], *names: str) -> int | None:
    for n in names:
        values = flags.get(n)
        if values and values[0].isdigit():
            return int(values[0])
    return None


def read_source(source: str) -> str:
    """``source`` itself, or the text of the file it names."""
    p = Path(source)
    if "\n" not in source and len(source) < 4096 and p.is_file():
        try:
            return p.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise SpecError("from", f"{source}: not UTF-8 text ({exc.reason})") from None
    return source


def split_command(text: str, program_markers: tuple[str, ...]) -> Command:
    """Tokens of a command line or launch script (comments dropped, line continuations joined): before the
    training program (a token ending in one of ``program_markers``, or the module after ``-m``) they are the
    launcher's; after it, the program's. Without a marker every flag is the program's."""
    try:
        tokens = shlex.split(text.replace("\\\n", " "), comments=True)
    except ValueError as exc:
        raise SpecError("from", f"cannot split the command line: {exc}") from None
    for i, tok in enumerate(tokens):
        if tok.endswith(program_markers) or (i > 0 and tokens[i - 1] == "-m"):
            return Command(launcher=tokens[:i], program=tokens[i + 1:])
    return Command(program=tokens)


def flag_pairs(tokens: list[str]) -> list[tuple[str, list[str]]]:
    """``--flag value ...`` pairs in order (a flag with no value gets an empty list; ``--flag=value`` splits);
    tokens that are not flags and follow no flag are returned under the key ''."""
    out: list[tuple[str, list[str]]] = []
    for tok in tokens:
        if tok.startswith("--"):
            key, eq, value = tok.partition("=")
            out.append((key, [value] if eq else []))
        elif out and not (tok.startswith("-") and len(tok) > 1 and not _is_number(tok)):
            out[-1][1].append(tok)
        else:
            out.append(("", [tok]))
    return out


def _is_number(tok: str) -> bool:
    try:
        float(tok)
    except ValueError:
        return False
    return True


def comment_block(lines: list[str] | tuple[str, ...], prefix: str = "# ") -> str:
    """Lines as comments, long ones wrapped at 110 columns under their first word."""
    import textwrap

    out = []
    indent = "#" + " " * (len(prefix) - 1)
    for line in lines:
        wrapped = textwrap.wrap(line, 110 - len(prefix)) or [""]
        out.extend((prefix if i == 0 else indent) + w for i, w in enumerate(wrapped))
    return "\n".join(out)


def shell_command(head: list[str], args: list[str]) -> str:
    """``head`` then one argument pair per line, shell-quoted, with line continuations."""
    lines = [" ".join(shlex.quote(h) for h in head)]
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--") and i + 1 < len(args) and not args[i + 1].startswith("--") and ":" not in args[i + 1]:
            lines.append(f"{shlex.quote(a)} {shlex.quote(args[i + 1])}")
            i += 2
        else:
            lines.append(shlex.quote(a))
            i += 1
    return " \\\n    ".join(lines)
