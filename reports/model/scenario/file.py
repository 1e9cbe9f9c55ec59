"""The scenario file (`configs/scenarios/<name>.json`) as a typed, validated `Scenario`.

A scenario says what is deployed (model, GPU, pp, async depth, graphs, arrival, and any server
setting the launch command gives) and the workload, plus stated estimates for what no probe has
measured and the assumptions behind them; reports/model/scenario/inputs.py turns it and the records
into the model's inputs. `read_scenario` is the one reader: every field is checked (type and
range) before any is used, and a bad one is a one-line CliError naming the file and the field
(`pp`, `concurrency[2]`, `estimates.host_us`); the CLI exits 2 on it.

One name per quantity. Two context lengths mean different things:
- `mean_context_tokens`: the mean number of tokens in a decoding request's KV cache (about
  prompt + output / 2), which sets the attention's bytes in the roofline
  (reports/base/roofline.py); default 2048. Older files call it `context_len`.
- `max_context_length`: SGLang's `--context-length`, the longest request the server accepts,
  which sizes SGLang's default `max_running_requests` (reports/base/sglang_defaults.py,
  `resolve_max_running_requests`); default the model's `max_position_embeddings`. Older files
  call it `context_length`.
The older names are still read.

A `Scenario` is also a read-only mapping of its file form (new names), so an edited copy
(`dict(scenario, pp=4)`) goes back through the same reader.

Bounds: what the model answers in seconds, each stated in the error that refuses it.
- `pp` from 1 to `MAX_PP` (16), and at most the model's layers (every stage holds one;
  reports/model/scenario/inputs.py, which also refuses a deployment whose weights do not fit
  its GPUs);
- `async_depth` from 0 to `MAX_RANK_VISITS // pp - pp`: pp x (pp + async_depth) at most 512
  rank visits per simulated round (56 at PP8, 16 at PP16);
- `concurrency`: 1 to `MAX_POINTS` (8) values, each from 1 to `MAX_CONCURRENCY` (4096);
- `estimates.zipf_s` from 0 to `MAX_ZIPF_S` (2).
"""
from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterator

from reports.base.errors import CliError
from reports.base.paths import CONFIGS, read_input_json
from reports.base.roofline import DEFAULT_CONTEXT

MAX_SCENARIO_BYTES = 4 << 20   # a scenario is a few kB
MAX_CONCURRENCY = 4096         # the model simulates every request's slot: bound its work
# What the model answers in seconds (module docstring, "Bounds"): the loop is simulated rank by
# rank, every rank visiting every slot (pp + async_depth of them) each round, for every
# concurrency, what-if and attribution switch; and the routing Monte-Carlo draws its tokens'
# experts one by one, which a steep skew makes slow (the k-th most popular expert is drawn about
# once in 1 / its share).
MAX_PP = 16
MAX_RANK_VISITS = 512          # pp x (pp + async_depth): rank visits per simulated round
MAX_ZIPF_S = 2.0
MAX_POINTS = 8                 # concurrencies in one scenario (each is simulated in full)
SOURCE_KEY = "_scenario_file"  # file form: the path the scenario was read from
_POS_INT = 1 << 40             # bound on counts (tokens, requests): beyond any deployment
_SETTINGS = {  # optional integer settings: (lowest, highest)
    "tp": (1, 4096), "graph_max_bs": (1, 1 << 16), "max_micro_batch": (1, 1 << 16),
    "max_running_requests": (1, 1 << 24), "chunked_prefill_size": (-1, _POS_INT),
    "max_prefill_tokens": (1, _POS_INT), "mean_context_tokens": (1, _POS_INT),
    "max_context_length": (1, _POS_INT), "prompt_len": (1, _POS_INT),
    "output_len": (1, _POS_INT)}
OLD_NAMES = {"context_len": "mean_context_tokens", "context_length": "max_context_length"}
ESTIMATES = ("hop_fixed_us", "host_us", "launch_us", "process_us", "empty_us", "chain_us",
             "eager_us_per_layer", "zipf_s")


@dataclass(frozen=True)
class Estimates:
    """Stated estimates for what no probe measured (0 when not stated). `efficiency_by_batch`:
    (batch, fraction of the roofline floor reached), sorted by batch."""
    efficiency_by_batch: tuple[tuple[int, float], ...] = ((1, 1.0),)
    hop_fixed_us: float = 0.0
    host_us: float = 0.0
    launch_us: float = 0.0
    process_us: float = 0.0
    empty_us: float = 0.0
    chain_us: float = 0.0
    eager_us_per_layer: float = 0.0
    zipf_s: float = 0.0

    def file_form(self) -> dict[str, Any]:
        return {"efficiency_by_batch": {str(b): e for b, e in self.efficiency_by_batch},
                **{k: getattr(self, k) for k in ESTIMATES}}


@dataclass(frozen=True)
class Scenario(Mapping):
    """One scenario file, checked. Settings left out are None (SGLang's default applies);
    `assumptions` maps a field to why the scenario assumes it (an assumed setting is
    `estimated`, a stated one without an assumption `given`)."""
    name: str
    model: str
    gpu: str
    pp: int
    async_depth: int
    concurrency: tuple[int, ...]
    source: str = ""
    cuda_graphs: bool = True
    arrival: str = "burst"
    layer_partition: str | None = None
    tp: int = 1
    graph_max_bs: int | None = None
    max_micro_batch: int | None = None
    max_running_requests: int | None = None
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int | None = None
    prompt_len: int | None = None
    output_len: int | None = None
    range_ratio: float | None = None
    mean_context_tokens: int = DEFAULT_CONTEXT
    max_context_length: int | None = None
    kernel_record: str | None = None
    twin_record: str | None = None
    observed_tok_per_s: tuple[tuple[int, float], ...] = ()
    estimates: Estimates = field(default_factory=Estimates)
    assumptions: tuple[tuple[str, str], ...] = ()

    def assumed(self, key: str) -> bool:
        return any(k == key for k, _ in self.assumptions)

    def assumption(self, key: str, default: str) -> str:
        return next((v for k, v in self.assumptions if k == key), default)

    def file_form(self) -> dict[str, Any]:
        """The scenario as a file would say it (new names), `read_scenario`'s input."""
        d: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "source":
                d[SOURCE_KEY] = v
            elif f.name == "estimates":
                d[f.name] = v.file_form()
            elif f.name == "assumptions":
                d[f.name] = dict(v)
            elif f.name == "observed_tok_per_s":
                d[f.name] = {str(c): t for c, t in v}
            elif f.name == "concurrency":
                d[f.name] = list(v)
            else:
                d[f.name] = v
        return d

    # read-only mapping of the file form (see the module docstring)
    def __getitem__(self, key: str) -> Any:
        return self.file_form()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.file_form())

    def __len__(self) -> int:
        return len(self.file_form())


def scenario_path(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.suffix == ".json" or p.exists():
        return p
    return CONFIGS / "scenarios" / f"{name_or_path}.json"


def load_scenario(name_or_path: str) -> Scenario:
    """A shipped scenario by name, or the user's file; errors name the file as given."""
    p = scenario_path(name_or_path)
    if not os.path.lexists(p):
        names = sorted(x.stem for x in (CONFIGS / "scenarios").glob("*.json"))
        raise CliError(f"no scenario {name_or_path!r} (shipped: {', '.join(names)})")
    d = read_input_json(p, "scenario", MAX_SCENARIO_BYTES)
    if not isinstance(d, dict):
        raise CliError(f"{p}: a scenario is a JSON object, got {type(d).__name__}")
    return read_scenario({**d, SOURCE_KEY: str(p)}, p.stem)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _renamed(d: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The file's fields under today's names (an older name is read as its new one)."""
    out = dict(d)
    for old, new in OLD_NAMES.items():
        if old in out:
            if out.get(new) is not None and out[old] is not None:
                raise CliError(f"{where}: fields {old!r} and {new!r} name the same quantity; "
                               f"give {new!r} only")
            v = out.pop(old)
            out[new] = out.get(new) if v is None else v
    return out


def read_scenario(d: Mapping[str, Any], default_name: str = "scenario") -> Scenario:
    """The one reader: a scenario's file form -> `Scenario`, every field checked first."""
    source = str(d.get(SOURCE_KEY) or "")
    where = source or default_name
    d = _renamed(d, where)

    def bad(key: str, want: str) -> CliError:
        v = repr(d.get(key.split(".")[0].split("[")[0]))
        return CliError(f"{where}: field {key!r} must be {want}, got "
                        f"{v if len(v) <= 40 else v[:37] + '...'}")
    for key in ("model", "gpu", "pp", "async_depth", "concurrency"):
        if key not in d:
            raise CliError(f"{where}: scenario lacks {key!r}")
    for key in ("model", "gpu"):
        if not isinstance(d[key], str) or not d[key].strip():
            raise bad(key, "a preset name or a config path (a string)")
    if "name" in d and not isinstance(d["name"], str):
        raise bad("name", "a string")
    if not _is_int(d["pp"]) or not 1 <= d["pp"] <= MAX_PP:
        raise bad("pp", f"an integer from 1 to {MAX_PP} (and at most the model's layers)")
    top_depth = MAX_RANK_VISITS // d["pp"] - d["pp"]
    if not _is_int(d["async_depth"]) or not 0 <= d["async_depth"] <= top_depth:
        raise bad("async_depth", f"an integer from 0 to {top_depth} at pp={d['pp']} "
                                 f"(pp x (pp + async_depth) at most {MAX_RANK_VISITS})")
    conc = d["concurrency"]
    if not isinstance(conc, (list, tuple)) or not 1 <= len(conc) <= MAX_POINTS:
        raise bad("concurrency", f"a list of 1 to {MAX_POINTS} concurrencies like [1, 8, 32]")
    for i, c in enumerate(conc):
        if not _is_int(c) or not 1 <= c <= MAX_CONCURRENCY:
            raise CliError(f"{where}: field 'concurrency[{i}]' must be an integer from 1 to "
                           f"{MAX_CONCURRENCY}, got {repr(c)[:40]}")
    for key, (lo, hi) in _SETTINGS.items():
        v = d.get(key)
        if v is not None and (not _is_int(v) or not lo <= v <= hi):
            raise bad(key, f"an integer from {lo} to {hi}")
    if d.get("range_ratio") is not None and not (_is_num(d["range_ratio"])
                                                 and 0 <= d["range_ratio"] <= 1):
        raise bad("range_ratio", "a number from 0 to 1")
    if "cuda_graphs" in d and not isinstance(d["cuda_graphs"], bool):
        raise bad("cuda_graphs", "true or false")
    if d.get("arrival") is not None and not isinstance(d["arrival"], str):
        raise bad("arrival", "a string (burst, staggered, even)")
    if d.get("layer_partition") is not None and not isinstance(d["layer_partition"], str):
        raise bad("layer_partition", "a string like \"8,8,8,...\" (SGLANG_PP_LAYER_PARTITION)")
    if d.get("kernel_record") is not None and not isinstance(d["kernel_record"], str):
        raise bad("kernel_record", "a record file name in configs/records (a string)")
    if d.get("twin_record") is not None and not isinstance(d["twin_record"], str):
        raise bad("twin_record", "a twin record's file name in configs/records (a string)")
    for key in ("assumptions", "estimates", "observed_tok_per_s"):
        if d.get(key) is not None and not isinstance(d[key], dict):
            raise bad(key, "an object")
    observed = _observed(d.get("observed_tok_per_s") or {}, where)
    return Scenario(
        name=d["name"] if "name" in d else default_name, model=d["model"], gpu=d["gpu"],
        pp=d["pp"], async_depth=d["async_depth"], concurrency=tuple(conc), source=source,
        cuda_graphs=d.get("cuda_graphs", True), arrival=d.get("arrival") or "burst",
        layer_partition=d.get("layer_partition"), tp=d.get("tp") or 1,
        graph_max_bs=d.get("graph_max_bs"), max_micro_batch=d.get("max_micro_batch"),
        max_running_requests=d.get("max_running_requests"),
        chunked_prefill_size=d.get("chunked_prefill_size"),
        max_prefill_tokens=d.get("max_prefill_tokens"), prompt_len=d.get("prompt_len"),
        output_len=d.get("output_len"), range_ratio=d.get("range_ratio"),
        mean_context_tokens=d.get("mean_context_tokens") or DEFAULT_CONTEXT,
        max_context_length=d.get("max_context_length"),
        kernel_record=d.get("kernel_record") or None,
        twin_record=d.get("twin_record") or None, observed_tok_per_s=observed,
        estimates=_estimates(d.get("estimates") or {}, where),
        assumptions=tuple((str(k), str(v)) for k, v in (d.get("assumptions") or {}).items()))


def _observed(obs: dict, where: str) -> tuple[tuple[int, float], ...]:
    for c, v in obs.items():
        if not (str(c).isdigit() and 1 <= int(c) <= 1 << 20) or not (_is_num(v) and 0 < v < 1e9):
            raise CliError(f"{where}: field 'observed_tok_per_s.{str(c)[:20]}' must map a "
                           f"concurrency to a positive tok/s, got {str(v)[:40]!r}")
    return tuple(sorted({int(c): float(v) for c, v in obs.items()}.items()))


def _estimates(est: dict, where: str) -> Estimates:
    for k, v in est.items():
        if k == "efficiency_by_batch":
            if not isinstance(v, dict) or not v:
                raise CliError(f"{where}: field 'estimates.efficiency_by_batch' must be an "
                               "object like {\"1\": 0.46, \"8\": 0.65}")
            for b, e in v.items():
                if not (str(b).isdigit() and 1 <= int(b) <= 1 << 20) or not (
                        _is_num(e) and 0 < e <= 1):
                    raise CliError(f"{where}: field 'estimates.efficiency_by_batch.{str(b)[:20]}'"
                                   f" must map a batch size to a fraction in (0, 1], got "
                                   f"{str(e)[:40]!r}")
        elif k == "zipf_s" and not (_is_num(v) and 0 <= v <= MAX_ZIPF_S):
            raise CliError(f"{where}: field 'estimates.zipf_s' must be a number from 0 to "
                           f"{MAX_ZIPF_S:g} (expert-routing skew; 1 is already strong), got "
                           f"{str(v)[:40]!r}")
        elif not (_is_num(v) and 0 <= v < 1e9):
            raise CliError(f"{where}: field 'estimates.{str(k)[:40]}' must be a number from 0 "
                           f"to 1e9, got {str(v)[:40]!r}")
    eff = est.get("efficiency_by_batch", {"1": 1.0})
    return Estimates(tuple(sorted((int(b), float(e)) for b, e in eff.items())),
                     **{k: float(est.get(k, 0.0)) for k in ESTIMATES})
