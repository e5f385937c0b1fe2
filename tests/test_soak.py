"""benchmarks/soak.py's checks, so that the soak CI runs can fail: a greedy reply unlike its solo
reply is a mismatch, a bad body gets its 4xx, and a 5xx is counted as one.

Truth: the solo replies the soak records from the same server, one request at a time; a reply
changed by one character must then be caught.
"""

from __future__ import annotations

import time

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

from benchmarks import soak
from mnngpu.apps.server.app import create_app
from mnngpu.apps.server.engine import ServedModel
from tests.reference_model import load_model
from tests.serving import running


@pytest.fixture(scope="module")
def server():
    with running(create_app(ServedModel(load_model(), "fixture-model", parallel=2))) as client:
        yield str(client.base_url)


def one_client(url: str, solo: dict) -> tuple[soak.Client, soak.Tally]:
    tally = soak.Tally()
    return soak.Client(0, url, solo, until=time.monotonic(), tally=tally), tally


def test_every_greedy_case_matches_its_solo_reply_and_a_changed_one_is_a_mismatch(server):
    import httpx

    solo = soak.record_solo(server)
    assert set(solo) == {name for name, _, _ in soak.greedy_cases()}
    assert all(len(texts) == (2 if name.startswith("n2-") else 1) for name, texts in solo.items())
    client, tally = one_client(server, solo)
    with httpx.Client(base_url=server, timeout=120) as http:
        for case in soak.greedy_cases():
            client.greedy(http, case)
        assert tally.counts["mismatch"] == 0 and tally.counts["5xx"] == 0, tally.failures
        assert sum(count for key, count in tally.counts.items() if key.startswith("ok:")) == len(solo)
        name = next(name for name, texts in solo.items() if texts[0])
        client.solo = {**solo, name: [solo[name][0][:-1], *solo[name][1:]]}
        client.greedy(http, next(case for case in soak.greedy_cases() if case[0] == name))
    assert tally.counts["mismatch"] == 1 and name in tally.failures[0]


def test_bad_bodies_get_a_4xx_and_a_5xx_is_counted(server):
    import httpx

    client, tally = one_client(server, {})
    with httpx.Client(base_url=server, timeout=120) as http:
        for body in soak.BAD_BODIES:
            client.bad(http, body)
        assert tally.counts == {"bad-body-4xx": len(soak.BAD_BODIES)}
        client._status("a 503", http.post("/v1/completions", json={"prompt": "hi", "max_queue": 1}))
        assert tally.counts["unexpected-status"] == 1   # a 400 where a 200 was due
        refused = httpx.Response(503, text="busy")
        client._status("a 503", refused)
    assert tally.counts["5xx"] == 1 and "503" in tally.failures[-1]
