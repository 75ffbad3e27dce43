"""Write tests/frameworks/megatron_flags.json: every argument of Megatron-LM's own parser
(megatron/training/arguments.py ``add_megatron_arguments``) and the fields of the Megatron-Bridge
ConfigContainer sections an export overrides, read from checkouts of their sources.

Neither installs here (megatron-core 0.19 and Megatron-Bridge 0.6 need Python 3.12; the megatron-core wheel
does not ship megatron/training), so the tests check exports against this table, and, where
MEGATRON_LM_SOURCE names a checkout, against Megatron-LM's own parse_args and validate_args
(test_megatron_parser.py). Run:

    MEGATRON_LM_SOURCE=/path/to/Megatron-LM MEGATRON_BRIDGE_SOURCE=/path/to/Megatron-Bridge \
        MEGATRON_DEEPSPEED_SOURCE=/path/to/Megatron-DeepSpeed \
        python tests/frameworks/dump_megatron_flags.py COMMIT_LM COMMIT_BRIDGE COMMIT_MEGATRON_DEEPSPEED

Megatron-LM's training package uses Python 3.12's typing.override; on 3.11 it is taken from
typing_extensions for the import.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import os
import sys
import typing
import warnings
from pathlib import Path

OUT = Path(__file__).with_name("megatron_flags.json")


def _kind(action: argparse.Action) -> str:
    name = type(action).__name__
    return {"_StoreAction": "store", "_StoreTrueAction": "store_true", "_StoreFalseAction": "store_false",
            "_StoreConstAction": "store_const", "_AppendAction": "append", "BooleanOptionalAction": "bool_optional",
            "_CountAction": "count"}.get(name, name)


def _type(action: argparse.Action) -> str | None:
    t = action.type
    if t in (int, float, str):
        return t.__name__
    return None if t is None else "other"


def megatron_lm_flags(source: str) -> dict[str, dict]:
    import typing_extensions

    if not hasattr(typing, "override"):
        typing.override = typing_extensions.override  # type: ignore[attr-defined]
    sys.path.insert(0, source)
    warnings.filterwarnings("ignore")
    from megatron.training.arguments import add_megatron_arguments

    parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    out = {}
    for a in parser._actions:
        for opt in a.option_strings:
            if opt.startswith("--"):
                out[opt] = {"dest": a.dest, "kind": _kind(a), "type": _type(a),
                            "nargs": a.nargs if isinstance(a.nargs, (int, str)) else None,
                            "choices": sorted(map(str, a.choices)) if a.choices else None}
    return out


def _dataclass_fields(cls) -> list[str]:
    return sorted(f.name for f in dataclasses.fields(cls))


def _ast_fields(path: Path, cls_name: str) -> list[str]:
    """Annotated class attributes of ``cls_name`` in ``path`` (a dataclass's own fields)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls_name:
            return [n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    raise SystemExit(f"{cls_name} not found in {path}")


def bridge_fields(lm_source: str, bridge_source: str) -> dict[str, list[str]]:
    """The fields of each ConfigContainer section an export sets: megatron-core's dataclasses (from the
    Megatron-LM checkout) and Megatron-Bridge's own additions (read from its source)."""
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer import TransformerConfig
    from megatron.training.config import TrainingConfig

    b = Path(bridge_source) / "src/megatron/bridge"
    model = set(_dataclass_fields(TransformerConfig))
    model |= set(_ast_fields(b / "models/gpt_provider.py", "GPTModelProvider"))
    return {
        "model": sorted(model),
        "train": sorted(set(_dataclass_fields(TrainingConfig)) | set(_ast_fields(b / "training/config.py",
                                                                             "TrainingConfig"))),
        "ddp": sorted(set(_dataclass_fields(DistributedDataParallelConfig))
                      | set(_ast_fields(b / "training/config.py", "DistributedDataParallelConfig"))),
        "optimizer": sorted(set(_dataclass_fields(OptimizerConfig))
                            | set(_ast_fields(b / "training/config.py", "OptimizerConfig"))),
        "comm_overlap": sorted(_ast_fields(b / "training/comm_overlap.py", "CommOverlapConfig")),
        "dataset": ["seq_length", "sequence_length"],
        "mixed_precision": sorted(n.name for n in ast.walk(ast.parse((b / "training/mixed_precision.py").read_text()))
                                  if isinstance(n, ast.FunctionDef) and n.name.endswith("_mixed")
                                  and not n.name.startswith("_")),
    }


def megatron_deepspeed_flags(source: str) -> dict[str, dict]:
    """Megatron-DeepSpeed's flags (megatron/arguments.py, literal add_argument calls read from the source: it
    imports a Megatron of its own, which this checkout's would shadow), DeepSpeed's --deepspeed and
    --deepspeed_config (deepspeed.add_config_arguments) added."""
    tree = ast.parse((Path(source) / "megatron/arguments.py").read_text())
    out = {"--deepspeed": {"kind": "store_true"}, "--deepspeed_config": {"kind": "store"}}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            opts = [a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")]
            kw = {k.arg: k.value for k in node.keywords}
            action = kw.get("action")
            kind = action.value if isinstance(action, ast.Constant) else "store"
            for opt in opts:
                out[opt] = {"kind": kind}
    return out


def main() -> None:
    lm, bridge = os.environ["MEGATRON_LM_SOURCE"], os.environ["MEGATRON_BRIDGE_SOURCE"]
    mds = os.environ["MEGATRON_DEEPSPEED_SOURCE"]
    commit_lm, commit_bridge, commit_mds = sys.argv[1], sys.argv[2], sys.argv[3]
    table = {"megatron_lm": {"source": f"NVIDIA/Megatron-LM@{commit_lm}", "flags": megatron_lm_flags(lm)},
             "bridge": {"source": f"NVIDIA-NeMo/Megatron-Bridge@{commit_bridge} with megatron-core from "
                                  f"NVIDIA/Megatron-LM@{commit_lm}", "sections": bridge_fields(lm, bridge)},
             "megatron_deepspeed": {"source": f"deepspeedai/Megatron-DeepSpeed@{commit_mds}",
                                    "flags": megatron_deepspeed_flags(mds)}}
    OUT.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT}: {len(table['megatron_lm']['flags'])} flags")


if __name__ == "__main__":
    main()
