"""A whole model on gemmlib, against the same model on torch: ``python -m gemmlib bench
--suite e2e --out results`` writes ``results/e2e-<gpu>-<date>.json``.

The model is Hugging Face transformers' ``LlamaForCausalLM`` built from a ``LlamaConfig``
at Llama 3.1 8B's sizes (hidden 4096, intermediate 14336, 32 query heads and 8 key/value
heads of 128, vocabulary 128256, RoPE theta 500000), with ``--layers`` decoder layers
(default 4) and random weights in bf16 (``--dtype``): nothing is downloaded.  Every row
measures the same model object twice in one run: as built (``torch``: cuBLAS behind
``nn.Linear``) and after :func:`gemmlib.patch` (``gemmlib``: every ``nn.Linear``, the
output head included, on :func:`gemmlib.torch_op.linear`), with :func:`gemmlib.unpatch`
between.  Attention, norms, RoPE and sampling are torch's in both.

Phases (``--phases``):

* ``prefill``: one forward pass of a batch-1 prompt of 512 and 2048 tokens
  (``use_cache=False``, logits of every position); tokens/s = prompt tokens / time.
* ``decode``: greedy decoding of 32 new tokens after a 16-token prompt, at batch 1, 16
  and 64; tokens/s = batch x new tokens / time of the decoding loop (the prompt's forward
  pass is outside the timed region).  The first new token is fixed (the same random
  tokens for both sides), so the first step's logits compare like for like; the others
  follow each side's own argmax.
* ``train``: one training step, ``loss.backward()`` of the causal-LM loss on a batch of
  2 x 256 random tokens; tokens/s of the step, and the gradient of every linear weight
  against torch's.

Modes (``mode``, said in each row's ``how``):

* ``eager``: the model called from Python as a user does (decode: transformers' default
  ``DynamicCache``);
* ``graphs``: ``torch.cuda.graph`` by hand, no ``torch.compile``.  Prefill: the forward of
  the prompt captured once and replayed.  Decode: one decoding step captured once with a
  preallocated ``transformers.StaticCache`` -- the model's forward on a static (batch, 1)
  token buffer, the argmax written back into that buffer and the cache position advanced
  on the GPU -- so each new token is one replay and no Python runs per layer.  The
  cache position and position ids are passed explicitly (a model that derived them on the
  host would bake one position into the graph); each graphs row also records the first
  step's logits against the eager path's (``*_graph_vs_eager``), which a wrong capture
  would show.  A capture that fails is recorded in the row (``gemmlib_error`` /
  ``torch_error``), and the suite goes on.  While a stream is captured, transformers
  versions whose ``is_tracing`` counts stream capture (5.x) build the causal mask as a
  tensor instead of leaving it to SDPA's ``is_causal``: a graphs prefill's attention then
  runs with an explicit mask, on both sides alike.

Timing: both sides are warmed up first (which also compiles gemmlib's kernels), then
timed in rounds, each round one run of each side (the model patched for gemmlib's,
unpatched for torch's; who goes first alternates), CUDA events around the timed region:
``repeats`` rounds (5).  ``pct`` is the median of the rounds' ratios, so a drift of clocks
or host load between the two sides' runs does not land on one of them; each side's
``*_ms`` is the median of its own runs.  ``logits_rel_diff`` is
``||logits_gemmlib - logits_torch|| / ||logits_torch||`` in float32 (prefill: every
position; decode: the first step; train: the training forward).  The file's ``meta`` has
the GPU, its clocks, the driver and the versions of torch, transformers and numba-cuda;
it is written after every row, so a run cut short keeps what it measured, and runs of one
day that build the same model share the file (a row per case, the newest; rows of an
earlier run say ``carried_from``), so the suite can run one ``--phases`` at a time.

transformers and torch are imported only when the suite runs: this module imports without
them, and the row arithmetic (:func:`make_row`, :func:`plan`) needs neither.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field

#: LlamaConfig fields of Llama 3.1 8B (meta-llama/Llama-3.1-8B's config.json), no RoPE scaling
LLAMA_31_8B = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                   num_key_value_heads=8, head_dim=128, vocab_size=128256,
                   rope_theta=500000.0, rms_norm_eps=1e-5, max_position_embeddings=8192,
                   tie_word_embeddings=False, hidden_act="silu")
PHASES = ("prefill", "decode", "train")
MODES = ("eager", "graphs")
PREFILL_TOKENS = (512, 2048)
DECODE_BATCHES = (1, 16, 64)
NEW_TOKENS = 32
PROMPT_TOKENS = 16
TRAIN_BATCH, TRAIN_TOKENS = 2, 256
LAYERS = 4
REPEATS = 5
DTYPES = ("bf16", "fp16")
#: where the model and its inputs live (torch.cuda's events and graphs time it there)
DEVICE = "cuda"

HOW = {
    ("prefill", "eager"): "eager: model(input_ids, use_cache=False)",
    ("prefill", "graphs"): "torch.cuda.graph: the prompt's forward captured once, replayed",
    ("decode", "eager"): "eager: model(token, past_key_values=DynamicCache) per step",
    ("decode", "graphs"): "torch.cuda.graph: one decode step captured by hand (StaticCache, "
                          "argmax and cache position updated inside the graph), replayed",
    ("train", "eager"): "eager: loss.backward() of the causal-LM loss",
}


@dataclass
class Plan:
    """What one run measures (see :func:`plan`)."""
    phases: tuple = PHASES
    modes: tuple = MODES
    prefill_tokens: tuple = PREFILL_TOKENS
    batches: tuple = DECODE_BATCHES
    new_tokens: int = NEW_TOKENS
    prompt_tokens: int = PROMPT_TOKENS
    train_batch: int = TRAIN_BATCH
    train_tokens: int = TRAIN_TOKENS
    layers: int = LAYERS
    dtype: str = "bf16"
    repeats: int = REPEATS
    quick: bool = False
    config: dict = field(default_factory=lambda: dict(LLAMA_31_8B))

    def cases(self) -> list[tuple[str, int, int, str]]:
        """(phase, batch, tokens, mode) of every row, in the order they are measured."""
        out = []
        for phase in self.phases:
            if phase == "prefill":
                out += [(phase, 1, t, m) for t in self.prefill_tokens for m in self.modes]
            elif phase == "decode":
                out += [(phase, b, self.new_tokens, m) for b in self.batches for m in self.modes]
            elif phase == "train":
                out.append((phase, self.train_batch, self.train_tokens, "eager"))
        return out


def plan(phases=None, batches=None, tokens=None, layers=None, dtype=None, quick=False,
         modes=None, new_tokens=None, repeats=None) -> Plan:
    """The run's :class:`Plan`: the defaults above, or a fast smoke variant (``quick``: one
    layer, a 128-token prefill, decode at batch 1 and 16 for 8 tokens, 3 repeats, a 1 x 64
    training step; the layer shapes stay Llama 3.1 8B's), then any option given."""
    p = Plan()
    if quick:
        p = Plan(prefill_tokens=(128,), batches=(1, 16), new_tokens=8, prompt_tokens=8,
                 train_batch=1, train_tokens=64, layers=1, repeats=3, quick=True)
    for name, value in (("phases", phases), ("batches", batches), ("prefill_tokens", tokens),
                        ("modes", modes)):
        if value:
            setattr(p, name, tuple(value))
    for name, value in (("layers", layers), ("dtype", dtype), ("new_tokens", new_tokens),
                        ("repeats", repeats)):
        if value is not None:
            setattr(p, name, value)
    bad = [x for x in p.phases if x not in PHASES] + [x for x in p.modes if x not in MODES]
    if bad or p.dtype not in DTYPES:
        raise ValueError(f"unknown phase/mode/dtype: {bad or p.dtype} (phases {PHASES}, "
                         f"modes {MODES}, dtypes {DTYPES})")
    return p


# --------------------------------------------------------------------------
# Rows (pure arithmetic: no torch, no GPU)


def tok_per_s(batch: int, tokens: int, ms) -> float | None:
    """Tokens per second of ``batch`` x ``tokens`` tokens in ``ms`` milliseconds."""
    return None if not ms or ms <= 0 else batch * tokens / (ms * 1e-3)


def make_row(phase: str, batch: int, tokens: int, mode: str, *, torch_ms=None,
             gemmlib_ms=None, logits_rel_diff=None, gpu=None, how=None, round_ratios=(),
             **extra) -> dict:
    """One result row from the two sides' median milliseconds per run (``None``: that side
    failed; its ``<side>_error`` goes in ``extra``).  ``pct`` is gemmlib's tokens/s in % of
    torch's: the median of ``round_ratios`` (torch's time / gemmlib's, one per round of
    both sides) where given, else the ratio of the medians (``pct_of_medians``, always
    kept); a row with either side missing carries ``error``."""
    t, g = tok_per_s(batch, tokens, torch_ms), tok_per_s(batch, tokens, gemmlib_ms)
    of_medians = None if t is None or g is None else 100.0 * g / t
    paired = 100.0 * statistics.median(round_ratios) if round_ratios else None
    row = dict(suite="e2e", phase=phase, batch=batch, tokens=tokens, mode=mode,
               how=how or HOW.get((phase, mode), mode), torch_tok_s=t, gemmlib_tok_s=g,
               pct=of_medians if paired is None or of_medians is None else paired,
               pct_of_medians=of_medians, round_ratios=list(round_ratios),
               logits_rel_diff=logits_rel_diff, torch_ms=torch_ms, gemmlib_ms=gemmlib_ms,
               gpu=gpu)
    row.update(extra)
    errors = [f"{side}: {extra[side + '_error']}" for side in ("torch", "gemmlib")
              if extra.get(side + "_error")]
    if errors or t is None or g is None:
        row["error"] = "; ".join(errors) or "no timing"
    return row


def line(r: dict) -> str:
    """The progress line of a row."""
    head = f"{r['phase']:<8}{r['mode']:<7}b={r['batch']:<3}T={r['tokens']:<5}"

    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    out = (head + f" torch {f(r.get('torch_tok_s'), '9.0f')} tok/s  gemmlib "
           f"{f(r.get('gemmlib_tok_s'), '9.0f')} tok/s  {f(r.get('pct'), '6.1f')}%"
           f"  logits {f(r.get('logits_rel_diff'), '.1e')}")
    if r.get("grad_rel_diff_max") is not None:
        out += f"  grads {r['grad_rel_diff_max']:.1e} ({r.get('grad_worst', '?')})"
    if "error" in r:
        out += "  ERROR " + r["error"][:300]
    return out


def summary(data: dict) -> list[str]:
    """A line per row and the rows that failed."""
    out = [line(r) for r in data["rows"]]
    errs = [r for r in data["rows"] if "error" in r]
    if errs:
        out.append(f"{len(errs)} rows with an error (see their 'error')")
    return out


#: what must match for rows of two runs to share a file
_SAME_MODEL = ("layers", "dtype", "config", "quick")


def case_key(r: dict) -> tuple:
    return (r.get("phase"), r.get("batch"), r.get("tokens"), r.get("mode"))


def _order(r: dict) -> tuple:
    phase = r.get("phase")
    return (PHASES.index(phase) if phase in PHASES else len(PHASES),
            r.get("tokens") if phase == "prefill" else 0, r.get("batch") or 0,
            MODES.index(r["mode"]) if r.get("mode") in MODES else len(MODES))


def merged(data: dict, earlier: dict | None) -> dict:
    """``data`` with the rows of ``earlier`` (the same GPU's file of the same day) whose case
    this run did not measure, each marked ``carried_from`` (the date of the run that
    measured it), provided both runs built the same model; rows in suite order.  So a suite
    run phase by phase (``--phases``) fills one file."""
    rows = list(data["rows"])
    carried = []
    if earlier and isinstance(earlier.get("rows"), list):
        a, b = data["meta"].get("plan", {}), earlier.get("meta", {}).get("plan", {})
        if all(a.get(k) == b.get(k) for k in _SAME_MODEL):
            mine = {case_key(r) for r in rows}
            when = earlier.get("meta", {}).get("date")
            carried = [dict(r, carried_from=r.get("carried_from", when))
                       for r in earlier["rows"] if case_key(r) not in mine]
    meta = dict(data["meta"], carried_rows=len(carried))
    return {"meta": meta, "rows": sorted(carried + rows, key=_order)}


def save(data: dict, directory="results") -> str:
    """``data`` as ``<directory>/e2e-<gpu>-<date>.json``, with the rows an earlier run of the
    same day wrote there for other cases (:func:`merged`); its path."""
    import json
    from pathlib import Path

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    m = data["meta"]
    path = d / f"e2e-{m['gpu_slug']}-{m['date'][:10]}.json"
    earlier = None
    if path.exists():
        try:
            earlier = json.loads(path.read_text())
        except ValueError:
            earlier = None
    path.write_text(json.dumps(merged(data, earlier), indent=1) + "\n")
    return str(path)


def rel_diff(got, want) -> float:
    """``||got - want|| / ||want||`` in float32."""
    want = want.float()
    return float((got.float() - want).norm() / want.norm().clamp_min(1e-30))


# --------------------------------------------------------------------------
# The model (GPU, transformers)

_DTYPE = {"bf16": "bfloat16", "fp16": "float16"}


def llama_config(p: Plan):
    """``LlamaConfig`` of ``p.config`` and ``p.layers``, SDPA attention.  RoPE's theta goes in
    as ``rope_theta`` where the config takes it, else as ``rope_parameters`` (transformers
    5.x configs are strict dataclasses, whose fields changed)."""
    from transformers import LlamaConfig

    kw = dict(p.config, num_hidden_layers=p.layers)
    theta = kw.pop("rope_theta", None)
    rope = {} if theta is None else {"rope_type": "default", "rope_theta": theta}
    last = None
    for extra in (dict(rope_theta=theta, attn_implementation="sdpa"),
                  dict(rope_parameters=rope, attn_implementation="sdpa"),
                  dict(rope_parameters=rope)):
        if theta is None:
            extra = {k: v for k, v in extra.items() if not k.startswith("rope")}
        try:
            cfg = LlamaConfig(**kw, **extra)
        except (TypeError, ValueError) as e:
            last = e
            continue
        if theta is None or config_theta(cfg) == theta:
            return cfg
        last = ValueError(f"LlamaConfig kept RoPE theta {config_theta(cfg)}, not {theta}")
    raise last


def config_theta(cfg):
    """The RoPE theta a config holds, wherever its version keeps it."""
    theta = getattr(cfg, "rope_theta", None)
    if theta is None:
        params = getattr(cfg, "rope_parameters", None) or {}
        theta = params.get("rope_theta") if isinstance(params, dict) else None
    return theta


def build_model(torch, p: Plan, seed: int = 0):
    """``LlamaForCausalLM`` of ``p.config`` with ``p.layers`` layers, random weights made on
    the GPU in ``p.dtype`` (the default dtype set while it is built, so RoPE's float32
    buffers stay float32), in eval mode."""
    from transformers import LlamaForCausalLM

    dt = getattr(torch, _DTYPE[p.dtype])
    cfg = llama_config(p)
    torch.manual_seed(seed)
    before = torch.get_default_dtype()
    torch.set_default_dtype(dt)
    try:
        with torch.device(DEVICE):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(before)
    model.to(DEVICE).eval()
    return model


def _version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def torch_gpu_meta(torch, suite: str, **more) -> dict:
    """The fields every torch suite's ``meta`` starts with: date, the GPU as torch sees it
    (name, slug, capability, SMs, memory, L2) and the versions of the software; ``more``
    after them."""
    import datetime as dt
    import platform
    import re

    from gemmlib import __version__

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return dict(date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                simulated=False, suite=suite, gpu=props.name,
                gpu_slug=re.sub(r"[^a-z0-9]+", "-", props.name.lower()).strip("-"),
                compute_capability=f"{props.major}.{props.minor}",
                sm_count=props.multi_processor_count, memory_bytes=props.total_memory,
                l2_bytes=getattr(props, "L2_cache_size", None), python=platform.python_version(),
                gemmlib=__version__, torch=torch.__version__, cuda_runtime=torch.version.cuda,
                numba=_version("numba"), numba_cuda=_version("numba-cuda"),
                numpy=_version("numpy"), **more)


def header(torch, p: Plan, model=None) -> dict:
    """The file's ``meta``: the GPU as torch and nvidia-smi see it (name, capability, SMs,
    clocks, driver), the versions of the software, and the plan.  Nothing here imports CuPy:
    the suite measures a torch user's process."""
    from gemmlib.bench import _nvidia_smi

    meta = torch_gpu_meta(
        torch, "e2e", transformers=_version("transformers"), plan=asdict(p),
        model="transformers LlamaForCausalLM, Llama 3.1 8B sizes, random weights",
        timing="CUDA events around the timed region after an untimed warm-up run; "
               "median of the repeats")
    meta.update({f"smi_{k.replace('.', '_')}": v for k, v in _nvidia_smi(
        "driver_version,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.limit,"
        "temperature.gpu").items()})
    if model is not None:
        meta["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
        meta["rope_theta"] = config_theta(model.config)
        meta["parameters"] = sum(q.numel() for q in model.parameters())
        meta["model_dtype"] = str(next(model.parameters()).dtype)
    return meta


def _set_state(model, side: str):
    import gemmlib

    if side == "gemmlib":
        gemmlib.patch(model)
    else:
        gemmlib.unpatch(model)


class Prepared:
    """One side of a case, warmed up and ready to time: ``run(state)`` is the timed region
    (``per`` units of work: milliseconds per unit = the region's time / ``per``), ``state =
    setup()`` its untimed preparation; ``out``: the warm-up's logits; ``extra``: what the
    row records of this side; ``keep``: what must live while it is timed (a graph)."""

    def __init__(self, run, out, setup=None, per: int = 1, extra=None, keep=None):
        self.run, self.out, self.setup, self.per = run, out, setup, per
        self.extra, self.keep = extra or {}, keep


def _time_once(torch, prep: Prepared, e0, e1) -> float:
    state = prep.setup() if prep.setup else None
    torch.cuda.synchronize()
    e0.record()
    prep.run(state)
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) / prep.per


def alternated(torch, model, prepared: dict, repeats: int) -> tuple[dict, dict, list]:
    """Time the sides of ``prepared`` ({side: Prepared}) round by round, the model patched
    for gemmlib's turn and unpatched for torch's, the order swapped every round, so a
    drift of the clocks or the host touches both alike: ({side: ms per round},
    {side: error}, [torch's time / gemmlib's time, per round])."""
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    runs = {side: [] for side in prepared}
    errors = {}
    for r in range(repeats):
        order = list(prepared) if r % 2 == 0 else list(prepared)[::-1]
        for side in order:
            if side in errors:
                continue
            _set_state(model, side)
            try:
                runs[side].append(_time_once(torch, prepared[side], e0, e1))
            except Exception as e:   # recorded in the row
                errors[side] = f"{type(e).__name__}: {e}"
            finally:
                torch.cuda.synchronize()
    _set_state(model, "torch")
    t, g = runs.get("torch", []), runs.get("gemmlib", [])
    ratios = ([a / b for a, b in zip(t, g)] if "torch" not in errors and "gemmlib" not in errors
              else [])
    return {s: v for s, v in runs.items() if s not in errors}, errors, ratios


def _capture(torch, fn, warmup: int = 2):
    """``fn`` captured in a CUDA graph after ``warmup`` calls on a side stream (as torch
    asks); the graph and what ``fn`` returned during capture (its static output)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return g, out


def _accepts(fn, name: str) -> bool:
    import inspect

    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


# --------------------------------------------------------------------------
# Prefill


def prepare_prefill(torch, model, ids, mode: str, target_ms: float = 100.0) -> Prepared:
    """One forward of ``ids`` (a graph replay in ``graphs``), warmed up; timed ``n`` times
    back to back per region, ``n`` chosen for about ``target_ms``."""
    def forward():
        return model(input_ids=ids, use_cache=False).logits

    if mode == "graphs":
        g, static = _capture(torch, forward)

        def call():
            g.replay()
            return static
    else:
        g, call = None, forward
    logits = call().clone()               # warm-up (and gemmlib's compiles)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    call()
    torch.cuda.synchronize()
    probe = (time.perf_counter() - t0) * 1e3
    n = int(min(20, max(1, round(target_ms / max(probe, 1e-3)))))

    def run(_):
        for _ in range(n):
            call()

    return Prepared(run, logits, per=n, keep=g)


# --------------------------------------------------------------------------
# Decode


class _GraphDecoder:
    """Greedy decoding with one CUDA graph per step (see the module's docstring)."""

    def __init__(self, torch, model, prompt, first, new_tokens: int):
        from transformers import StaticCache

        self.torch, self.model, self.prompt, self.first = torch, model, prompt, first
        b, P = prompt.shape
        length = P + new_tokens + 1
        try:                       # transformers >= 4.56 / 5.x: lazily allocated layers
            self.cache = StaticCache(config=model.config, max_cache_len=length)
        except Exception:          # older: every size up front
            self.cache = StaticCache(config=model.config, max_batch_size=b,
                                     max_cache_len=length, device=prompt.device,
                                     dtype=model.dtype)
        self.cache_position = _accepts(model.forward, "cache_position")
        self.P = P
        self.tok = first.clone()
        self.pos = torch.full((1,), P, dtype=torch.long, device=prompt.device)
        self.refill()              # the cache's tensors exist before the capture
        self.graph, self.logits = _capture(torch, self._step)
        self.refill()              # the warm-up steps wrote into the cache: start again

    def _kw(self, positions):
        kw = dict(past_key_values=self.cache, use_cache=True, position_ids=positions[None])
        if self.cache_position:
            kw["cache_position"] = positions
        return kw

    def _step(self):
        logits = self.model(input_ids=self.tok, **self._kw(self.pos)).logits
        self.tok.copy_(logits[:, -1:].argmax(-1))
        self.pos.add_(1)
        return logits

    def refill(self):
        """Empty the cache (in place: the graph holds its addresses), run the prompt into
        it eagerly, and set the step's inputs to the first token."""
        t = self.torch
        self.cache.reset()
        positions = t.arange(self.P, device=self.prompt.device)
        self.model(input_ids=self.prompt, **self._kw(positions))
        self.tok.copy_(self.first)
        self.pos.fill_(self.P)

    def run(self, steps: int, record: bool = False):
        logits0, toks = None, []
        for i in range(steps):
            self.graph.replay()
            if record:
                if i == 0:
                    logits0 = self.logits[:, -1].float().clone()
                toks.append(self.tok.clone())
        return logits0, toks


def eager_decode(model, prompt, first, steps: int, record: bool = False, cache=None):
    """Greedy steps after the prompt (``cache``: its prefilled DynamicCache); the first
    step's logits and the tokens, when ``record``."""
    if cache is None:
        cache = model(input_ids=prompt, use_cache=True).past_key_values
    tok, logits0, toks = first, None, []
    for i in range(steps):
        out = model(input_ids=tok, past_key_values=cache, use_cache=True)
        tok = out.logits[:, -1:].argmax(-1)
        if record:
            if i == 0:
                logits0 = out.logits[:, -1].float().clone()
            toks.append(tok)
    return logits0, toks


def prepare_decode(torch, model, prompt, first, new_tokens: int, mode: str) -> Prepared:
    """``new_tokens`` greedy steps after the prompt, warmed up (the prompt's forward is the
    untimed setup); ``extra`` has the tokens and, for graphs, the first step's logits
    against the eager path's."""
    if mode == "graphs":
        dec = _GraphDecoder(torch, model, prompt, first, new_tokens)
        logits0, toks = dec.run(new_tokens, record=True)        # warm-up
        eager0, _ = eager_decode(model, prompt, first, 1, record=True)
        return Prepared(lambda _: dec.run(new_tokens), logits0, setup=dec.refill,
                        extra={"graph_vs_eager": rel_diff(logits0, eager0),
                               "tokens": torch.cat(toks, dim=1)}, keep=dec)
    logits0, toks = eager_decode(model, prompt, first, new_tokens, record=True)
    return Prepared(lambda cache: eager_decode(model, prompt, first, new_tokens, cache=cache),
                    logits0,
                    setup=lambda: model(input_ids=prompt, use_cache=True).past_key_values,
                    extra={"tokens": torch.cat(toks, dim=1)})


# --------------------------------------------------------------------------
# Training


def _linear_weights(model) -> dict:
    import torch

    return {f"{n}.weight": m.weight for n, m in model.named_modules()
            if isinstance(m, torch.nn.Linear)}


def prepare_train(torch, model, ids) -> Prepared:
    """One training step (the model in train mode: the caller sets it), warmed up; the
    warm-up's gradients are the ones compared (``extra``: the loss and {weight: grad})."""
    def step(_=None):
        model.zero_grad(set_to_none=True)
        out = model(input_ids=ids, labels=ids, use_cache=False)
        out.loss.backward()
        return out

    out = step()
    grads = {n: w.grad.detach().clone() for n, w in _linear_weights(model).items()
             if w.grad is not None}
    logits, loss = out.logits.detach().clone(), float(out.loss)
    del out
    model.zero_grad(set_to_none=True)
    return Prepared(step, logits, extra={"loss": loss, "grads": grads})


# --------------------------------------------------------------------------
# The suite


SIDES = ("torch", "gemmlib")


def _inputs(torch, model, p: Plan, phase: str, batch: int, tokens: int, seed: int) -> dict:
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    vocab = model.config.vocab_size
    if phase == "decode":
        return dict(prompt=torch.randint(0, vocab, (batch, p.prompt_tokens), device=DEVICE,
                                         generator=g),
                    first=torch.randint(0, vocab, (batch, 1), device=DEVICE, generator=g))
    return dict(ids=torch.randint(0, vocab, (batch, tokens), device=DEVICE, generator=g))


def _prepare(torch, model, phase: str, tokens: int, mode: str, x: dict) -> Prepared:
    if phase == "prefill":
        return prepare_prefill(torch, model, x["ids"], mode)
    if phase == "decode":
        return prepare_decode(torch, model, x["prompt"], x["first"], tokens, mode)
    return prepare_train(torch, model, x["ids"])


def _measure_case(torch, model, p: Plan, phase: str, batch: int, tokens: int, mode: str,
                  gpu: str, seed: int) -> dict:
    """Both sides warmed up on the same inputs, then timed round by round
    (:func:`alternated`); ``pct`` is the median of the rounds' ratios."""
    import contextlib

    x = _inputs(torch, model, p, phase, batch, tokens, seed)
    grad = phase == "train"
    model.train(grad)
    prepared, extra = {}, {}
    with contextlib.nullcontext() if grad else torch.inference_mode():
        for side in SIDES:
            _set_state(model, side)
            try:
                prepared[side] = _prepare(torch, model, phase, tokens, mode, x)
                for k, v in prepared[side].extra.items():
                    extra[f"{side}_{k}"] = v
            except Exception as e:   # recorded in the row; the suite goes on
                extra[f"{side}_error"] = f"{type(e).__name__}: {e}"
            finally:
                torch.cuda.synchronize()
        runs, errors, ratios = alternated(torch, model, prepared, p.repeats)
    model.zero_grad(set_to_none=True)
    model.eval()
    for side, err in errors.items():
        extra[f"{side}_error"] = err
    for side, r in runs.items():
        extra[f"{side}_runs_ms"] = r
    outs = {side: prep.out for side, prep in prepared.items()}
    diff = rel_diff(outs["gemmlib"], outs["torch"]) if len(outs) == 2 else None
    if "torch_tokens" in extra and "gemmlib_tokens" in extra:
        a, b = extra.pop("torch_tokens"), extra.pop("gemmlib_tokens")
        extra["tokens_agree"] = float((a == b).float().mean())
    extra.pop("torch_tokens", None)
    extra.pop("gemmlib_tokens", None)
    if "torch_grads" in extra and "gemmlib_grads" in extra:
        tg, gg = extra.pop("torch_grads"), extra.pop("gemmlib_grads")
        per = {n: rel_diff(gg[n], tg[n]) for n in tg if n in gg}
        worst = max(per, key=per.get) if per else None
        extra.update(grad_rel_diff=per, grad_rel_diff_max=per.get(worst), grad_worst=worst,
                     loss_rel_diff=abs(extra["gemmlib_loss"] - extra["torch_loss"])
                     / max(abs(extra["torch_loss"]), 1e-30))
    extra.pop("torch_grads", None)
    extra.pop("gemmlib_grads", None)
    del outs, prepared
    ms = {side: statistics.median(r) for side, r in runs.items() if r}
    return make_row(phase, batch, tokens, mode, torch_ms=ms.get("torch"),
                    gemmlib_ms=ms.get("gemmlib"), logits_rel_diff=diff, gpu=gpu,
                    repeats=p.repeats, round_ratios=ratios, **extra)


def run_suite(p: Plan | None = None, on_row=None, progress: bool = True) -> dict:
    """Every case of ``p`` (GPU, transformers); ``on_row(data)`` after each row (e.g. to
    save what is measured so far)."""
    import torch

    p = p or plan()
    model = build_model(torch, p)
    data = {"meta": header(torch, p, model), "rows": []}
    gpu = data["meta"]["gpu"]
    for i, (phase, batch, tokens, mode) in enumerate(p.cases()):
        try:
            row = _measure_case(torch, model, p, phase, batch, tokens, mode, gpu, seed=i + 1)
        except Exception as e:   # outside both sides (e.g. out of memory making inputs)
            row = make_row(phase, batch, tokens, mode, gpu=gpu,
                           error_in_case=f"{type(e).__name__}: {e}")
            row["error"] = row["error_in_case"]
        data["rows"].append(row)
        torch.cuda.empty_cache()
        if progress:
            print(line(row), flush=True)
        if on_row:
            on_row(data)
    return data


def describe(p: Plan) -> list[str]:
    """What ``p`` would measure, a line per row (no GPU needed)."""
    out = [f"e2e: LlamaForCausalLM at Llama 3.1 8B sizes, {p.layers} layers, {p.dtype}, "
           f"random weights; torch against gemmlib.patch, {len(p.cases())} rows"]
    for phase, batch, tokens, mode in p.cases():
        out.append(f"  {phase:<8}{mode:<7}batch {batch:<3} tokens {tokens:<5} "
                   f"{HOW.get((phase, mode), '')}")
    return out


def cli(args) -> int:
    """``python -m gemmlib bench --suite e2e``: the options of :func:`plan` from ``args``."""
    p = plan(phases=args.phases, batches=args.batches, tokens=args.tokens, layers=args.layers,
             dtype=args.dtype, quick=args.quick, new_tokens=args.new_tokens)
    from gemmlib import backend

    from gemmlib.bench_models import torch_gpu

    if backend.SIMULATOR or not torch_gpu():
        for s in describe(p):
            print(s)
        print("the e2e suite times a model on a GPU (torch with CUDA, and transformers): "
              "nothing measured here")
        return 0
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("the e2e suite needs Hugging Face transformers: pip install transformers")
        return 2
    on_row = (lambda data: save(data, args.out)) if args.out else None
    t0 = time.time()
    data = run_suite(p, on_row=on_row, progress=not args.quiet)
    print(f"e2e: {len(data['rows'])} rows in {time.time() - t0:.0f} s")
    if args.out:
        print(f"wrote {save(data, args.out)}")
    return 1 if any("error" in r for r in data["rows"]) else 0
