"""Stop strings over streamed text: the emitted text is the full text cut before the first stop,
whatever the delta boundaries."""
from __future__ import annotations

import random

import pytest

from runtime.server.stop_strings import StopStringMatcher


def stream(stops, text: str, cuts: list[int], keep_stop: bool = False) -> tuple[str, str | None]:
    m = StopStringMatcher(stops, keep_stop)
    pieces, last = [], 0
    for cut in sorted(cuts) + [len(text)]:
        pieces.append(m.feed(text[last:cut]))
        last = cut
    pieces.append(m.flush())
    return "".join(pieces), m.matched


def reference(stops, text: str) -> tuple[str, str | None]:
    hits = [(text.find(s), s) for s in stops if s in text]
    if not hits:
        return text, None
    pos, s = min(hits, key=lambda h: (h[0], stops.index(h[1])))
    return text[:pos], s


@pytest.mark.parametrize("seed", range(40))
def test_any_split_gives_the_text_before_the_first_stop(seed):
    rng = random.Random(seed)
    alphabet = "ab\n#"
    text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
    stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))]
    cuts = [rng.randint(0, len(text)) for _ in range(rng.randint(0, 8))]
    assert stream(stops, text, cuts) == reference(stops, text)
    kept, matched = reference(stops, text)           # no_stop_trim: the stop string too
    assert stream(stops, text, cuts, keep_stop=True) == (kept + (matched or ""), matched)


def test_holds_back_a_possible_stop_then_releases_it():
    m = StopStringMatcher(["###"])
    assert m.feed("ab#") == "ab"
    assert m.feed("#") == ""
    assert m.feed("c") == "##c"
    assert m.feed("##") == ""
    assert m.flush() == "##" and m.matched is None


def test_nothing_after_a_match_and_empty_stops_are_refused():
    m = StopStringMatcher(["END"])
    assert m.feed("the END of it") == "the " and m.matched == "END"
    assert m.feed("more") == "" and m.flush() == ""
    with pytest.raises(ValueError):
        StopStringMatcher([""])
