"""Workloads: determinism, ordering, common knobs, prefix-sharing structure, trace parsing and
errors, and Hydra configs. Synthetic trace files only; real files are a skipped-if-absent smoke."""
from __future__ import annotations

import math
from array import array
from pathlib import Path

import numpy as np
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from experiments.workloads.arxiv_lengths import ArxivWorkload
from experiments.workloads.azure import AzureWorkload, read_azure_rows
from experiments.workloads.block_tokens import BlockTokenSynthesizer
from experiments.workloads.mooncake import MooncakeWorkload, read_mooncake_rows
from experiments.workloads.paths import repo_root, resolve_trace_path
from experiments.workloads.random_lengths import RandomWorkload
from experiments.workloads.shared_prefix import SharedPrefixWorkload
from experiments.workloads.sharegpt_multiturn import ShareGPTMultiturnWorkload
from experiments.workloads.tokens import random_prompts
from runtime.core.request import RequestSpec
from tests.experiments.trace_files import (default_traces, mooncake_row, sharegpt_row, write_azure,
                                           write_jsonl)

VOCAB = 50_000
CONF_DIR = repo_root() / "conf" / "workload"
SHARED_DATA = repo_root().parent / "shared" / "data"


def _lcp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


FACTORIES = {
    "shared_prefix": lambda t, **kw: SharedPrefixWorkload(vocab_size=VOCAB, num_groups=3, prompts_per_group=4,
                                                          system_prompt_len=40, question_len=8, output_len=5,
                                                          request_rate=20.0, **kw),
    "random": lambda t, **kw: RandomWorkload(vocab_size=VOCAB, input_len=30, output_len=6, range_ratio=0.5,
                                             request_rate=10.0, burstiness=0.5, **{"num_requests": 20, **kw}),
    "mooncake": lambda t, **kw: MooncakeWorkload(vocab_size=VOCAB, path=str(t["mooncake"]), **kw),
    "azure": lambda t, **kw: AzureWorkload(vocab_size=VOCAB, path=str(t["azure"]), **kw),
    "sharegpt": lambda t, **kw: ShareGPTMultiturnWorkload(vocab_size=VOCAB, path=str(t["sharegpt"]), **kw),
    "arxiv": lambda t, **kw: ArxivWorkload(vocab_size=VOCAB, path=str(t["arxiv"]), request_rate=5.0,
                                           **{"num_requests": 25, **kw}),
}
SEEDED = ["shared_prefix", "random", "mooncake", "azure", "arxiv"]  # sharegpt has real ids


@pytest.fixture
def traces(tmp_path: Path) -> dict[str, Path]:
    return default_traces(tmp_path)


def check_contract(specs: list[RequestSpec], vocab_size: int = VOCAB) -> None:
    assert specs, "no requests"
    assert len({s.rid for s in specs}) == len(specs)
    assert [(s.arrival_s, s.rid) for s in specs] == sorted((s.arrival_s, s.rid) for s in specs)
    for s in specs:
        assert isinstance(s.input_ids, (tuple, array)) and len(s.input_ids) >= 1
        assert all(type(t) is int and 0 <= t < vocab_size for t in s.input_ids)
        assert s.output_len >= 1 and s.arrival_s >= 0
        assert s.sampling_params().max_new_tokens == s.output_len


# -- common knobs -------------------------------------------------------------------------
@pytest.mark.parametrize("name", FACTORIES)
def test_deterministic_sorted_and_valid(name: str, traces: dict[str, Path]) -> None:
    first = FACTORIES[name](traces, seed=7).requests()
    check_contract(first)
    assert first == FACTORIES[name](traces, seed=7).requests()


@pytest.mark.parametrize("name", SEEDED)
def test_other_seed_other_tokens(name: str, traces: dict[str, Path]) -> None:
    a = FACTORIES[name](traces, seed=1).requests()
    b = FACTORIES[name](traces, seed=2).requests()
    assert [s.input_ids for s in a] != [s.input_ids for s in b]


@pytest.mark.parametrize("name", FACTORIES)
def test_time_scale_multiplies_arrivals(name: str, traces: dict[str, Path]) -> None:
    base = FACTORIES[name](traces, seed=3).requests()
    fast = FACTORIES[name](traces, seed=3, time_scale=0.5).requests()
    assert [s.rid for s in fast] == [s.rid for s in base]
    assert [s.arrival_s for s in fast] == pytest.approx([0.5 * s.arrival_s for s in base])
    assert [s.input_ids for s in fast] == [s.input_ids for s in base]


@pytest.mark.parametrize("name", FACTORIES)
def test_num_requests_keeps_the_first_arrivals(name: str, traces: dict[str, Path]) -> None:
    full = FACTORIES[name](traces, seed=5).requests()
    assert FACTORIES[name](traces, seed=5, num_requests=2).requests() == full[:2]
    if name not in ("random", "arxiv"):  # for these two num_requests is the count drawn
        assert FACTORIES[name](traces, seed=5, num_requests=10_000).requests() == full


@pytest.mark.parametrize("bad", [{"num_requests": -1}, {"time_scale": -1.0}, {"time_scale": math.nan}])
def test_bad_common_args_rejected(bad: dict, traces: dict[str, Path]) -> None:
    for name in FACTORIES:
        with pytest.raises(ValueError):
            FACTORIES[name](traces, **bad)


# -- shared prefix --------------------------------------------------------------------------
def test_shared_prefix_groups_share_exactly_the_system_prompt() -> None:
    specs = SharedPrefixWorkload(vocab_size=1000, num_groups=6, prompts_per_group=5, system_prompt_len=64,
                                 question_len=16, output_len=3, seed=0).requests()
    check_contract(specs, 1000)
    group_of = {s.rid: s.rid.split("-g")[1].split("-")[0] for s in specs}
    for i, a in enumerate(specs):
        assert len(a.input_ids) == 64 + 16
        for b in specs[i + 1:]:
            same_group = group_of[a.rid] == group_of[b.rid]
            assert _lcp(a.input_ids, b.input_ids) == (64 if same_group else 0)


def test_shared_prefix_defaults_interleave_groups_at_t0() -> None:
    specs = SharedPrefixWorkload(vocab_size=102_400).requests()
    assert len(specs) == 128 and all(s.arrival_s == 0 for s in specs)
    groups = [s.rid.split("-g")[1].split("-")[0] for s in specs]
    assert len(set(groups[:16])) >= 5, "the first prompts should come from many groups"
    changes = sum(a != b for a, b in zip(groups, groups[1:]))
    assert changes > 90, "groups should be shuffled, not contiguous"
    assert {len(s.input_ids) for s in specs} == {2048 + 128} and {s.output_len for s in specs} == {256}


def test_shared_prefix_poisson_rate_and_range_ratio() -> None:
    specs = SharedPrefixWorkload(vocab_size=1000, num_groups=20, prompts_per_group=50, system_prompt_len=10,
                                 question_len=20, output_len=30, range_ratio=0.5, request_rate=50.0).requests()
    gaps = np.diff([s.arrival_s for s in specs])
    assert gaps.mean() == pytest.approx(1 / 50, rel=0.1)
    assert all(15 <= len(s.input_ids) <= 30 and 15 <= s.output_len <= 30 for s in specs)


# -- random ----------------------------------------------------------------------------------
@pytest.mark.parametrize("burstiness, cv", [(1.0, 1.0), (0.25, 2.0), (4.0, 0.5)])
def test_random_burstiness_sets_interarrival_cv(burstiness: float, cv: float) -> None:
    specs = RandomWorkload(vocab_size=100, input_len=1, output_len=1, request_rate=20.0, burstiness=burstiness,
                           num_requests=20_000, seed=11).requests()
    gaps = np.diff([s.arrival_s for s in specs])
    assert gaps.mean() == pytest.approx(1 / 20, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.1)


def test_random_lengths_and_no_shared_prefix() -> None:
    specs = RandomWorkload(vocab_size=VOCAB, input_len=100, output_len=40, range_ratio=0.3, num_requests=300).requests()
    assert all(s.arrival_s == 0 for s in specs)
    assert all(30 <= len(s.input_ids) <= 100 and 12 <= s.output_len <= 40 for s in specs)
    assert len({s.input_ids[0] for s in specs}) == len(specs)
    fixed = RandomWorkload(vocab_size=VOCAB, input_len=9, output_len=4, range_ratio=1.0, num_requests=5).requests()
    assert {len(s.input_ids) for s in fixed} == {9} and {s.output_len for s in fixed} == {4}


# -- mooncake --------------------------------------------------------------------------------
def test_mooncake_blocks_share_tokens_by_hash_id(traces: dict[str, Path]) -> None:
    specs = {s.rid: s for s in MooncakeWorkload(vocab_size=VOCAB, path=str(traces["mooncake"]), seed=0).requests()}
    a, b, c, d, e = (specs[f"mooncake-{i:06d}"] for i in range(5))  # hash ids: 012, 013, 04, 5, 0126
    assert len(a.input_ids) == 1536 and len(b.input_ids) == 1100 and len(d.input_ids) == 7
    assert _lcp(a.input_ids, b.input_ids) == 1024        # two shared blocks, then hash 2 vs 3
    assert _lcp(a.input_ids, c.input_ids) == 512
    assert _lcp(a.input_ids, d.input_ids) == 0
    assert e.input_ids[:1536] == a.input_ids              # a is a full prefix of e
    assert d.output_len == 1                              # output_length 0 is clamped


def test_mooncake_last_block_is_a_truncated_block(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [mooncake_row(0, [9, 4]), mooncake_row(1, [7, 4], input_length=600)])
    full, cut = MooncakeWorkload(vocab_size=VOCAB, path=str(path)).requests()
    assert len(cut.input_ids) == 600
    assert cut.input_ids[512:] == full.input_ids[512:600]  # hash 4 cut to 88 tokens
    assert _lcp(full.input_ids, cut.input_ids) == 0


def test_mooncake_arrivals_in_seconds(traces: dict[str, Path]) -> None:
    specs = MooncakeWorkload(vocab_size=VOCAB, path=str(traces["mooncake"])).requests()
    assert [s.arrival_s for s in specs] == [0.0, 0.0, 0.25, 1.25, 1.25]
    assert [s.rid for s in specs] == [f"mooncake-{i:06d}" for i in range(5)]


@pytest.mark.parametrize("bad_line, message", [
    ('{"timestamp": 0, "input_length": 10', "bad JSON"),
    ('[1, 2]', "expected a JSON object"),
    ('{"timestamp": 0, "output_length": 1, "hash_ids": [1]}', "missing field 'input_length'"),
    ('{"timestamp": 0, "input_length": "10", "output_length": 1, "hash_ids": [1]}', "must be an integer"),
    ('{"timestamp": 0, "input_length": 10, "output_length": -1, "hash_ids": [1]}', "'output_length' must be >= 0"),
    ('{"timestamp": -5, "input_length": 10, "output_length": 1, "hash_ids": [1]}', "'timestamp'"),
    ('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1]}', "needs ceil(600/512) = 2"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1.5]}', "list of integers"),
])
def test_mooncake_bad_line_names_file_and_line(tmp_path: Path, bad_line: str, message: str) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [mooncake_row(0, [1]), mooncake_row(1, [2]), bad_line])
    workload = MooncakeWorkload(vocab_size=VOCAB, path=str(path))
    with pytest.raises(ValueError) as info:
        workload.requests()
    assert "bad.jsonl:3: " in str(info.value) and message in str(info.value)


def test_missing_trace_says_how_to_pass_one(tmp_path: Path) -> None:
    for cls in (MooncakeWorkload, AzureWorkload, ShareGPTMultiturnWorkload, ArxivWorkload):
        with pytest.raises(FileNotFoundError) as info:
            cls(vocab_size=VOCAB, path=str(tmp_path / "nope.jsonl"))
        assert "nope.jsonl" in str(info.value) and "workload.path=" in str(info.value)


def test_relative_paths_resolve_against_repo_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # as from a Hydra run directory
    assert resolve_trace_path("pyproject.toml") == repo_root() / "pyproject.toml"


# -- azure -----------------------------------------------------------------------------------
def test_azure_timestamps_at_100ns_and_lengths(traces: dict[str, Path]) -> None:
    specs = AzureWorkload(vocab_size=VOCAB, path=str(traces["azure"])).requests()
    assert [s.arrival_s for s in specs] == pytest.approx([0.0, 1e-7, 4.314579, 14.31941], abs=1e-9)
    assert specs[1].arrival_s > 0
    assert [len(s.input_ids) for s in specs] == [40, 30, 20, 10]
    assert [s.output_len for s in specs] == [4, 1, 7, 2]  # GeneratedTokens 0 -> 1


def test_azure_rebases_on_the_earliest_row_and_sorts(tmp_path: Path) -> None:
    path = write_azure(tmp_path / "a.csv", [("2023-11-16 18:00:02.5", 3, 1), ("2023-11-16 18:00:00", 4, 1)])
    specs = AzureWorkload(vocab_size=VOCAB, path=str(path)).requests()
    assert [(s.rid, s.arrival_s) for s in specs] == [("azure-000001", 0.0), ("azure-000000", 2.5)]


@pytest.mark.parametrize("row, message", [
    ("2023-11-16 18:15:47.1,12", "expected 3 columns"),
    ("yesterday,12,3", "TIMESTAMP is not a date-time"),
    ("2023-11-16 18:15:47.1,twelve,3", "ContextTokens must be an integer"),
    ("2023-11-16 18:15:47.1,0,3", "ContextTokens must be >= 1"),
    ("2023-11-16 18:15:47.1,12,-3", "GeneratedTokens must be >= 0"),
])
def test_azure_bad_row_names_file_and_line(tmp_path: Path, row: str, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n" + row + "\n")
    with pytest.raises(ValueError) as info:
        read_azure_rows(path)
    assert "bad.csv:3: " in str(info.value) and message in str(info.value)


def test_azure_bad_header(tmp_path: Path) -> None:
    path = write_azure(tmp_path / "h.csv", [("2023-11-16 18:15:46", 3, 1)], header="time,in,out")
    with pytest.raises(ValueError, match="h.csv:1: expected header"):
        read_azure_rows(path)


# -- sharegpt --------------------------------------------------------------------------------
def test_sharegpt_keeps_real_ids_and_expected_outputs(traces: dict[str, Path]) -> None:
    specs = ShareGPTMultiturnWorkload(vocab_size=128_256, path=str(traces["sharegpt"])).requests()
    assert [s.arrival_s for s in specs] == pytest.approx([0.046926808, 0.347938951, 0.479613520])
    assert specs[0].input_ids == (5, 6, 7) and specs[0].expected_output_ids == (8, 9) and specs[0].output_len == 2
    assert specs[1].input_ids == (5, 6, 7, 8, 9, 130_000 % 128_256)  # next turn = context + reply
    assert specs[1].input_ids[:5] == specs[0].input_ids + specs[0].expected_output_ids
    small = ShareGPTMultiturnWorkload(vocab_size=1000, path=str(traces["sharegpt"])).requests()
    assert small[1].input_ids[-1] == 130_000 % 1000


def test_sharegpt_count_mismatch_is_an_error(tmp_path: Path) -> None:
    row = sharegpt_row(0, [1, 2], [3])
    row["input_toks"] = 3
    path = write_jsonl(tmp_path / "s.jsonl", [sharegpt_row(0, [1], [2]), row])
    with pytest.raises(ValueError, match=r"s.jsonl:2: input_toks is 3 but input_tok_ids has 2 ids"):
        ShareGPTMultiturnWorkload(vocab_size=VOCAB, path=str(path)).requests()


def test_sharegpt_zero_output_becomes_one_without_expected_ids(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "s.jsonl", [sharegpt_row(0, [1, 2], [])])
    (spec,) = ShareGPTMultiturnWorkload(vocab_size=VOCAB, path=str(path)).requests()
    assert spec.output_len == 1 and spec.expected_output_ids is None


# -- Hydra configs ---------------------------------------------------------------------------
def _compose(name: str, **overrides: object) -> object:
    root = OmegaConf.create({"seed": 0, "model": {"hf_config": {"vocab_size": VOCAB}}})
    root.workload = OmegaConf.load(CONF_DIR / f"{name}.yaml")
    for key, value in overrides.items():
        root.workload[key] = value
    return instantiate(root.workload)


TRACE_OF_CONFIG = {"mooncake": "mooncake", "mooncake_conversation": "mooncake", "mooncake_synthetic": "mooncake",
                   "azure": "azure", "azure_code": "azure", "sharegpt_multiturn": "sharegpt",
                   "sharegpt_multiturn_qwen3": "sharegpt", "arxiv": "arxiv"}


@pytest.mark.parametrize("name", sorted(p.stem for p in CONF_DIR.glob("*.yaml")))
def test_every_config_instantiates(name: str, traces: dict[str, Path]) -> None:
    overrides: dict[str, object] = {"num_requests": 3}
    if name in TRACE_OF_CONFIG:
        overrides["path"] = str(traces[TRACE_OF_CONFIG[name]])
    workload = _compose(name, **overrides)
    specs = workload.requests()
    check_contract(specs)
    assert len(specs) == 3


def test_config_names_follow_their_classes() -> None:
    for name in ("shared_prefix", "mooncake", "azure", "sharegpt_multiturn"):
        target = OmegaConf.load(CONF_DIR / f"{name}.yaml")["_target_"]
        assert target.split(".")[-2] == name
    assert OmegaConf.load(CONF_DIR / "shared_prefix.yaml")["request_rate"] == math.inf


# -- real files (skipped where ../shared/data is absent) ---------------------------------------
needs_data = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"{SHARED_DATA} not present")


@needs_data
@pytest.mark.parametrize("name", sorted(TRACE_OF_CONFIG))
def test_real_trace_default_paths_load(name: str) -> None:
    specs = _compose(name, num_requests=40).requests()  # the path written in the YAML
    check_contract(specs)
    assert len(specs) == 40


@needs_data
def test_real_mooncake_files_validate_and_share_blocks() -> None:
    for stem, num_rows in (("conversation_trace", 12_031), ("synthetic_trace", 3_993)):
        assert len(read_mooncake_rows(SHARED_DATA / "mooncake" / f"{stem}.jsonl", 512)) == num_rows
    rows = read_mooncake_rows(SHARED_DATA / "mooncake" / "conversation_trace.jsonl", 512)[:60]
    specs = MooncakeWorkload(vocab_size=102_400, num_requests=60).requests()
    by_rid = {s.rid: s for s in specs}
    for i in range(0, 60, 7):
        for j in range(i + 1, 60, 5):
            k = _lcp(tuple(rows[i].hash_ids), tuple(rows[j].hash_ids))
            a, b = by_rid[f"mooncake-{i:06d}"].input_ids, by_rid[f"mooncake-{j:06d}"].input_ids
            shared = min(512 * k, len(a), len(b))
            assert a[:shared] == b[:shared]
            if k < min(len(rows[i].hash_ids), len(rows[j].hash_ids)):
                assert a[:512 * (k + 1)] != b[:512 * (k + 1)]


@needs_data
def test_real_azure_and_sharegpt_files_load() -> None:
    for service, num_rows in (("code", 8_819), ("conv", 19_366)):
        stamps_ns, _, _ = read_azure_rows(SHARED_DATA / "azure_llm_2023" / f"AzureLLMInferenceTrace_{service}.csv")
        assert len(stamps_ns) == num_rows and (np.diff(stamps_ns) >= 0).all()
    specs = ShareGPTMultiturnWorkload(vocab_size=102_400).requests()
    assert len(specs) == 300 and all(len(s.expected_output_ids) == s.output_len for s in specs)


# -- token synthesis -------------------------------------------------------------------------
def test_block_windows_are_distinct_for_every_hash_id() -> None:
    synth = BlockTokenSynthesizer(vocab_size=VOCAB, block_size_tokens=16, seed=0, max_hash_id=200_000)
    offsets = synth.offsets(np.arange(200_001))
    assert len(np.unique(offsets)) == 200_001 and offsets.min() >= 0 and offsets.max() < synth.num_windows


def test_random_prompts_beyond_the_vocabulary() -> None:
    prompts = random_prompts(np.random.default_rng(0), [5] * 30, vocab_size=10)
    assert len({p[0] for p in prompts[:10]}) == 10
    assert all(len(p) == 5 and all(0 <= t < 10 for t in p) for p in prompts)
    assert prompts[:7] == random_prompts(np.random.default_rng(0), [5] * 7, vocab_size=10)
