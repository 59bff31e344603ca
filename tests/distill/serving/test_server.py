"""What an operator puts in front of users: an API key (401), CORS for browsers, a bound on queued requests (429
with ``Retry-After``) and several models picked by a request's ``model``; each an option of ``distill serve``."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from distill.core.config import parse_config
from distill.core.schema import InputError
from distill.serving.http_api import ServedModel, create_app
from distill.serving.options import HttpOptions
from distill.serving.reranker import Reranker
from distill.serving.server import ServeConfig, tokenizer_parallelism
from tests.distill.serving.test_http_api import running, serve_process
from tests.distill.serving.test_http_gate import address, post_head, read_answer

BODY = {"query": "what is a rhino", "texts": ["Rhinos are large.", "A flea is small."]}


@pytest.fixture(scope="module")
def tiny(tiny_bert: Path) -> Reranker:
    return Reranker.load(tiny_bert, backend="torch", interpolation=False)


def test_the_options_are_distill_serves() -> None:
    config = ServeConfig(model="m", api_key="k", cors_allow_origin=["https://a.example"], max_queued_requests=3)
    assert (config.options.api_key, config.options.cors_allow_origin, config.options.max_queued_requests) == (
        "k",
        ["https://a.example"],
        3,
    )
    with pytest.raises(InputError, match="serve: max_queued_requests must be positive, got 0"):
        HttpOptions(max_queued_requests=0)
    with pytest.raises(InputError, match="serve: api_key is empty"):
        HttpOptions(api_key=" ")
    for origin in ("app.example.com", "https://app.example.com/", "https://app.example.com/path", "ftp://a.example"):
        with pytest.raises(InputError, match=f"serve: cors_allow_origin '{origin}' is not an origin"):
            HttpOptions(cors_allow_origin=[origin])
    assert HttpOptions(cors_allow_origin=["*", "http://localhost:3000"]).cors_allow_origin[1] == "http://localhost:3000"


def test_a_key_variable_set_but_empty_is_refused_not_taken_for_no_authentication(monkeypatch) -> None:
    monkeypatch.setenv("CIS_DISTILL_API_KEY", " ")
    with pytest.raises(InputError, match=r"serve: \$CIS_DISTILL_API_KEY is set but empty"):
        HttpOptions()
    assert HttpOptions(api_key="k").api_key == "k"  # the option wins over the variable


def test_info_of_a_model_without_a_calibration_says_its_scores_are_the_plain_sigmoid(tiny_bert, tiny) -> None:
    with running(create_app(ServedModel(tiny_bert, tiny), HttpOptions())) as url:
        info = httpx.get(f"{url}/info").json()
    assert info["score_calibration"] is None
    assert info["scores"]["/v1/rerank"].startswith("relevance_score = the sigmoid of the raw score")


def test_a_missing_or_wrong_bearer_token_gets_a_401(tiny_bert: Path, tiny: Reranker) -> None:
    with running(create_app(ServedModel(tiny_bert, tiny), HttpOptions(api_key="s3cret"))) as url:
        missing = httpx.post(f"{url}/rerank", json=BODY)
        wrong = httpx.post(f"{url}/rerank", json=BODY, headers={"Authorization": "Bearer nope"})
        info = httpx.get(f"{url}/info")
        health = httpx.get(f"{url}/health")
        right = httpx.post(
            f"{url}/v1/rerank", json={"query": "q", "documents": ["a"]}, headers={"Authorization": "Bearer s3cret"}
        )
        info_ok = httpx.get(f"{url}/info", headers={"Authorization": "bearer s3cret"})
    for answer in (missing, wrong, info):
        assert answer.status_code == 401 and answer.headers["www-authenticate"] == "Bearer"
        assert "bearer token" in answer.json()["error"]
    assert health.status_code == 200 and right.status_code == 200 and info_ok.status_code == 200
    assert info_ok.json()["options"]["api_key"] == "set"  # never the key itself
    assert "s3cret" not in info_ok.text


def test_the_key_comes_from_the_environment_where_no_option_gives_it(tiny_bert, tiny, monkeypatch) -> None:
    monkeypatch.setenv("CIS_DISTILL_API_KEY", "from-env")
    with running(create_app(ServedModel(tiny_bert, tiny), HttpOptions())) as url:
        assert httpx.post(f"{url}/rerank", json=BODY).status_code == 401
        assert httpx.post(f"{url}/rerank", json=BODY, headers={"Authorization": "Bearer from-env"}).status_code == 200
    monkeypatch.delenv("CIS_DISTILL_API_KEY")
    with running(create_app(ServedModel(tiny_bert, tiny), HttpOptions())) as url:
        assert httpx.post(f"{url}/rerank", json=BODY).status_code == 200  # no key: no authentication


def test_a_key_read_from_a_file_is_the_key_without_its_line_end(tiny_bert, tiny, monkeypatch) -> None:
    """A secret mounted as a file ends in a newline: kept, no token matched it, and every request got a 401."""
    monkeypatch.setenv("CIS_DISTILL_API_KEY", "from-file\n")
    for options in (HttpOptions(), HttpOptions(api_key=" s3cret\n")):
        key = options.api_key.strip() if options.api_key else "from-file"
        with running(create_app(ServedModel(tiny_bert, tiny), options)) as url:
            right = httpx.post(f"{url}/rerank", json=BODY, headers={"Authorization": f"Bearer {key}"})
            wrong = httpx.post(f"{url}/rerank", json=BODY, headers={"Authorization": f"Bearer {key}x"})
        assert (right.status_code, wrong.status_code) == (200, 401)
    with pytest.raises(InputError, match="serve: api_key holds whitespace, which no bearer token can"):
        HttpOptions(api_key="two words")
    monkeypatch.setenv("CIS_DISTILL_API_KEY", "two\twords\n")
    with pytest.raises(InputError, match=r"serve: \$CIS_DISTILL_API_KEY holds whitespace"):
        HttpOptions()


def test_cors_preflights_are_answered_for_the_allowed_origins(tiny_bert: Path, tiny: Reranker) -> None:
    # with the headers Cohere's SDK adds (a preflight that named them got a 400)
    asked = "authorization, content-type, x-client-name, x-fern-language"
    preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": asked}  # fmt: skip
    for key in (None, "k"):  # a preflight carries no key: a 405 with a key as without (it got a 401)
        with running(create_app(ServedModel(tiny_bert, tiny), HttpOptions(api_key=key))) as url:
            assert httpx.options(f"{url}/rerank", headers=preflight).status_code == 405
    options = HttpOptions(cors_allow_origin=["https://app.example"], api_key="k")
    with running(create_app(ServedModel(tiny_bert, tiny), options)) as url:
        allowed = httpx.options(f"{url}/rerank", headers=preflight)
        other = httpx.options(f"{url}/rerank", headers={**preflight, "Origin": "https://evil.example"})
        posted = httpx.post(
            f"{url}/rerank", json=BODY, headers={"Origin": "https://app.example", "Authorization": "Bearer k"}
        )
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == "https://app.example"
    allowed_headers = {h.strip() for h in allowed.headers["access-control-allow-headers"].lower().split(",")}
    assert {"authorization", "content-type", "x-client-name", "x-fern-language"} <= allowed_headers
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
    assert other.json() == {"error": "CORS preflight refused: Disallowed CORS origin", "error_type": "validation"}
    assert posted.status_code == 200 and posted.headers["access-control-allow-origin"] == "https://app.example"
    exposed = {h.strip() for h in posted.headers["access-control-expose-headers"].split(",")}
    assert {"retry-after", "x-total-time", "x-queue-time", "x-inference-time"} <= exposed
    assert {h for h in posted.headers if h.startswith("x-")} <= exposed  # a browser may read every timing header


def test_past_the_queue_bound_a_request_gets_a_429_with_retry_after(tiny_bert: Path, tiny: Reranker) -> None:
    body = json.dumps(BODY).encode()
    with running(create_app(ServedModel(tiny_bert, tiny), HttpOptions(max_queued_requests=2))) as url:
        host, port = address(url)
        held = [socket.create_connection((host, port), timeout=10) for _ in range(2)]
        try:
            for sock in held:  # admitted, their bodies not yet sent: two requests queued
                sock.sendall(post_head(host, "/rerank", len(body)) + body[:5])
            busy = httpx.post(f"{url}/rerank", json=BODY)
            health = httpx.get(f"{url}/health")
            for sock in held:
                sock.sendall(body[5:])
                assert read_answer(sock)[0] == 200
        finally:
            for sock in held:
                sock.close()
        after = httpx.post(f"{url}/rerank", json=BODY)
    assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
    assert busy.headers["connection"] == "close"  # refused unread: the body's bytes would come next on it
    assert "max_queued_requests" in busy.json()["error"]
    assert health.status_code == 200 and after.status_code == 200


def test_tei_parity_empty_texts_error_type_and_truncation_direction(spread_bert: Path) -> None:
    tiny = Reranker.load(spread_bert, backend="torch", interpolation=False)  # scores that tell the two cuts apart
    text = " ".join(f"w{i}" for i in range(600))  # far over the tiny model's pair length
    with running(create_app(ServedModel(spread_bert, tiny), HttpOptions())) as url:
        empty = httpx.post(f"{url}/rerank", json={"query": "q", "texts": []})
        too_long = httpx.post(f"{url}/rerank", json={"query": "q", "texts": [text]})
        scored = {}
        for direction in ("Right", "Left", "left"):
            body = {"query": "q", "texts": [text], "truncate": True, "truncation_direction": direction}
            scored[direction] = httpx.post(f"{url}/rerank", json={**body, "raw_scores": True}).json()[0]["score"]
    assert empty.status_code == 413
    assert empty.json() == {"error": "texts: empty: send at least one text (as TEI)", "error_type": "validation"}
    assert too_long.status_code == 413 and too_long.json()["error_type"] == "validation"
    room = tiny.max_length - tiny.tokenizer.num_special_tokens_to_add(pair=True) - 1  # "q" is one token
    offsets = tiny.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    end = text[offsets[-room][0] :]  # the text of its last tokens: what a left cut keeps
    assert scored["Left"] == scored["left"] == pytest.approx(tiny.score("q", [end])[0], abs=2e-6)
    assert scored["Right"] == pytest.approx(tiny.score("q", [text])[0], abs=2e-6)  # Reranker keeps the start
    assert abs(scored["Left"] - scored["Right"]) > 50 * 2e-6  # the two cuts score apart, beyond the tolerance


def test_answers_carry_tei_timing_headers_and_health_reports_the_backend(tiny_bert: Path, tiny: Reranker) -> None:
    with running(create_app(ServedModel(tiny_bert, tiny), HttpOptions(max_queued_requests=7))) as url:
        answers = [
            httpx.post(f"{url}/rerank", json=BODY),
            httpx.post(f"{url}/v1/rerank", json={"query": "q", "documents": BODY["texts"]}),
        ]
        health = httpx.get(f"{url}/health").json()
    for answer in answers:
        times = {k: int(answer.headers[f"x-{k}-time"]) for k in ("total", "tokenization", "queue", "inference")}
        assert all(v >= 0 for v in times.values())
        assert times["total"] + 1 >= times["tokenization"] + times["queue"] + times["inference"] - 2
        assert int(answer.headers["x-compute-tokens"]) > 0
    assert health == {
        "status": "ok",
        "backend": tiny.backend,
        "device": "cpu",
        "models": {tiny_bert.name: {"backend": tiny.backend, "device": "cpu"}},
        "queued_requests": 0,
        "max_queued_requests": 7,
    }


def test_several_models_are_picked_by_the_requests_model_field(tiny_bert: Path, spread_bert: Path) -> None:
    tiny = Reranker.load(tiny_bert, backend="torch", interpolation=False)
    spread = Reranker.load(spread_bert, backend="torch", interpolation=False)
    models = [ServedModel(tiny_bert, tiny, name="tiny"), ServedModel(spread_bert, spread, name="spread")]
    query, texts = BODY["query"], BODY["texts"]
    with running(create_app(models, HttpOptions())) as url:
        tei = {
            name: httpx.post(f"{url}/rerank", json={**BODY, "raw_scores": True, "model": name})
            for name in ("tiny", "spread")
        }
        cohere = httpx.post(f"{url}/v2/rerank", json={"model": "spread", "query": query, "documents": texts,
                                                      "raw_scores": True})  # fmt: skip
        default = httpx.post(f"{url}/rerank", json={**BODY, "raw_scores": True})
        unknown = httpx.post(f"{url}/v1/rerank", json={"model": "rerank-v3.5", "query": query, "documents": texts})
        health = httpx.get(f"{url}/health").json()
        info = httpx.get(f"{url}/info", params={"model": "spread"}).json()
        info_unknown = httpx.get(f"{url}/info", params={"model": "nope"})
    for name, reranker in (("tiny", tiny), ("spread", spread)):
        scores = {r["index"]: r["score"] for r in tei[name].json()}
        assert scores == {i: pytest.approx(s, abs=2e-6) for i, s in enumerate(reranker.score(query, texts))}
    by_cohere = {r["index"]: r["relevance_score"] for r in cohere.json()["results"]}
    assert by_cohere == {i: pytest.approx(s, abs=2e-6) for i, s in enumerate(spread.score(query, texts))}
    assert [r["score"] for r in default.json()] == [r["score"] for r in tei["tiny"].json()]  # the first model
    assert unknown.status_code == 404 and info_unknown.status_code == 404
    assert unknown.json() == {
        "error": "model: 'rerank-v3.5' is not served here; the models are tiny, spread",
        "error_type": "validation",
    }
    assert set(health["models"]) == {"tiny", "spread"} and health["backend"] == tiny.backend
    assert info["model"] == str(spread_bert) and info["served_models"] == ["tiny", "spread"]


def test_one_model_takes_any_model_name_as_cohere_clients_send_their_own(tiny_bert: Path, tiny: Reranker) -> None:
    with running(create_app(ServedModel(tiny_bert, tiny, name="mine"), HttpOptions())) as url:
        answer = httpx.post(f"{url}/v1/rerank", json={"model": "rerank-english-v3.0", "query": "q", "documents": ["a"]})
    assert answer.status_code == 200


def test_two_models_may_not_share_a_name(tiny_bert: Path, tiny: Reranker) -> None:
    with pytest.raises(InputError, match="serve: two models are named 'a'; name each one: --model NAME=PATH"):
        create_app([ServedModel(tiny_bert, tiny, name="a"), ServedModel(tiny_bert, tiny, name="a")])


def test_serve_takes_model_name_path_once_per_model() -> None:
    config = parse_config(ServeConfig, ["--model", "a=out/x", "--model", "org/hub-id", "--model", "/srv/b=c"], "serve")
    assert config.models == [("a", "out/x"), ("org/hub-id", "org/hub-id"), ("b=c", "/srv/b=c")]
    assert ServeConfig(model="runs/out/export").models == [("export", "runs/out/export")]  # no org/name: a path
    with pytest.raises(InputError, match="serve: model: two models are named 'x'"):
        ServeConfig(model=["x=a", "x=b"])
    for entry in ("=out/x", "a="):
        with pytest.raises(InputError, match=f"^serve: model: '{entry}': NAME=PATH needs a name and a path"):
            ServeConfig(model=[entry])


def test_distill_serve_serves_two_named_exports(exported: Path) -> None:
    command = [sys.executable, "-m", "distill", "serve", "--model", f"first={exported}", "--model",
               f"second={exported}", "--backend", "onnx", "--port", "0"]  # fmt: skip
    with serve_process(command) as (_, url):
        second = httpx.post(f"{url}/rerank", json={**BODY, "model": "second"})
        unknown = httpx.post(f"{url}/rerank", json={**BODY, "model": "third"})
        health = httpx.get(f"{url}/health").json()
    assert second.status_code == 200 and unknown.status_code == 404
    assert health["models"] == {name: {"backend": "onnx-fp32", "device": "cpu"} for name in ("first", "second")}


def test_warm_up_runs_each_width_and_changes_nothing(tiny_bert: Path, call) -> None:
    reranker = Reranker.load(tiny_bert, backend="torch", interpolation=False, max_batch_tokens=2048)
    query, passages = call
    before = reranker.score(query, passages[:10])
    ran = reranker.warm_up()
    assert ran == len({min(2**k, reranker.max_length) for k in range(4, reranker.max_length.bit_length() + 1)})
    assert reranker.score(query, passages[:10]) == before and reranker.truncated == 0


def test_the_tokenizer_runs_in_parallel_only_where_every_model_scores_on_a_gpu(tiny: Reranker) -> None:
    """On a CPU the backend takes every core, so the server tokenises on one thread; on a GPU the host's cores are
    the tokenizer's."""
    assert tokenizer_parallelism([str(tiny.settings["device"])]) == "false"  # the torch backend here, on the CPU
    assert tokenizer_parallelism(["cuda:0"]) == tokenizer_parallelism(["cuda", "cuda:1"]) == "true"
    assert tokenizer_parallelism(["cuda:0", "cpu"]) == tokenizer_parallelism([]) == "false"


def test_the_servers_socket_refuses_connections_until_it_listens() -> None:
    from distill.serving.server import bind

    sock = bind("127.0.0.1", 0, listen=False)
    try:
        port = sock.getsockname()[1]
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.listen(8)
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    finally:
        sock.close()


def test_the_loaded_heap_is_frozen_so_that_full_collections_no_longer_scan_it() -> None:
    script = (
        "import gc, json, transformers, torch\n"
        "from distill.serving.server import freeze_loaded_heap\n"
        "before = len(gc.get_objects())\n"
        "frozen = freeze_loaded_heap()\n"
        "print(json.dumps([before, frozen, len(gc.get_objects())]))\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
    before, frozen, scanned = json.loads(run.stdout)
    assert before > 10_000  # torch's and transformers' objects
    assert frozen >= 0.9 * before
    assert scanned < 0.01 * before  # what a full collection still scans
