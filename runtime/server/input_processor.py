"""The tokenizer side of the HTTP process: a GenerateInput becomes a TokenizedRequest (chat
template, tokenization, limits, sampling parameters), or an APIError saying what is wrong.
Imports neither torch nor zmq.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from runtime.core.request import SamplingParams
from runtime.engine.logprob_params import LogprobSamplingParams
from runtime.server.detokenizer import NUM_PROMPT_CONTEXT_TOKENS
from runtime.server.errors import APIError
from runtime.server.ipc import DetokSpec, TokenizedRequest
from runtime.server.protocol import GenerateInput
from runtime.server.tokenizer import Tokenizer


@dataclass(frozen=True)
class ModelLimits:
    max_context_tokens: int
    kv_capacity_tokens: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]        # the model's; the tokenizer's eos is added


@functools.lru_cache(maxsize=1024, typed=True)
def sampling_params(**values) -> SamplingParams:
    """`SamplingParams(**values)`, built and checked once per distinct set of values (requests mostly repeat
    a few; ~4 µs each on the CPU): frozen, so requests share it. `values` are hashable (`process` makes them
    so); typed, so that 1 and 1.0 stay apart (0.0 and -0.0 do not, and sample alike); a refusal (ValueError,
    TypeError) is not cached."""
    return SamplingParams(**values)


class InputProcessor:
    def __init__(self, tokenizer: Tokenizer, limits: ModelLimits) -> None:
        self.tokenizer = tokenizer
        self.limits = limits
        eos = set(limits.eos_token_ids)
        if tokenizer.eos_token_id is not None:
            eos.add(tokenizer.eos_token_id)
        self.eos_token_ids = tuple(sorted(eos))

    def prompt_ids(self, gi: GenerateInput) -> list[int]:
        if gi.messages is not None:
            try:
                text = self.tokenizer.apply_chat_template(
                    gi.messages, add_generation_prompt=not gi.continue_final_message,
                    continue_final_message=gi.continue_final_message)
            except Exception as err:                       # a template may refuse (e.g. role order)
                raise APIError(f"chat template: {err}", param="messages") from err
            ids = self.tokenizer.encode(text, add_special_tokens=False)   # templates spell out BOS
            param = "messages"
        elif gi.text is not None:
            ids, param = self.tokenizer.encode(gi.text), "prompt"
        else:
            ids, param = gi.input_ids, "prompt"              # the request's own list (read only), not a copy
            if type(ids) is not list:
                ids = list(ids or [])
            bad = [i for i in ids if not 0 <= i < self.limits.vocab_size]
            if bad:
                raise APIError(f"token id {bad[0]} outside the vocabulary [0, {self.limits.vocab_size})", param=param)
        if not ids or (gi.text is not None and not gi.text):
            raise APIError("the prompt is empty", param=param)
        return ids

    def stop_token_ids(self, requested: list[int] | None) -> tuple[int, ...]:
        """The request's stop token ids and the model's eos ids, sorted, each once."""
        if not requested:
            return self.eos_token_ids
        return tuple(sorted(set(requested) | set(self.eos_token_ids)))

    def process(self, gi: GenerateInput, rid: str, arrival_clock_s: float) -> TokenizedRequest:
        ids = self.prompt_ids(gi)
        context, num_prompt = self.limits.max_context_tokens, len(ids)
        if num_prompt >= context:
            raise APIError(f"The input ({num_prompt} tokens) is longer than the model's context length "
                           f"({context} tokens, prompt + completion)",
                           param="messages" if gi.messages is not None else "prompt", code="context_length_exceeded")
        if num_prompt + 1 > self.limits.kv_capacity_tokens:
            raise APIError(f"the prompt has {num_prompt} tokens; the KV cache holds "
                           f"{self.limits.kv_capacity_tokens}", param="prompt", code="context_length_exceeded")
        values = dict(gi.sampling)
        outside = [t for t, _ in values.get("logit_bias", ()) if not 0 <= t < self.limits.vocab_size]
        if outside:
            raise APIError(f"logit_bias names token {outside[0]}, outside the vocabulary [0, {self.limits.vocab_size})",
                           param="logit_bias")
        max_new = values.get("max_new_tokens")
        if max_new is None:
            max_new = context - num_prompt
        elif max_new < 1:
            raise APIError(f"max_tokens={max_new}: must be >= 1", param="max_tokens")
        elif max_new >= context:
            raise APIError(f"max_completion_tokens is too large: {max_new}; this model's context is {context} tokens "
                           "(prompt + completion)", param="max_tokens", code="context_length_exceeded")
        elif num_prompt + max_new > context:
            raise APIError(f"this model's context is {context} tokens; the request asks for {num_prompt + max_new} "
                           f"({num_prompt} in the prompt, {max_new} to generate)", param="max_tokens",
                           code="context_length_exceeded")
        values["max_new_tokens"] = max_new
        values["stop_token_ids"] = self.stop_token_ids(values.get("stop_token_ids"))
        start = gi.logprob_start_len
        if start is not None and start >= num_prompt:
            raise APIError(f"logprob_start_len={start}: the prompt has {num_prompt} tokens", param="logprob_start_len")
        try:
            if gi.top_logprobs_num is None:
                sampling = sampling_params(**values)
            else:
                sampling = LogprobSamplingParams(**values, top_logprobs_num=gi.top_logprobs_num,
                                                 logprob_start_len=-1 if start is None else start)
        except (ValueError, TypeError) as err:
            raise APIError(str(err), param=str(err).split(" ")[0]) from err
        detok = DetokSpec(ids[-NUM_PROMPT_CONTEXT_TOKENS:], gi.stop_strs, gi.skip_special_tokens, gi.no_stop_trim)
        return TokenizedRequest(rid, ids, sampling, arrival_clock_s, detok)
