"""`mode=profile`: build the runner exactly as `mode=real` does, fill its KV pool with KV the model wrote, and time its own forward steps over a
grid -- decode batch x context (graph replay and eager), prefill tokens x cached prefix (one and several
sequences), mixed steps, MoE and LM-head operators -- and the host work per step and a step's launch after idle
gaps, into tidy CSV tables under sim/profiles/<hardware>/<model>/ (`profile.out_dir`), with meta.json. Resumable: points already in
a table are skipped. tp=N (ep=M) profiles one replica of N GPUs into tp<N>[ep<M>]/ under that directory
(all but the ops table). Imports torch (through the runner).

  python run.py mode=profile                       # DeepSeek-V2-Lite on this GPU, quick grid
  python run.py mode=profile tp=2                  # ... on 2 GPUs: sim/profiles/<hardware>/<model>/tp2/
  python run.py mode=profile profile.grid=full
  python run.py mode=profile model=tiny_mla_moe hardware=cpu profile.grid=smoke profile.out_dir=/tmp/p
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Iterator

from omegaconf import DictConfig
from tqdm import tqdm

from runtime.build import build_core
from runtime.profile.kv_fill import KV_FILLS, FilledPool, fill_kv_pool, sequence_layout
from runtime.profile.grid import GRIDS, Grid, Limits, decode_points, prefill_points, shared_decode_points
from runtime.profile.plans import SharedPrefixBatch, SyntheticBatch, step_plan
from runtime.profile.tables import ProfileTable, write_meta
from sim.costmodel.profile_layouts import layout_subdir
from sim.costmodel.profile_tables import profile_dir

SECTIONS = ("decode", "prefill", "host", "mixed", "ops", "decode_shared", "idle_launch",   # measured in this order
            "prefill_after_decode")
KV_READING = {"decode", "prefill", "mixed", "decode_shared",        # their steps attend KV already in the pool
              "prefill_after_decode"}
KEYS = {
    "decode": ("path", "batch_size", "context_tokens"),
    "prefill": ("num_seqs", "new_tokens", "prefix_tokens"),
    "mixed": ("new_tokens", "num_decode", "context_tokens"),
    "host": ("kind", "num_reqs", "new_tokens"),
    "ops": ("op", "num_tokens"),
    "decode_shared": ("order", "batch_size", "group_size", "shared_tokens", "private_tokens"),
    "idle_launch": ("kind", "new_tokens", "gap_s"),
    "prefill_after_decode": ("new_tokens",),
}
Point = tuple[str, dict, Callable[[], list[dict] | dict]]   # (table, key values, measure)


def run_profile(cfg: DictConfig, out_dir: str | Path | None = None) -> dict:
    """Measure every grid point missing from the tables; returns {table: rows} and the directory. With
    tp > 1 the layout's ranks are spawned as `mode=real` spawns them (runtime.profile.ranks): the leader
    measures, the others run the steps it launches."""
    if cfg.profile.grid not in GRIDS:
        raise ValueError(f"profile.grid={cfg.profile.grid}: expected one of {sorted(GRIDS)}")
    sections = SECTIONS if cfg.profile.sections is None else tuple(s.strip() for s in str(cfg.profile.sections).split(","))
    if set(sections) - set(SECTIONS):
        raise ValueError(f"profile.sections: {sorted(set(sections) - set(SECTIONS))} not in {SECTIONS}")
    kv_fill = str(cfg.profile.kv_fill)
    if kv_fill not in KV_FILLS:
        raise ValueError(f"profile.kv_fill={kv_fill}: expected one of {KV_FILLS}")
    core = build_core(cfg)
    layout = core.layout
    check_profile_layout(layout, int(cfg.get("nnodes", 1)))
    directory = Path(out_dir or cfg.profile.out_dir
                     or profile_dir(core.hardware.name, core.model.name) / layout_subdir(layout.tp, layout.ep))
    if layout.tp == 1:
        from runtime.engine.build_runner import build_model_runner
        started = time.perf_counter()
        return profile_runner(cfg, core, build_model_runner(cfg, core), directory, sections, started)
    if "ops" in sections:               # single operators of a sharded model: collectives the peers never join
        if cfg.profile.sections is not None:
            raise ValueError(f"profile.sections=ops at tp={layout.tp}: the ops table times single operators "
                             "on one GPU; profile them with tp=1")
        print(f"profile: tp={layout.tp}: the ops section (single operators, one GPU) is skipped")
        sections = tuple(s for s in sections if s != "ops")
    from runtime.profile.ranks import profile_on_ranks
    return profile_on_ranks(cfg, core, directory, sections)


def check_profile_layout(layout, nnodes: int) -> None:
    """mode=profile measures one replica of tp GPUs (ep of them sharing the experts) on one node."""
    if layout.dp > 1 or layout.dp_attention:
        raise ValueError(f"mode=profile measures one replica: dp={layout.dp}"
                         f"{' dp_attention' if layout.dp_attention else ''} is not profiled (a dp layout's "
                         "replicas are priced by the profile of one, tp=N ep=M)")
    if layout.pp > 1 or nnodes > 1:
        raise ValueError(f"mode=profile runs tp (and ep) on one node; pp={layout.pp} nnodes={nnodes} is not profiled")


def profile_runner(cfg: DictConfig, core, runner, directory: Path, sections: tuple[str, ...], started: float) -> dict:
    """Measure `sections` through `runner` (one GPU, or a TP leader whose peers follow its steps) into the
    tables under `directory`, and append this run to its meta.json."""
    from runtime.engine.build_runner import graph_max_batch_size

    grid = GRIDS[cfg.profile.grid]
    kv_fill = str(cfg.profile.kv_fill)
    tables = {s: ProfileTable(directory, s, KEYS[s], resume=bool(cfg.profile.resume)) for s in sections}
    sched = cfg.scheduler
    limits = Limits(kv_slots=core.kv_capacity_tokens,
                    max_context_tokens=core.model.max_context_tokens or core.kv_capacity_tokens,
                    max_batch=int(sched.max_running_requests),
                    max_new_tokens=max(int(sched.chunked_prefill_size), int(sched.max_prefill_tokens)))
    graph_max_bs = graph_max_batch_size(cfg) if runner.graphs is not None else 0
    pool = FilledPool(0)                  # what the fill writes, read by the decode points when they run
    points = [p for s in sections for p in _points(s, cfg, core, runner, grid, limits, graph_max_bs, pool)
              if not tables[p[0]].has(p[1])]
    own_layout = (0, 0)                   # (tokens, count) of the sequences decode points read as their own
    if kv_fill == "model":
        own_layout = _fill_and_measure(points, runner, core, limits, tables, pool, bool(cfg.progress))
    else:
        _measure(points, tables, bool(cfg.progress))
    layout = core.layout
    write_meta(directory, {
        "grid": cfg.profile.grid, "sections": list(sections), "hardware": core.hardware.name,
        "model": core.model.name, "device_name": _device_name(runner.device), "dtype": str(cfg.real.dtype),
        "layout": {"tp": layout.tp, "ep": layout.ep, "pp": layout.pp}, "num_gpus": layout.tp,
        "nccl_graph_mixing": bool(cfg.real.nccl_graph_mixing) if layout.tp > 1 else None,
        "kv_capacity_tokens": core.kv_capacity_tokens, "cuda_graph_max_bs": graph_max_bs,
        "piecewise_max_tokens": runner.piecewise.buckets[-1] if runner.piecewise is not None else 0,
        "fast_path": bool(cfg.real.fast_path), "points_measured": len(points), "kv_fill": kv_fill,
        # decode points of at most this many requests and this context attended KV their own tokens wrote
        "kv_fill_sequences": own_layout[1], "kv_fill_sequence_tokens": own_layout[0],
        "load_s": round(runner.load_time_s, 2), "wall_s": round(time.perf_counter() - started, 1)})
    print(f"profile: {len(points)} points measured in {time.perf_counter() - started:.0f} s -> {directory}")
    return {"directory": str(directory), **{s: len(t) for s, t in tables.items()}}


def _measure(points: list[Point], tables: dict, progress: bool) -> None:
    for table, _, measure in tqdm(points, desc="profile", unit="point", disable=not progress):
        rows = measure()
        for row in rows if isinstance(rows, list) else [rows]:
            tables[table].append(row)


def _fill_and_measure(points: list[Point], runner, core, limits: Limits, tables: dict, pool: FilledPool,
                      progress: bool) -> tuple[int, int]:
    """Decode points whose requests the pool can hold as whole sequences of the longest decode context are
    measured first, over a pool of those sequences (each request attends the KV its own tokens wrote: its
    tokens then pick experts as a served request's do); then the pool is filled again with one-chunk
    prompts for every other point that reads KV (larger decode batches, prefill, mixed, shared prefixes).
    Returns (tokens, count) of those sequences ((0, 0) when no point read them)."""
    fill = lambda sequence_tokens: fill_kv_pool(runner, core.kv_capacity_tokens, limits.max_new_tokens,  # noqa: E731
                                               limits.max_context_tokens, core.model.vocab_size,
                                               progress=progress, sequence_tokens=sequence_tokens)
    decode_contexts = [key["context_tokens"] for table, key, _ in points if table == "decode"]
    length, count = sequence_layout(core.kv_capacity_tokens, limits.max_context_tokens, max(decode_contexts, default=0))
    own = [p for p in points if p[0] == "decode" and p[1]["batch_size"] <= count and p[1]["context_tokens"] <= length]
    rest = [p for p in points if not any(p is q for q in own)]
    if own:
        filled = fill(length)
        pool.num_slots, pool.sequence_tokens, pool.seeds = filled.num_slots, filled.sequence_tokens, filled.seeds
        _measure(own, tables, progress)
    pool.num_slots, pool.sequence_tokens, pool.seeds = 0, 0, []       # the rest read one-chunk prompts' KV
    if any(table in KV_READING for table, _, _ in rest):
        fill(0)
    _measure(rest, tables, progress)
    return (length, count) if own else (0, 0)


def _device_name(device) -> str:
    import torch
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _points(section: str, cfg: DictConfig, core, runner, grid: Grid, limits: Limits, graph_max_bs: int,
            pool: FilledPool) -> Iterator[Point]:
    vocab = core.model.vocab_size
    if section == "decode":
        yield from _decode_points(runner, grid, limits, graph_max_bs, vocab, pool)
    elif section == "prefill":
        for seqs, tokens, prefixes in [(1, grid.prefill_tokens, grid.prefill_prefixes)] + \
                [(k, grid.multi_tokens, grid.multi_prefixes) for k in grid.multi_seqs]:
            for point in prefill_points(tokens, prefixes, seqs, limits):
                yield "prefill", dict(zip(KEYS["prefill"], point)), _prefill(runner, *point, grid.repeats, vocab)
    elif section == "mixed":
        for tokens in grid.mixed_tokens:
            for batch in (b for b in grid.mixed_batches if b * grid.mixed_context + tokens <= limits.kv_slots):
                key = dict(new_tokens=tokens, num_decode=batch, context_tokens=grid.mixed_context)
                yield "mixed", key, _mixed(runner, tokens, batch, grid.mixed_context, grid.repeats, vocab)
    elif section == "host":
        from runtime.profile.host import host_decode_row, host_prefill_row
        for batch in (b for b in grid.host_decode_batches if b <= limits.max_batch):
            yield "host", dict(kind="decode", num_reqs=batch, new_tokens=batch), \
                lambda b=batch: host_decode_row(cfg, core, runner, b, grid.host_steps)
        for reqs, each in grid.host_prefill:
            if reqs * each <= limits.max_new_tokens and each < limits.max_context_tokens:
                yield "host", dict(kind="prefill", num_reqs=reqs, new_tokens=reqs * each), \
                    lambda r=reqs, e=each: host_prefill_row(cfg, core, runner, r, e, grid.host_steps)
    elif section == "idle_launch":
        from runtime.profile.idle_launch import idle_launch_rows
        for kind, size in grid.idle_points:
            if (size <= limits.max_batch) if kind == "decode" else (size <= limits.max_new_tokens):
                yield "idle_launch", dict(kind=kind, new_tokens=size, gap_s=0.0), \
                    lambda k=kind, n=size: idle_launch_rows(cfg, core, runner, k, n, grid.idle_gaps_s, grid.idle_rounds)
    elif section == "prefill_after_decode":
        batch, context = grid.after_decode_batch, grid.after_decode_context
        for tokens in (t for t in grid.after_decode_tokens if t <= limits.max_new_tokens):
            if 0 < batch <= limits.max_batch and batch * context + tokens <= limits.kv_slots:
                yield "prefill_after_decode", dict(new_tokens=tokens), \
                    _prefill_after_decode(runner, tokens, batch, context, grid.repeats, vocab)
    elif section == "decode_shared":
        for batch, group, shared, private in shared_decode_points(grid, limits):
            for order in ("grouped", "interleaved") if 1 < group < batch else ("grouped",):
                key = dict(order=order, batch_size=batch, group_size=group, shared_tokens=shared,
                           private_tokens=private)
                yield "decode_shared", key, _shared_decode(runner, key, graph_max_bs, grid.repeats, vocab)
    elif section == "ops":
        from runtime.profile.ops import op_rows
        for tokens in grid.op_tokens:
            last = "lm_head_sampler" if tokens <= limits.max_batch else "moe_experts_balanced"
            yield "ops", dict(op=last, num_tokens=tokens), \
                lambda t=tokens: op_rows(runner, t, grid.repeats, limits.max_batch)


def _decode_points(runner, grid: Grid, limits: Limits, graph_max_bs: int, vocab: int, pool: FilledPool) -> Iterator[Point]:
    from runtime.profile.timing import eager_decode

    graph = [p for p in decode_points(grid.decode_batches, grid.decode_contexts, limits) if p[0] <= graph_max_bs]
    eager = decode_points(grid.eager_batches, grid.eager_contexts, limits)
    for path, points in (("graph", graph), ("eager", eager)):
        for batch, context in points:
            key = dict(path=path, batch_size=batch, context_tokens=context)
            yield "decode", key, _decode(runner, path, batch, context, grid.repeats, vocab, eager_decode, pool)


def _decode(runner, path: str, batch: int, context: int, repeats: int, vocab: int, eager_decode, pool: FilledPool):
    """Decode of `batch` requests at `context`: the fill's own sequences where the pool holds enough of
    them (each attends KV its own tokens wrote, so its tokens pick experts as a served request's do),
    else requests over slots from 0 (KV other sequences wrote: at batches that large every expert is
    picked either way)."""
    def measure() -> dict:
        from contextlib import nullcontext

        from runtime.profile.plans import decode_items, finish
        from runtime.profile.timing import time_plan
        tag = f"d{path}{batch}x{context}"
        requests = pool.requests(tag, batch, context, vocab)
        if requests is None:
            requests = SyntheticBatch(tag, batch, context, 0, vocab).requests
        with eager_decode(runner) if path == "eager" else nullcontext():
            timing = time_plan(runner, step_plan(decode_items(requests, context)), repeats)
        finish(requests)
        return {"path": path, "batch_size": batch, "context_tokens": context,
                "total_context_tokens": batch * context, **_timing_columns(timing)}
    return measure


def _shared_decode(runner, key: dict, graph_max_bs: int, repeats: int, vocab: int):
    """A decode step whose requests share prefixes (graph replay where the runtime has a graph for the
    batch, else eager, as serving runs it)."""
    def measure() -> dict:
        from contextlib import nullcontext
        from runtime.profile.timing import eager_decode, time_plan
        batch, group = key["batch_size"], key["group_size"]
        synthetic = SharedPrefixBatch(f"s{key['order']}{batch}g{group}x{key['shared_tokens']}+{key['private_tokens']}",
                                      batch, group, key["shared_tokens"], key["private_tokens"], 0, vocab,
                                      interleaved=key["order"] == "interleaved")
        path = "graph" if batch <= graph_max_bs else "eager"
        with eager_decode(runner) if path == "eager" else nullcontext():
            timing = time_plan(runner, step_plan(synthetic.decode_items()), repeats)
        synthetic.release()
        return {**key, "path": path, "context_tokens": synthetic.context_tokens,
                "total_context_tokens": batch * synthetic.context_tokens, "unique_tokens": synthetic.unique_tokens,
                **_timing_columns(timing)}
    return measure


def _prefill(runner, seqs: int, tokens: int, prefix: int, repeats: int, vocab: int):
    def measure() -> dict:
        each = tokens // seqs
        synthetic = SyntheticBatch(f"p{seqs}x{tokens}+{prefix}", seqs, prefix + each, 0, vocab)
        columns = _extend_timing_columns(runner, step_plan(synthetic.extend_items(each, prefix)), repeats)
        synthetic.release()
        return {"num_seqs": seqs, "new_tokens": tokens, "prefix_tokens": prefix, **columns}
    return measure


def _prefill_after_decode(runner, tokens: int, batch: int, context: int, repeats: int, vocab: int):
    """One fresh sequence's prefill of `tokens` timed three ways in one sitting -- back to back (device_s, as the
    prefill table), launch hidden (device_alone_s), and launched right behind decode steps of `batch` requests at
    `context` (after_decode_s) -- and that decode step back to back (decode_s) and right after the prefill
    (decode_after_s): what a served extend that follows a decode run, and the decode that follows it, take."""
    def measure() -> dict:
        from runtime.profile.timing import time_behind_decodes, time_plan
        extend = SyntheticBatch(f"a{tokens}", 1, tokens, 0, vocab)
        decode = SyntheticBatch(f"a{tokens}d{batch}", batch, context, tokens, vocab)
        extend_plan, decode_plan = step_plan(extend.extend_items(tokens, 0)), step_plan(decode.decode_items(context))
        columns = _extend_timing_columns(runner, extend_plan, repeats)
        decode_s = time_plan(runner, decode_plan, repeats).device_s
        after_decode_s, decode_after_s = time_behind_decodes(runner, decode_plan, extend_plan, repeats)
        extend.release()
        decode.release()
        return {"new_tokens": tokens, **columns, "after_decode_s": after_decode_s, "decode_batch": batch,
                "decode_context_tokens": context, "decode_s": decode_s, "decode_after_s": decode_after_s}
    return measure


def _mixed(runner, tokens: int, batch: int, context: int, repeats: int, vocab: int):
    def measure() -> dict:
        extend = SyntheticBatch(f"m{tokens}+{batch}", 1, tokens, 0, vocab)
        decode = SyntheticBatch(f"m{tokens}+{batch}d", batch, context, tokens, vocab)
        columns = _extend_timing_columns(runner, step_plan(extend.extend_items(tokens, 0) + decode.decode_items(context)),
                                         repeats)
        extend.release()
        decode.release()
        return {"new_tokens": tokens, "num_decode": batch, "context_tokens": context, **columns}
    return measure


def _extend_timing_columns(runner, plan, repeats: int) -> dict:
    """A step with extends: timed as serving launches it, then with its launch hidden (`device_alone_s`:
    what a launch begun while the step ahead still runs leaves of the interval, at least)."""
    from runtime.profile.timing import device_alone_s, time_plan
    timing = time_plan(runner, plan, repeats)
    return {**_timing_columns(timing), "device_alone_s": device_alone_s(runner, plan, timing)}


def _timing_columns(timing) -> dict:
    return {"device_s": timing.device_s, "device_min_s": timing.device_min_s,
            "launch_host_s": timing.launch_host_s, "repeats": timing.repeats}
