"""Offline engine API (SGLang's `Engine`): `Engine(cfg).generate(prompts | input_ids, sampling_params)`
runs requests through the same scheduler and model runner as `mode=real` and returns text, token
ids and meta info. Imports torch through the model runner.
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Sequence

from omegaconf import DictConfig

from runtime.build import build_core
from runtime.core.request import RequestSpec, SamplingParams
from runtime.driver import RealDriver
from runtime.engine.build_runner import build_model_runner
from runtime.server.tokenizer import Tokenizer, load_tokenizer

SAMPLING_KEYS = {f.name for f in dataclasses.fields(SamplingParams)}


def to_sampling_params(params: SamplingParams | dict | None) -> SamplingParams:
    """A SamplingParams from an SGLang-style dict ({"max_new_tokens": 16, "temperature": 0, ...});
    unknown keys are an error naming the valid ones."""
    if params is None:
        return SamplingParams()
    if isinstance(params, SamplingParams):
        return params
    unknown = set(params) - SAMPLING_KEYS
    if unknown:
        raise ValueError(f"unknown sampling params {sorted(unknown)}; valid: {sorted(SAMPLING_KEYS)}")
    values = dict(params)
    if "stop_token_ids" in values:
        values["stop_token_ids"] = tuple(values["stop_token_ids"])
    return SamplingParams(**values)


class Engine:
    """Holds one scheduler (so the radix cache stays warm across `generate` calls), one model
    runner and the tokenizer (`tokenizer.path` or the built-in byte tokenizer)."""

    def __init__(self, cfg: DictConfig, runner=None) -> None:
        """`runner`: an already built ModelRunner for the same model and KV capacity (benchmarks
        sharing one GPU); default: build one exactly as mode=real does (fast path, graphs)."""
        self.cfg = cfg
        self.core = build_core(cfg)
        self.runner = runner if runner is not None else build_model_runner(cfg, self.core)
        self._tokenizer: Tokenizer | None = None
        self._ids = itertools.count()

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.cfg.tokenizer.path, self.core.model.vocab_size)
        return self._tokenizer

    def _has_tokenizer(self) -> bool:
        """A local tokenizer is configured, or the model's vocabulary holds the byte tokenizer's."""
        return self.cfg.tokenizer.path is not None or self.core.model.vocab_size >= 259

    def _stop_ids(self) -> tuple[int, ...]:
        """The model's eos ids plus the tokenizer's: the same set on every call (the tokenizer is
        loaded here if need be, not only once a result is first decoded)."""
        ids = set(self.core.model.eos_token_ids)
        if self._has_tokenizer() and self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return tuple(sorted(ids))

    def generate(self, prompts: str | Sequence[str] | None = None,
                 sampling_params: SamplingParams | dict | Sequence[SamplingParams | dict] | None = None,
                 input_ids: Sequence[int] | Sequence[Sequence[int]] | None = None,
                 ) -> dict[str, Any] | list[dict[str, Any]]:
        """Generate for one prompt (returns a dict) or a batch (returns a list, in input order).
        Each result: {"text", "token_ids", "meta_info": {prompt_tokens, completion_tokens,
        cached_tokens, finish_reason, latency_s, ttft_s}}."""
        single, batch_ids = self._inputs(prompts, input_ids)
        params = sampling_params if isinstance(sampling_params, (list, tuple)) else [sampling_params] * len(batch_ids)
        if len(params) != len(batch_ids):
            raise ValueError(f"{len(params)} sampling params for {len(batch_ids)} prompts")
        specs = []
        for ids, p in zip(batch_ids, params):
            sp = to_sampling_params(p)
            if not sp.stop_token_ids:
                sp = dataclasses.replace(sp, stop_token_ids=self._stop_ids())
            specs.append(RequestSpec(f"engine-{next(self._ids)}", 0.0, tuple(ids), sp.max_new_tokens, sampling=sp))
        outcome = RealDriver(self.core.scheduler, self.runner, as_fast_as_possible=True,
                             progress=False, overlap=bool(self.cfg.overlap)).run(specs)
        by_rid = {r.rid: r for r in outcome.requests}
        results = [self._result(by_rid[s.rid]) for s in specs]
        return results[0] if single else results

    def _inputs(self, prompts, input_ids) -> tuple[bool, list[list[int]]]:
        if (prompts is None) == (input_ids is None):
            raise ValueError("give exactly one of prompts or input_ids")
        if prompts is not None:
            single = isinstance(prompts, str)
            texts = [prompts] if single else list(prompts)
            return single, [self.tokenizer.encode(t) for t in texts]
        single = len(input_ids) > 0 and isinstance(input_ids[0], int)
        batch = [list(input_ids)] if single else [list(x) for x in input_ids]
        if any(not ids for ids in batch):
            raise ValueError("empty prompt")
        return single, batch

    def _result(self, req) -> dict[str, Any]:
        text = None
        if self._has_tokenizer():
            text = self.tokenizer.decode(req.output_ids)
        return {
            "text": text,
            "token_ids": list(req.output_ids),
            "meta_info": {
                "prompt_tokens": len(req.input_ids),
                "completion_tokens": len(req.output_ids),
                "cached_tokens": req.num_cached_tokens,
                "finish_reason": req.finish_reason.value if req.finish_reason else None,
                "latency_s": (req.finish_s - req.arrival_s) if req.finish_s is not None else None,
                "ttft_s": (req.first_token_s - req.arrival_s) if req.first_token_s is not None else None,
            },
        }
