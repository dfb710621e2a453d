"""XLA through torchax: PyTorch modules on JAX arrays, the whole training step jitted once by JAX.

``xla.backend: torchax`` (or ``auto`` where torch_xla does not match the installed torch). One process drives every
local JAX device (a TPU host's chips, or ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` virtual CPU
devices): each batch is sharded along its first dimension over a 1-D mesh named ``data``; weights are replicated and
XLA's partitioner inserts the gradient reduction.

The torch objects (the network, its EMA copy, the torch optimizer and scheduler) stay on the CPU and stay the truth
for everything but the step: checkpoints, validation, ``weights()`` and resume read and write them as on every other
accelerator. The step (``run_train_step``) keeps the trained state as JAX arrays between steps and writes it back into
the torch objects when the model asks for them (``sync_model``); a change made to the torch objects meanwhile (a
resume, a NaN rollback) is noticed and the JAX state rebuilt from them.

The step: forward (``torch.func.functional_call`` under torchax), the model's losses (``model.step_losses``),
backward (``jax.value_and_grad``), gradient clipping as ``clip_grad_norm_``, Adam / AdamW with torch's update rule and
state layout, the EMA lerp. Learning rates, bias corrections and the EMA weight are array inputs, so a new learning
rate never recompiles. Randomness (drop-path, dropout) comes from a JAX key handed in and returned by each step; it is
the device RNG state of the training state (``device_rng_state``).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torchax
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from torch import nn

from anysr.accelerators.base import Accelerator, LaunchPlan
from anysr.accelerators.strategy import Strategy
from anysr.errors import AcceleratorError

ADAM_KINDS = {"Adam": False, "AdamW": True}  # torch optimizer class -> decoupled weight decay (AdamW's)


class _Compiles:
    """Process-wide counts of JAX's backend compiles and persistent-cache hits (JAX's monitoring events)."""

    def __init__(self) -> None:
        self.compiles = 0
        self.cache_hits = 0
        self.cache_misses = 0
        self._lock = threading.Lock()
        self.installed = False

    def install(self) -> None:
        if self.installed:
            return
        self.installed = True
        jax.monitoring.register_event_duration_secs_listener(self._on_duration)
        jax.monitoring.register_event_listener(self._on_event)

    def _on_duration(self, event: str, duration: float, **kwargs: Any) -> None:
        del duration, kwargs
        if event == "/jax/compilation_cache/compile_time_saved_sec":
            return
        if event.endswith("backend_compile_duration"):
            with self._lock:
                self.compiles += 1

    def _on_event(self, event: str, **kwargs: Any) -> None:
        del kwargs
        with self._lock:
            if event == "/jax/compilation_cache/cache_hits":
                self.cache_hits += 1
            elif event == "/jax/compilation_cache/cache_misses":
                self.cache_misses += 1


COMPILES = _Compiles()


def compile_cache_dir() -> Path:
    """JAX's persistent compilation cache: ``ANYSR_JAX_CACHE``, else ``<ANYSR_CACHE_DIR or ~/.cache/anysr>/jax``."""
    explicit = os.environ.get("ANYSR_JAX_CACHE", "").strip()
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("ANYSR_CACHE_DIR", "").strip()
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "anysr") / "jax"


class TorchaxStrategy(Strategy):
    """One process over the local JAX devices: one rank, the batch sharded over a 1-D mesh ``data``."""

    def __init__(self, plan: LaunchPlan, local_rank: int = 0) -> None:
        super().__init__(plan, local_rank)
        self.devices: list[Any] = []
        self.mesh: Mesh | None = None

    def join_world(self) -> None:
        local = jax.local_devices()
        self.devices = local if self.plan.extra.get("all_devices", True) else local[:1]
        self.mesh = Mesh(np.array(self.devices), ("data",))

    @property
    def data_parallel_size(self) -> int:
        return max(1, len(self.devices))


@dataclass
class _StepState:
    """One model's jitted step and its JAX state (``None`` until built from the torch objects)."""

    fn: Callable[..., Any]
    names: list[str]  # trained parameters, in the optimizer's order
    group_of: list[int]  # each trained parameter's param group
    frozen: list[str]  # parameters not trained and buffers: constants of the forward
    state: dict[str, Any] | None = None  # params, exp_avg, exp_avg_sq, ema, ema_buffers
    steps: int = 0  # optimizer steps taken (torch's per-parameter ``step``, equal for all)
    fingerprint: tuple[Any, ...] = ()
    stale: bool = False  # the torch objects are behind the JAX state
    extras: dict[str, Any] = field(default_factory=dict)


class TorchaxAccelerator(Accelerator):
    """``accelerator: xla`` through torchax and JAX (one process, every local device)."""

    name = "xla"
    stats_in_log = True
    strategy_class = TorchaxStrategy
    strategy: TorchaxStrategy

    def __init__(self, plan: LaunchPlan, local_rank: int = 0) -> None:
        super().__init__(plan, local_rank)
        self.env = torchax.default_env()
        self._key: jax.Array = jax.random.PRNGKey(0)
        self._steps: dict[int, _StepState] = {}
        self._eval: dict[int, dict[str, Any]] = {}  # id(net) -> its jitted forward and uploaded weights
        self._base_compiles = 0
        self._base_cache = (0, 0)
        self._warm_compiles: int | None = None
        self._warned_compiles = 0
        self.cache_dir: Path | None = None
        self._platform = "cpu"

    # ---------------------------------------------------------------- lifecycle
    def setup(self) -> None:
        COMPILES.install()
        precision = str(self.plan.extra.get("matmul_precision", "default"))
        jax.config.update("jax_default_matmul_precision", None if precision == "default" else precision)
        self.cache_dir = compile_cache_dir()
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            jax.config.update("jax_compilation_cache_dir", str(self.cache_dir))
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
            jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
        except OSError:
            self.cache_dir = None  # a read-only home: compile every run
        self.strategy.join_world()
        self._platform = self.strategy.devices[0].platform
        self._base_compiles = COMPILES.compiles
        self._base_cache = (COMPILES.cache_hits, COMPILES.cache_misses)
        self.decide_hardware()

    def native_bf16(self) -> tuple[bool, str]:
        if self._platform == "tpu":
            return True, "TPUs compute in bf16"
        return False, f"JAX {self._platform.upper()} does not run bf16 natively"

    @property
    def device(self) -> torch.device:
        """The torch objects live on the CPU; the step's arrays on the JAX devices."""
        return torch.device("cpu")

    @property
    def static_shapes(self) -> bool:
        return True

    @property
    def batch_multiplier(self) -> int:
        return self.strategy.data_parallel_size

    def _place(self, precision: str) -> str:
        devices = self.strategy.devices
        kind = devices[0].platform.upper() if devices else "?"
        cache = f"compile cache {self.cache_dir}" if self.cache_dir is not None else "no compile cache"
        matmul = self.plan.extra.get("matmul_precision", "default")
        return (f"xla (torchax on JAX {jax.__version__}, {kind}) over {len(devices)} device(s), batch sharded "
                f"({precision}matmul precision {matmul}, {cache})")

    def place(self) -> str:
        return self._place("")

    def describe(self) -> str:
        return self._place(f"{self.precision.name}, ")

    # ---------------------------------------------------------------- randomness
    def manual_seed(self, seed: int) -> None:
        super().manual_seed(seed)
        self._key = jax.random.PRNGKey(int(seed) % (2**32))

    def device_rng_state(self) -> Any:
        """The step's JAX key (two uint32 words) as an int64 tensor: a ``weights_only``-loadable state."""
        return torch.from_numpy(np.asarray(self._key).astype(np.int64))

    def set_device_rng_state(self, state: Any) -> None:
        words = np.asarray(state.numpy() if isinstance(state, torch.Tensor) else state, dtype=np.int64)
        if words.shape != (2,):  # a state saved by another accelerator (a torch_xla seed): start a key from it
            words = np.asarray(jax.random.PRNGKey(int(words.reshape(-1)[0]) % (2**32)))
        self._key = jnp.asarray(words.astype(np.uint32))

    # ---------------------------------------------------------------- counters
    def _compiles(self) -> int:
        return COMPILES.compiles - self._base_compiles

    def stats(self) -> dict[str, Any]:
        """JAX's backend compiles since ``setup`` (and since the warm-up point), persistent-cache hits and misses."""
        compiles = self._compiles()
        return {
            "compiles": compiles,
            "compiles_after_warmup": None if self._warm_compiles is None else compiles - self._warm_compiles,
            "to_host_calls": self._host_transfers,
            "persistent_cache": {"dir": str(self.cache_dir) if self.cache_dir else None,
                                 "hits": COMPILES.cache_hits - self._base_cache[0],
                                 "misses": COMPILES.cache_misses - self._base_cache[1]},
        }

    def mark_warmup_done(self) -> None:
        self._warm_compiles = self._compiles()
        self._warned_compiles = self._warm_compiles

    def rewarm(self) -> None:
        if self._warm_compiles is not None:
            self.mark_warmup_done()

    def check_recompiles(self) -> str | None:
        if self._warm_compiles is None:
            return None
        now = self._compiles()
        if now <= self._warned_compiles:
            return None
        self._warned_compiles = now
        return (f"JAX compiled {now - self._warm_compiles} new graph(s) after warm-up ({now} in total): a shape or "
                "a Python value changes between steps")

    def compile_model(self, net: nn.Module) -> nn.Module:
        return net

    # ---------------------------------------------------------------- the jitted step
    def run_train_step(self, model: Any, batches: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor] | None:
        """One training step of ``model`` jitted whole; the losses (CPU tensors, averaged over micro-batches).

        ``model`` offers ``step_losses(forward, batch)`` (its losses with the generator given as a function),
        ``jit_step_blockers()`` (what it trains that this step cannot), ``bare(name)``, ``optimizers``, ``emas``,
        ``grad_clip_norm``."""
        blockers = model.jit_step_blockers() if hasattr(model, "jit_step_blockers") else [
            f"model_type {type(model).__name__} has no jitted step"]
        if blockers:
            raise AcceleratorError(f"xla.backend torchax: {blockers[0]}; set xla.backend: torch_xla (torch 2.9) or "
                                   "accelerator: cpu for this run")
        step = self._steps.get(id(model))
        if step is None:
            step = self._steps[id(model)] = self._build_step(model)
        net, opt, ema = model.bare("net_g"), model.optimizers["net_g"], model.emas.get("net_g")
        if step.state is None or _fingerprint(net, opt, ema) != step.fingerprint:  # written from outside: reload
            self._load_state(step, net, opt, ema)
        step.steps += 1
        hyper = self._hyper(step, opt, ema, float(model.grad_clip_norm or 0.0))
        data = self._shard_batches(batches)
        key = self._replicated(self._key)  # a fresh key (seed, resume) must look like the step's own output
        state, self._key, losses = step.fn(step.state, step.extras["frozen"], data, hyper, key)
        step.state = state
        step.stale = True
        if ema is not None:
            ema.updates += 1
        host = jax.device_get(losses)
        return {k: torch.tensor(float(v)) for k, v in host.items()}

    def _hyper(self, step: _StepState, opt: torch.optim.Optimizer, ema: Any, clip: float) -> dict[str, Any]:
        """The step's scalars as arrays (a new value never recompiles): per group the learning rate, torch's bias
        corrections (in float64 on the host, as torch computes them) and weight decay; the EMA weight; the clip."""
        lr, step_size, bc2_sqrt = [], [], []
        for g in opt.param_groups:
            beta1, beta2 = g["betas"]
            rate = float(g["lr"])
            lr.append(rate)
            step_size.append(rate / (1 - beta1 ** step.steps))
            bc2_sqrt.append(math.sqrt(1 - beta2 ** step.steps))
        f32 = np.float32
        return {"lr": np.asarray(lr, f32), "step_size": np.asarray(step_size, f32),
                "bc2_sqrt": np.asarray(bc2_sqrt, f32),
                "ema_weight": f32(1.0 - ema.current_decay()) if ema is not None else f32(0.0),
                "clip": f32(clip)}

    def _shard_batches(self, batches: Sequence[dict[str, Any]]) -> list[dict[str, jax.Array]]:
        mesh = self.strategy.mesh
        out = []
        for batch in batches:
            arrays = {}
            for key in ("lq", "gt"):
                value = batch.get(key)
                if isinstance(value, torch.Tensor):
                    host = value.detach().cpu().float().contiguous().numpy()
                    if host.shape[0] % len(self.strategy.devices):
                        raise AcceleratorError(
                            f"a batch of {host.shape[0]} does not split over {len(self.strategy.devices)} devices; "
                            "set datasets.train.batch_size_per_gpu so that it does (drop_last keeps it fixed)")
                    spec = PartitionSpec("data", *([None] * (host.ndim - 1)))
                    arrays[key] = jax.device_put(host, NamedSharding(mesh, spec))
            out.append(arrays)
        return out

    def _replicated(self, tree: Any) -> Any:
        return jax.device_put(tree, NamedSharding(self.strategy.mesh, PartitionSpec()))

    def _build_step(self, model: Any) -> _StepState:
        net: nn.Module = model.bare("net_g")
        opt = model.optimizers["net_g"]
        kind = type(opt).__name__
        if kind not in ADAM_KINDS:
            raise AcceleratorError(f"train.optim_g: {kind} is not in torchax's jitted step yet (Adam, AdamW); use "
                                   "type: Adam or AdamW, or xla.backend: torch_xla")
        for g in opt.param_groups:
            for flag in ("amsgrad", "maximize", "capturable", "differentiable"):
                if g.get(flag):
                    raise AcceleratorError(f"train.optim_g: {flag}: true is not in torchax's jitted step; remove it")
        by_id = {id(p): n for n, p in net.named_parameters()}
        names, group_of = [], []
        for gi, g in enumerate(opt.param_groups):
            for p in g["params"]:
                names.append(by_id[id(p)])
                group_of.append(gi)
        trained = set(names)
        frozen = [n for n, _ in net.named_parameters() if n not in trained] + [n for n, _ in net.named_buffers()]
        if any(n.endswith(("running_mean", "running_var")) for n in frozen) and net.training:
            raise AcceleratorError(f"network_g: {type(net).__name__} updates batch-norm statistics in its forward, "
                                   "which torchax's jitted step does not carry; use xla.backend: torch_xla")
        decoupled = [bool(g.get("decoupled_weight_decay", ADAM_KINDS[kind])) for g in opt.param_groups]
        hyper_groups = [(float(g["betas"][0]), float(g["betas"][1]), float(g["eps"]), float(g["weight_decay"]))
                        for g in opt.param_groups]
        bf16 = self.precision.name == "bf16"
        env = self.env
        has_ema = "net_g" in model.emas
        ema_buffers = [n for n, _ in net.named_buffers()]

        def forward_with(params: dict[str, jax.Array], frozen_arrays: dict[str, jax.Array],
                         key: jax.Array) -> Callable[[Any], Any]:
            def forward(x: Any) -> Any:
                tree = {**params, **frozen_arrays}
                if bf16:
                    tree = jax.tree.map(lambda a: a.astype(jnp.bfloat16) if a.dtype == jnp.float32 else a, tree)
                    x = x.to(torch.bfloat16)
                tensors = env.j2t_iso(tree)
                with env.override_property(prng=key):
                    out = torch.func.functional_call(net, tensors, (x,))
                return out.float() if bf16 else out
            return forward

        def loss_fn(params: dict[str, jax.Array], frozen_arrays: dict[str, jax.Array],
                    data: list[dict[str, jax.Array]], key: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
            n = len(data)
            sums: dict[str, jax.Array] = {}
            total = jnp.zeros((), jnp.float32)
            for k, arrays in enumerate(data):
                with env:
                    batch = env.j2t_iso(arrays)
                    losses = model.step_losses(forward_with(params, frozen_arrays, jax.random.fold_in(key, k)), batch)
                    values = {name: env.t2j_iso(v) for name, v in losses.items()}
                for name, v in values.items():
                    total = total + v / n
                    sums[name] = sums[name] + v / n if name in sums else v / n
            return total, sums

        def step_fn(state: dict[str, Any], frozen_arrays: dict[str, jax.Array], data: list[dict[str, jax.Array]],
                    hyper: dict[str, Any], key: jax.Array) -> tuple[dict[str, Any], jax.Array, dict[str, jax.Array]]:
            key, sub = jax.random.split(key)
            params = state["params"]
            (_, losses), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, frozen_arrays, data, sub)
            norm = jnp.sqrt(sum(jnp.sum(jnp.square(grads[n].astype(jnp.float32))) for n in names))
            coef = jnp.where(hyper["clip"] > 0, jnp.minimum(hyper["clip"] / (norm + 1e-6), 1.0), 1.0)
            new_p, new_m, new_v = {}, {}, {}
            for n, gi in zip(names, group_of):
                beta1, beta2, eps, wd = hyper_groups[gi]
                p, g = params[n], grads[n] * coef
                if wd and decoupled[gi]:
                    p = p * (1 - hyper["lr"][gi] * wd)
                elif wd:
                    g = g + wd * p
                m = state["exp_avg"][n] + (g - state["exp_avg"][n]) * (1 - beta1)
                v = state["exp_avg_sq"][n] * beta2 + (1 - beta2) * g * g
                denom = jnp.sqrt(v) / hyper["bc2_sqrt"][gi] + eps
                new_p[n] = p - hyper["step_size"][gi] * m / denom
                new_m[n], new_v[n] = m, v
            out = {"params": new_p, "exp_avg": new_m, "exp_avg_sq": new_v}
            if has_ema:
                w = hyper["ema_weight"]
                ema = {}
                for n, e in state["ema"].items():
                    target = new_p[n] if n in new_p else frozen_arrays[n]
                    ema[n] = jnp.where(w < 0.5, e + w * (target - e), target - (target - e) * (1 - w))
                out["ema"] = ema
            return out, key, losses

        fn = jax.jit(step_fn, donate_argnums=(0,))
        extras: dict[str, Any] = {"frozen": None, "ema_buffers": ema_buffers}
        return _StepState(fn=fn, names=names, group_of=group_of, frozen=frozen, extras=extras)

    def _load_state(self, step: _StepState, net: nn.Module, opt: torch.optim.Optimizer, ema: Any) -> None:
        """(Re)build the step's JAX state from the torch objects (first step, resume, rollback)."""
        named = dict(net.named_parameters())
        named.update(dict(net.named_buffers()))

        def arr(t: torch.Tensor) -> np.ndarray:
            return t.detach().cpu().contiguous().numpy().copy()

        params = {n: arr(named[n]) for n in step.names}
        exp_avg, exp_avg_sq = {}, {}
        steps = 0
        for n in step.names:
            st = opt.state.get(named[n], {})
            exp_avg[n] = arr(st["exp_avg"]) if "exp_avg" in st else np.zeros_like(params[n])
            exp_avg_sq[n] = arr(st["exp_avg_sq"]) if "exp_avg_sq" in st else np.zeros_like(params[n])
            if "step" in st:
                steps = int(float(st["step"]))
        state: dict[str, Any] = {"params": params, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
        if ema is not None:
            ema_named = dict(ema.module.named_parameters())
            state["ema"] = {n: arr(p) for n, p in ema_named.items()}
        step.state = self._replicated(state)
        step.extras["frozen"] = self._replicated({n: arr(named[n]) for n in step.frozen})
        step.steps = steps
        step.stale = False
        step.fingerprint = _fingerprint(net, opt, ema)

    def inference_forward(self, net: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
        """``net``'s forward jitted by JAX (one compile per input shape: fixed-size tiles give one), over its current
        weights (uploaded again when they changed); inputs and outputs are CPU tensors."""
        tensors = {**dict(net.named_parameters()), **dict(net.named_buffers())}  # non-persistent buffers too
        versions = tuple(t._version for t in tensors.values())
        entry = self._eval.get(id(net))
        if entry is None or entry["net"] is not net:
            env, bf16 = self.env, self.precision.name == "bf16"

            def forward(tree: dict[str, jax.Array], x: jax.Array) -> jax.Array:
                if bf16:
                    tree = jax.tree.map(lambda a: a.astype(jnp.bfloat16) if a.dtype == jnp.float32 else a, tree)
                    x = x.astype(jnp.bfloat16)
                with env:
                    out = torch.func.functional_call(net, env.j2t_iso(tree), (env.j2t_iso(x),))
                    return env.t2j_iso(out).astype(jnp.float32)

            entry = self._eval[id(net)] = {"net": net, "fn": jax.jit(forward), "versions": None, "tree": None}
        if entry["versions"] != versions:
            tree = {n: t.detach().cpu().contiguous().numpy().copy() for n, t in tensors.items()}
            entry["tree"], entry["versions"] = self._replicated(tree), versions

        def run(x: torch.Tensor) -> torch.Tensor:
            out = entry["fn"](entry["tree"], x.detach().cpu().float().contiguous().numpy())
            return torch.from_numpy(np.array(out))

        return run

    def sync_model(self, model: Any) -> None:
        """Write the step's JAX state back into the model's torch objects (weights, Adam state in torch's layout,
        EMA), where the step ran since the last time; a no-op otherwise."""
        step = self._steps.get(id(model))
        if step is None or not step.stale or step.state is None:
            return
        net, opt, ema = model.bare("net_g"), model.optimizers["net_g"], model.emas.get("net_g")
        self._host_transfers += 1
        host = jax.device_get(step.state)
        named = dict(net.named_parameters())
        with torch.no_grad():
            for n in step.names:
                p = named[n]
                p.copy_(torch.from_numpy(np.array(host["params"][n])))
                opt.state[p] = {"step": torch.tensor(float(step.steps), dtype=torch.float32),
                                "exp_avg": torch.from_numpy(np.array(host["exp_avg"][n])),
                                "exp_avg_sq": torch.from_numpy(np.array(host["exp_avg_sq"][n]))}
            if ema is not None:
                for n, p in ema.module.named_parameters():
                    p.copy_(torch.from_numpy(np.array(host["ema"][n])))
                for (_, b_ema), (_, b) in zip(ema.module.named_buffers(), net.named_buffers()):
                    b_ema.copy_(b)
        step.stale = False
        step.fingerprint = _fingerprint(net, opt, ema)


def _fingerprint(net: nn.Module, opt: torch.optim.Optimizer, ema: Any) -> tuple[Any, ...]:
    """What changes when the torch objects are written from outside the step (load_state_dict, a rollback)."""
    versions = tuple(p._version for p in net.parameters())
    states = tuple(id(t) for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor))
    ema_versions = tuple(p._version for p in ema.module.parameters()) if ema is not None else ()
    return versions, states, ema_versions
