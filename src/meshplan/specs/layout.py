"""Megatron-core's pipeline layout strings (``--pipeline-model-parallel-layout``).

A layout lists the model chunks in order, separated by ``|``: chunk c runs on pipeline rank c mod pp
(the interleaved schedule's assignment). In a chunk, ``E`` is the embedding, ``t`` one decoder layer,
``m`` one multi-token-prediction layer and ``L`` the LM head and loss; ``x*n`` repeats a symbol and
``(...)*n`` a group, which may span chunks. DeepSeek-V3's layout for 16 chunks in Megatron-Bridge:
``Et*4|(t*4|)*14tmL`` (src/megatron/bridge/recipes/deepseek/deepseek_v3.py, ``pipeline_model_parallel_layout``
map). meshplan reads the decoder layers per chunk; the embedding must be in the first chunk and the loss in
the last, and meshplan runs MTP layers on the last pipeline rank only (Plan checks that their chunks are
there; Megatron also allows them elsewhere). Commas are cosmetic, as in Megatron, but a plan string
cannot carry them (its items are comma-separated).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

from meshplan.errors import SpecError

_GROUP = re.compile(r"\(([^()]*)\)\*(\d+)")
_SYMBOL = re.compile(r"([EtmL])\*(\d+)")
_SYMBOLS = set("EtmL|")
MAX_LAYOUT_SYMBOLS = 1_000_000
"""The longest a layout may be once its repeats are expanded (specs.model.MAX_LAYERS layers and their
chunk separators fit ten times over)."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """One model chunk of a layout: decoder layers, and what else it holds."""

    layers: int
    embedding: bool
    mtp: int
    loss: bool


@functools.lru_cache(maxsize=256)
def parse_layout(text: str, field: str = "plan.layout") -> tuple[Chunk, ...]:
    """The chunks of a layout string; SpecError naming ``field`` if it is malformed (memoised: every
    Plan with a layout checks it on construction)."""
    grown = [0]  # symbols the repeats of one pass have added

    def repeat(g: re.Match[str]) -> str:
        unit, times = g.group(1), g.group(2)
        if len(times) > 7 or grown[0] + len(unit) * int(times) > MAX_LAYOUT_SYMBOLS:
            raise SpecError(field, f"{text!r} expands to more than {MAX_LAYOUT_SYMBOLS:,} symbols")
        grown[0] += len(unit) * int(times)
        return unit * int(times)

    s = text.replace(" ", "").replace(",", "")  # Megatron treats commas as cosmetic
    for _ in range(64):  # innermost groups first
        grown[0] = len(s)
        expanded = _GROUP.sub(repeat, s)
        if expanded == s:
            break
        s = expanded
    grown[0] = len(s)
    s = _SYMBOL.sub(repeat, s)
    bad = sorted(set(s) - _SYMBOLS)
    if bad or not s:
        raise SpecError(field, f"{text!r} is not a Megatron pipeline layout: use E (embedding), t (decoder "
                               f"layer), m (MTP layer), L (loss), | between chunks, x*n and (...)*n repeats"
                               + (f"; unexpected {''.join(bad)!r}" if bad else ""))
    chunks = tuple(Chunk(layers=c.count("t"), embedding="E" in c, mtp=c.count("m"), loss="L" in c)
                   for c in s.split("|"))
    if any(c.embedding for c in chunks[1:]) or s.count("E") > 1:
        raise SpecError(field, f"{text!r}: the embedding (E) belongs to the first chunk, once")
    if any(c.loss for c in chunks[:-1]) or s.count("L") > 1:
        raise SpecError(field, f"{text!r}: the loss (L) belongs to the last chunk, once")
    return chunks


def layers_per_stage(chunk_layers: Sequence[int], pp: int) -> list[int]:
    """Decoder layers on each pipeline rank, from the layers of each model chunk: chunk c runs on rank
    c mod pp."""
    return [sum(chunk_layers[s::pp]) for s in range(pp)]


def embedding_loss_layout(n_layers: int, chunks: int) -> str | None:
    """The layout Megatron-core builds with ``account_for_embedding_in_pipeline_split`` and
    ``account_for_loss_in_pipeline_split``, or None where that split does not apply.

    Megatron-core splits n_layers + 2 slots evenly over the ``chunks`` model chunks (pp x virtual stages),
    the embedding taking a slot of the first chunk and the loss one of the last, so those two build one
    decoder layer fewer, none when a chunk has a single slot (``transformer_config.py`` __post_init__,
    ``get_transformer_layer_offset``; NVIDIA/Megatron-LM @002526d). Without a flag or a layout it asserts
    that the chunks divide n_layers, so a run whose chunks divide n_layers + 2 and not n_layers set both
    flags, as Megatron-Bridge's Llama 3.1 405B and Qwen3-235B-A22B recipes do (``recipes/llama/llama3.py``
    @6f6f95e, ``recipes/qwen/qwen3_moe.py`` @2afd2d3). None when the chunks divide n_layers, or not
    n_layers + 2, or with one chunk."""
    if chunks < 2 or n_layers % chunks == 0 or (n_layers + 2) % chunks:
        return None
    k = (n_layers + 2) // chunks
    edge = f"t*{k - 1}" if k > 1 else ""
    middle = f"(t*{k}|)*{chunks - 2}" if chunks > 2 else ""
    return f"E{edge}|{middle}{edge}L"


def is_embedding_loss_layout(layout: str) -> bool:
    """Whether ``layout`` is Megatron's embedding-and-loss split of its own decoder layers
    (``embedding_loss_layout``): a layout that follows from the model's layer count and the chunk count."""
    if not layout:
        return False
    chunks = parse_layout(layout)
    return embedding_loss_layout(sum(c.layers for c in chunks), len(chunks)) == layout


def resplit(layout: str, n_layers: int) -> str:
    """``layout`` for a model of ``n_layers`` decoder layers: the embedding-and-loss split over the same
    chunks where ``layout`` is that split (none where those chunks divide n_layers, or where they divide
    neither n_layers nor n_layers + 2), any other layout unchanged (it names its layers one by one)."""
    if not is_embedding_loss_layout(layout):
        return layout
    return embedding_loss_layout(n_layers, len(parse_layout(layout))) or ""
