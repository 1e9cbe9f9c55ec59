"""What every rank of the PP-loop probe reads: the server settings, the stage work, the points.

`probe.py` builds one `RankConfig` from the command line (`DispatchConfig`) and the model
preset, writes its wire form (`to_wire`, a flat JSON object) for torchrun, and each rank reads
it back (`from_wire`) before anything runs; the loop (`pp_loop.py`), its stages (`pp_stage.py`),
its messages (`pp_comm.py`) and serve mode read attributes, never keys. The server settings are
`reports.base.server_settings.ServerSettings`, so the slot count and the per-slot cap come from
there. `from_wire` fills what a wire form leaves out with the defaults below (a hand-written
config for one function, as the tests give). Pure: no torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from reports.base.server_settings import ServerSettings, SettingsNames
from reports.base.sglang_defaults import MAX_PREFILL_TOKENS


@dataclass(frozen=True)
class ServeAt:
    """Serve mode: where rank 0 answers HTTP, the admission policy, how long (None: until a
    signal)."""
    host: str
    port: int
    policy: str = "sglang"
    seconds: float | None = None


@dataclass(frozen=True)
class RankConfig(SettingsNames):
    """One run of the loop on every rank. `server.pp_max_micro_batch_size` is the resolved
    cap; `server.disable_cuda_graph` is set where graphs are off or cannot run (a CPU)."""
    server: ServerSettings
    work: str = "moe"                       # busy | moe (pp_stage.py)
    moe_variant: str = "auto"
    layers_per_stage: int = 2
    cost_points: tuple[tuple[int, float], ...] = ()   # busy: (batch, us)
    model: str = "kimi-k2"
    hidden: int = 0
    moe_intermediate: int = 0
    n_routed_experts: int = 0
    top_k: int = 0
    n_shared_experts: int = 0
    device: str = "cuda"
    micro_batches: int | None = None        # `even` policy: None = pp
    concurrency: tuple[int, ...] = (1,)
    prompt_len: int = 1
    stagger_ms: float = 2.0
    poisson_rate_per_s: float = 500.0
    seconds_per_point: float = 2.0
    max_iters_per_point: int = 20000
    seed: int = 0
    collective_timeout_s: float = 120.0
    profile_dir: str | None = None
    inject: tuple[str, ...] = ()
    serve: ServeAt | None = None
    points: tuple[dict, ...] = ()           # {"policy", "arrival", "concurrency", "inject"}

    @property
    def max_micro_batch(self) -> int | None:
        return self.server.max_micro_batch

    def to_wire(self) -> dict[str, Any]:
        """The JSON object the ranks read (`from_wire` reads it back)."""
        s = self.server
        serve = None if self.serve is None else {
            "host": self.serve.host, "port": self.serve.port, "policy": self.serve.policy,
            "seconds": self.serve.seconds}
        return {"pp": s.pp_size, "async_depth": s.pp_async_batch_depth,
                "max_micro_batch": s.max_micro_batch, "micro_batches": self.micro_batches,
                "work": self.work, "moe_variant": self.moe_variant,
                "layers_per_stage": self.layers_per_stage,
                "cost_points": [list(p) for p in self.cost_points], "model": self.model,
                "hidden": self.hidden, "moe_intermediate": self.moe_intermediate,
                "n_routed_experts": self.n_routed_experts, "top_k": self.top_k,
                "n_shared_experts": self.n_shared_experts, "device": self.device,
                "graphs": s.graphs, "concurrency": list(self.concurrency),
                "prompt_len": self.prompt_len, "stagger_ms": self.stagger_ms,
                "poisson_rate_per_s": self.poisson_rate_per_s,
                "seconds_per_point": self.seconds_per_point,
                "max_iters_per_point": self.max_iters_per_point, "seed": self.seed,
                "collective_timeout_s": self.collective_timeout_s,
                "profile_dir": self.profile_dir, "inject": list(self.inject),
                "max_running_requests": s.max_running_requests,
                "chunked_prefill_size": s.chunked_prefill_size,
                "max_prefill_tokens": s.max_prefill_tokens,
                "serve": serve, "points": [dict(p) for p in self.points]}

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> "RankConfig":
        """The wire form (`to_wire`) -> RankConfig; a key left out takes its default."""
        server = ServerSettings(
            pp_size=int(d.get("pp", 1)), pp_async_batch_depth=int(d.get("async_depth") or 0),
            max_running_requests=d.get("max_running_requests"),
            pp_max_micro_batch_size=d.get("max_micro_batch"),
            chunked_prefill_size=d.get("chunked_prefill_size"),
            max_prefill_tokens=d.get("max_prefill_tokens") or MAX_PREFILL_TOKENS,
            disable_cuda_graph=not d.get("graphs", False))
        sv = d.get("serve")
        serve = None if not sv else ServeAt(sv["host"], int(sv["port"]),
                                            sv.get("policy", "sglang"), sv.get("seconds"))
        plain = {k: d[k] for k in _PLAIN if k in d}
        return cls(server=server, serve=serve,
                   cost_points=tuple((int(b), float(us)) for b, us in d.get("cost_points") or ()),
                   concurrency=tuple(d.get("concurrency") or (1,)),
                   inject=tuple(d.get("inject") or ()),
                   points=tuple(dict(p) for p in d.get("points") or ()), **plain)


_PLAIN = ("work", "moe_variant", "layers_per_stage", "model", "hidden", "moe_intermediate",
          "n_routed_experts", "top_k", "n_shared_experts", "device", "micro_batches",
          "prompt_len", "stagger_ms", "poisson_rate_per_s", "seconds_per_point",
          "max_iters_per_point", "seed", "collective_timeout_s", "profile_dir")


def rank_config(cfg: RankConfig | Mapping[str, Any]) -> RankConfig:
    """A RankConfig as given, or read from its wire form."""
    return cfg if isinstance(cfg, RankConfig) else RankConfig.from_wire(cfg)
