"""Request bodies of the HTTP API (OpenAI chat/completions, SGLang's native /generate) as strict
pydantic models, and their translation into one `GenerateInput`. Imports neither torch nor zmq.

Strict: a string where a number belongs is a 400, not a silent conversion. Unknown fields are
ignored (as OpenAI-compatible servers do), except those naming a feature this server lacks.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from runtime.engine.logprob_params import MAX_TOP_LOGPROBS
from runtime.server.errors import APIError

MAX_COMPLETION_LOGPROBS = 5      # the legacy completions API's limit
MAX_CHOICES = 128                # prompts x n of one request
PENALTIES = ("frequency_penalty", "presence_penalty", "repetition_penalty")
OPENAI_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "seed", *PENALTIES)   # passed on when given
# SGLang extensions this server lacks (constrained decoding, custom logit processors, hidden states):
# accepted when absent or null (False for flags), a 400 naming them otherwise
UNSUPPORTED_EXTENSIONS = {"regex": None, "ebnf": None, "json_schema": None, "structural_tag": None,
                          "stop_regex": None, "custom_logit_processor": None, "custom_params": None,
                          "return_hidden_states": False}


def expand_choices(prompts: list["GenerateInput"], n: int, rid: "str | list[str] | None") -> list["GenerateInput"]:
    """n choices of each prompt, prompt-major (choice index = prompt index * n + j, as SGLang orders a
    batch), each its own request. rid: one for the whole request (`<rid>-<index>` when there are several
    choices) or one per prompt (`<rid>-<j>` when n > 1). With a seed, choice j samples with seed + j
    (reproducible, yet the choices differ). `prompts` are the request's own, fresh inputs: with n = 1 each
    is its choice (its rid set in place), with n > 1 each choice is a copy."""
    if not 1 <= n <= MAX_CHOICES:
        raise APIError(f"n={n}: must be between 1 and {MAX_CHOICES}", param="n")
    if len(prompts) * n > MAX_CHOICES:
        raise APIError(f"{len(prompts)} prompts x n={n}: at most {MAX_CHOICES} choices per request", param="n")
    if isinstance(rid, list) and len(rid) != len(prompts):
        raise APIError(f"{len(rid)} rids for {len(prompts)} prompts", param="rid")
    if n == 1:
        return _own_choices(prompts, rid)
    out = []
    for i, prompt in enumerate(prompts):
        for j in range(n):
            gi = dataclasses.replace(prompt, sampling=dict(prompt.sampling))
            if j and gi.sampling.get("seed") is not None:
                gi.sampling["seed"] += j
            if isinstance(rid, list):
                gi.rid = rid[i] if n == 1 else f"{rid[i]}-{j}"
            elif rid is not None:
                gi.rid = rid if len(prompts) * n == 1 else f"{rid}-{i * n + j}"
            out.append(gi)
    return out


def _own_choices(prompts: list["GenerateInput"], rid: "str | list[str] | None") -> list["GenerateInput"]:
    """n = 1: each prompt is its one choice; `expand_choices`'s rids, set in place (no copies)."""
    if isinstance(rid, list):
        for prompt, own in zip(prompts, rid):
            prompt.rid = own
    elif rid is not None:
        for i, prompt in enumerate(prompts):
            prompt.rid = rid if len(prompts) == 1 else f"{rid}-{i}"
    return prompts


def parse_logit_bias(bias: dict, param: str) -> tuple[tuple[int, float], ...]:
    """OpenAI's {"token id": bias} as sorted (id, bias) pairs; a key that is not an id is a 400."""
    pairs = []
    for key, value in bias.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise APIError(f"{param} keys must be token ids, got {key!r}", param=param) from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise APIError(f"{param}[{key!r}] must be a number", param=param)
        pairs.append((token, float(value)))
    return tuple(sorted(pairs))


def _check_top_count(value: int, limit: int, param: str) -> None:
    if not 0 <= value <= limit:
        raise APIError(f"{param}={value}: must be between 0 and {limit}", param=param)


# OpenAI parameters this server lacks, and the SGLang extensions: {name: the one accepted value}
OPENAI_UNSUPPORTED = {"tools": [], "functions": [], "best_of": 1, "suffix": "", "response_format": ({"type": "text"},),
                      **UNSUPPORTED_EXTENSIONS}


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")

    def _reject_unsupported(self, names: dict[str, Any]) -> None:
        """400 for a field set to something this server cannot honour ({name: accepted value})."""
        extra = self.model_extra
        fields = type(self).model_fields                 # a class property: looked up once, not per name
        for name, accepted in names.items():
            if name in fields:
                value = getattr(self, name, None)
            elif extra and name in extra:
                value = extra[name]
            else:
                continue                                 # not given: None, which every name accepts
            if value not in (None, accepted) and not (isinstance(accepted, tuple) and value in accepted):
                raise APIError(f"{name}={value!r} is not supported by this server", param=name, code="unsupported")


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False         # vLLM / SGLang: usage so far in every chunk


class _OpenAISampling(_Strict):
    model: str
    max_tokens: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    n: int = 1
    stop: Union[str, list[str], None] = None
    seed: Optional[int] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    # SGLang / vLLM extensions
    ignore_eos: bool = False
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    stop_token_ids: Optional[list[int]] = None
    skip_special_tokens: bool = True
    frequency_penalty: Optional[float] = None
    presence_penalty: Optional[float] = None
    repetition_penalty: Optional[float] = None
    min_tokens: Optional[int] = None             # vLLM / SGLang: SGLang's min_new_tokens
    logit_bias: Optional[dict[str, float]] = None   # token id (as a string, OpenAI's) -> bias in [-100, 100]
    no_stop_trim: bool = False                   # SGLang: keep the matched stop string in the text
    rid: Optional[str] = None

    def check_common(self) -> None:
        if not 1 <= self.n <= MAX_CHOICES:
            raise APIError(f"n={self.n}: must be between 1 and {MAX_CHOICES}", param="n")
        if self.stream_options is not None and not self.stream:
            raise APIError("stream_options is only allowed with stream=true", param="stream_options")
        self._reject_unsupported(OPENAI_UNSUPPORTED)

    def sampling(self, max_tokens: Optional[int]) -> dict:
        out: dict[str, Any] = {"max_new_tokens": max_tokens, "ignore_eos": self.ignore_eos}
        for key in OPENAI_SAMPLING_KEYS:
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.stop_token_ids:
            out["stop_token_ids"] = list(self.stop_token_ids)
        if self.min_tokens is not None:
            out["min_new_tokens"] = self.min_tokens
        if self.logit_bias:
            out["logit_bias"] = parse_logit_bias(self.logit_bias, "logit_bias")
        return out

    def choices(self, prompts: list["GenerateInput"]) -> list["GenerateInput"]:
        return expand_choices(prompts, self.n, self.rid)

    def stop_strs(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        stops = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if "" in stops:
            raise APIError("stop strings must not be empty", param="stop")
        return stops

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def continuous_usage(self) -> bool:
        """Every streamed chunk carries the usage so far."""
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: Union[str, list[TextPart], None] = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class ChatCompletionRequest(_OpenAISampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[int] = None
    logprobs: bool = False
    top_logprobs: Optional[int] = None
    continue_final_message: bool = False         # SGLang / vLLM: the reply continues the last (assistant) message

    def generate_inputs(self) -> list["GenerateInput"]:
        """One request per choice (n)."""
        return self.choices([self._generate_input()])

    def _generate_input(self) -> "GenerateInput":
        self.check_common()
        self._reject_unsupported({"echo": False})
        if self.max_tokens is not None and self.max_completion_tokens is not None \
                and self.max_tokens != self.max_completion_tokens:
            raise APIError("give max_tokens or max_completion_tokens, not two different values", param="max_tokens")
        if self.top_logprobs is not None:
            if not self.logprobs:
                raise APIError("top_logprobs needs logprobs=true", param="top_logprobs")
            _check_top_count(self.top_logprobs, MAX_TOP_LOGPROBS, "top_logprobs")
        if self.continue_final_message and self.messages[-1].role != "assistant":
            raise APIError("continue_final_message needs an assistant message last", param="continue_final_message")
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        return GenerateInput(messages=[{"role": m.role, "content": m.text()} for m in self.messages],
                             continue_final_message=self.continue_final_message,
                             sampling=self.sampling(max_tokens), stop_strs=self.stop_strs(), stream=self.stream,
                             rid=self.rid, skip_special_tokens=self.skip_special_tokens, no_stop_trim=self.no_stop_trim,
                             top_logprobs_num=(self.top_logprobs or 0) if self.logprobs else None)


class CompletionRequest(_OpenAISampling):
    prompt: Union[list[int], str, list[str], list[list[int]]]   # token ids first: 5x faster to validate
    logprobs: Optional[int] = None
    echo: bool = False               # the prompt before the completion (with logprobs: its tokens' too)

    def generate_inputs(self) -> list["GenerateInput"]:
        """One request per prompt of a batch (a list of strings or of token-id lists) and choice (n)."""
        self.check_common()
        prompts = self.prompt
        if not (isinstance(prompts, list) and prompts and isinstance(prompts[0], (str, list))):
            prompts = [prompts]                  # one prompt: text, or token ids
        if self.logprobs is not None:
            _check_top_count(self.logprobs, MAX_COMPLETION_LOGPROBS, "logprobs")
        sampling, stops = self.sampling(self.max_tokens if self.max_tokens is not None else 16), self.stop_strs()
        inputs = []
        for prompt in prompts:
            text, ids = (prompt, None) if isinstance(prompt, str) else (None, prompt)   # the parsed list, read only
            inputs.append(GenerateInput(text=text, input_ids=ids, sampling=dict(sampling), stop_strs=stops,
                                        stream=self.stream, rid=self.rid, skip_special_tokens=self.skip_special_tokens,
                                        no_stop_trim=self.no_stop_trim,
                                        top_logprobs_num=self.logprobs,
                                        logprob_start_len=0 if self.echo and self.logprobs is not None else None))
        return self.choices(inputs)


class NativeSampling(_Strict):
    model_config = ConfigDict(strict=True, extra="forbid")
    max_new_tokens: Optional[int] = 128
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    ignore_eos: bool = False
    stop: Union[str, list[str], None] = None
    stop_token_ids: Optional[list[int]] = None
    seed: Optional[int] = None
    sampling_seed: Optional[int] = None
    skip_special_tokens: bool = True
    n: int = 1                       # parallel samples of each prompt
    no_stop_trim: bool = False       # keep the matched stop string in the text
    spaces_between_special_tokens: bool = True   # accepted; the tokenizers here decode without extra spaces
    logit_bias: Optional[dict] = None
    min_new_tokens: Optional[int] = None
    frequency_penalty: Optional[float] = None
    presence_penalty: Optional[float] = None
    repetition_penalty: Optional[float] = None
    # SGLang keys this server cannot honour: accepted when null, a 400 otherwise
    json_schema: Optional[str] = None
    regex: Optional[str] = None
    ebnf: Optional[str] = None
    structural_tag: Optional[str] = None
    custom_params: Optional[dict] = None


class GenerateRequest(_Strict):
    """SGLang's native API: a prompt as `text` or `input_ids`, or a batch of them (a list of strings, a list
    of id lists), with one `sampling_params` for all or one per prompt; `sampling_params.n` samples each
    prompt n times. A batch (or n > 1) is answered with a list, prompt-major; streamed, every event is one
    choice's cumulative body with its `index`."""

    text: Union[str, list[str], None] = None
    input_ids: Union[list[int], list[list[int]], None] = None
    sampling_params: Union[NativeSampling, list[NativeSampling]] = Field(default_factory=NativeSampling)
    stream: bool = False
    rid: Union[str, list[str], None] = None
    return_logprob: bool = False
    top_logprobs_num: Optional[int] = None
    logprob_start_len: Optional[int] = None
    return_text_in_logprobs: bool = False

    def _prompts(self) -> tuple[list[tuple[Optional[str], Optional[list[int]]]], bool]:
        """Each prompt as (text, input_ids), and whether they came as a batch (a list of them)."""
        if self.text is not None:
            batch = isinstance(self.text, list)
            return [(t, None) for t in (self.text if batch else [self.text])], batch
        batch = bool(self.input_ids) and isinstance(self.input_ids[0], list)
        return [(None, ids) for ids in (self.input_ids if batch else [self.input_ids])], batch

    @property
    def is_batch(self) -> bool:
        """Answered with a list: a batch of prompts, or n > 1."""
        params = self.sampling_params if isinstance(self.sampling_params, list) else [self.sampling_params]
        return self._prompts()[1] or any(sp.n != 1 for sp in params)

    def generate_inputs(self) -> list["GenerateInput"]:
        """One request per prompt and sample (prompt-major)."""
        if (self.text is None) == (self.input_ids is None):
            raise APIError("give exactly one of text or input_ids", param="text")
        self._reject_unsupported({"token_ids_logprob": None, "custom_logit_processor": None,
                                  "return_hidden_states": False})
        prompts, _ = self._prompts()
        if not prompts:
            raise APIError("an empty batch of prompts", param="text" if self.text is not None else "input_ids")
        params = self.sampling_params
        if isinstance(params, list):
            if len(params) != len(prompts):
                raise APIError(f"{len(params)} sampling_params for {len(prompts)} prompts", param="sampling_params")
            if len({sp.n for sp in params}) != 1:
                raise APIError("sampling_params.n must be the same for every prompt", param="sampling_params.n")
        else:
            params = [params] * len(prompts)
        inputs = [self._generate_input(text, ids, sp) for (text, ids), sp in zip(prompts, params)]
        return expand_choices(inputs, params[0].n, self.rid)

    def _generate_input(self, text: Optional[str], input_ids: Optional[list[int]], sp: NativeSampling) -> "GenerateInput":
        for key in ("json_schema", "regex", "ebnf", "structural_tag", "custom_params"):
            if getattr(sp, key):
                raise APIError(f"sampling_params.{key} is not supported by this server", param=f"sampling_params.{key}",
                               code="unsupported")
        if sp.max_new_tokens is not None and sp.max_new_tokens < 1:
            raise APIError(f"sampling_params.max_new_tokens={sp.max_new_tokens}: must be >= 1 (scoring a prompt "
                           "without generating is not supported)", param="sampling_params.max_new_tokens")
        sampling: dict[str, Any] = {"max_new_tokens": sp.max_new_tokens, "ignore_eos": sp.ignore_eos}
        for key in ("temperature", "top_p", "top_k", "min_p", "min_new_tokens", *PENALTIES):
            if getattr(sp, key) is not None:
                sampling[key] = getattr(sp, key)
        seed = sp.seed if sp.seed is not None else sp.sampling_seed
        if seed is not None:
            sampling["seed"] = seed
        if sp.stop_token_ids:
            sampling["stop_token_ids"] = list(sp.stop_token_ids)
        if sp.logit_bias:
            sampling["logit_bias"] = parse_logit_bias(sp.logit_bias, "sampling_params.logit_bias")
        stops = (sp.stop,) if isinstance(sp.stop, str) else tuple(sp.stop or ())
        if any(s == "" for s in stops):
            raise APIError("stop strings must not be empty", param="sampling_params.stop")
        return GenerateInput(text=text, input_ids=input_ids, sampling=sampling, stop_strs=stops,
                             stream=self.stream, rid=None,
                             skip_special_tokens=sp.skip_special_tokens, no_stop_trim=sp.no_stop_trim,
                             top_logprobs_num=self._top_logprobs_num(),
                             logprob_start_len=self._logprob_start_len())

    def _top_logprobs_num(self) -> Optional[int]:
        """As SGLang: the logprob fields count only with return_logprob."""
        if self.top_logprobs_num is not None:
            _check_top_count(self.top_logprobs_num, MAX_TOP_LOGPROBS, "top_logprobs_num")
        return (self.top_logprobs_num or 0) if self.return_logprob else None

    def _logprob_start_len(self) -> Optional[int]:
        """The first prompt position of input_token_logprobs (-1, the default: the last prompt token
        alone, whose entry has no value); only with return_logprob."""
        start = -1 if self.logprob_start_len is None else self.logprob_start_len
        if start < -1:
            raise APIError(f"logprob_start_len={start}: must be -1 or a prompt position >= 0",
                           param="logprob_start_len")
        return start if self.return_logprob and start >= 0 else None


class AbortRequest(_Strict):
    """SGLang's: one request by `rid`, or every request in flight with `abort_all`."""

    rid: Optional[str] = None
    abort_all: bool = False

    def rids(self) -> list[str] | None:
        """The rids to abort; None: every request in flight."""
        if self.abort_all:
            return None
        if not self.rid:
            raise APIError("give a rid, or abort_all=true", param="rid")
        return [self.rid]


@dataclass
class GenerateInput:
    """One request in the server's terms, whatever the endpoint: a prompt (`messages` for chat,
    `text`, or `input_ids`), SGLang-style sampling keys (max_new_tokens None = up to the context),
    stop strings."""

    text: Optional[str] = None
    input_ids: Optional[list[int]] = None
    messages: Optional[list[dict]] = None
    continue_final_message: bool = False       # chat: render the last message open, without a generation prompt
    sampling: dict = field(default_factory=dict)
    stop_strs: tuple[str, ...] = ()
    stream: bool = False
    rid: Optional[str] = None
    skip_special_tokens: bool = True
    no_stop_trim: bool = False                 # keep the matched stop string in the text
    top_logprobs_num: Optional[int] = None     # None: no log-probabilities; k: the token's and the top k
    logprob_start_len: Optional[int] = None    # prompt tokens from this position on get theirs too
