"""kev.Model against the `kev` CLI on the fixture release: same loader, same answers, bit for bit."""

from __future__ import annotations

import json
import subprocess
import threading
import time

import pytest

import kev
from conftest import BASE, INVALID, KEV, ROOT, VALID, cli_jsonl, kev_bin


def test_every_valid_fixture_equals_the_cli(model, valid_bodies, cli_valid):
    assert len(cli_valid) == len(valid_bodies) == len(VALID) > 50
    for path, body, line in zip(VALID, valid_bodies, cli_valid):
        expected = json.loads(line)
        assert "answers" in expected, f"{path.name}: the CLI refused it: {line}"
        # Bytes, text and the parsed dict (sent as a client would, json.dumps) all get the CLI's answer.
        assert model.decide(body) == expected, path.name
        assert model.decide(body.decode("utf-8")) == expected, path.name
        assert model.decide(json.loads(body)) == expected, path.name


def test_decide_jsonl_is_byte_equal_to_the_cli(model, valid_bodies, cli_valid):
    assert model.decide_jsonl(valid_bodies) == cli_valid


def test_decide_many_equals_the_cli(model, valid_bodies, cli_valid):
    got = model.decide_many([json.loads(b) for b in valid_bodies], progress=True)
    assert got == [json.loads(line) for line in cli_valid]


def test_the_wrong_model_is_caught(valid_bodies, cli_valid):
    """Negative control: the seed-2 release answers differently, and the comparison sees it."""
    wrong = ROOT / "fixtures" / "release-wrong"
    m = kev.Model(base=wrong / "base", kev=wrong / "kev", cache_bytes=0)
    got = m.decide_jsonl(valid_bodies)
    assert sum(a != b for a, b in zip(got, cli_valid)) > len(cli_valid) // 2


def test_own_thread_pool_and_no_cache_change_no_bit(valid_bodies, cli_valid):
    m = kev.Model(base=BASE, kev=KEV, cache_bytes=0, threads=1, pass_tokens=512)
    assert m.decide_jsonl(valid_bodies) == cli_valid
    assert m.stats["cache_hits"] == 0


def test_cache_hits_change_no_bit(model, valid_bodies, cli_valid):
    before = model.stats["cache_hits"]
    assert model.decide_jsonl(valid_bodies) == cli_valid
    assert model.stats["cache_hits"] > before


def test_refusals_carry_the_cli_status_and_body(model, tmp_path):
    assert len(INVALID) > 20
    bodies = [p.read_bytes() for p in INVALID]
    # --jsonl takes every body but the empty one (a blank line is skipped); that one goes through --request.
    as_lines = [i for i, b in enumerate(bodies) if b.strip() and b"\n" not in b.rstrip(b"\n")]
    cli = dict(zip(as_lines, cli_jsonl([bodies[i].rstrip(b"\n").decode() for i in as_lines], tmp_path)))
    for i, path in enumerate(INVALID):
        if i in cli:
            continue
        out = subprocess.run(
            [str(kev_bin()), "decide", "--base", str(BASE), "--kev", str(KEV), "--request", str(path)],
            capture_output=True,
        )
        assert out.returncode == 2, (path.name, out.stderr[-500:])
        cli[i] = out.stdout.decode().strip()
    lines = [cli[i] for i in range(len(INVALID))]
    for path, body, line in zip(INVALID, bodies, lines):
        expected = json.loads(line)
        reference = json.loads((ROOT / "fixtures" / "expected" / "invalid" / path.name).read_text())
        assert expected == reference, path.name
        with pytest.raises(kev.ContractError) as e:
            model.decide(body)
        assert (e.value.status, e.value.body) == (expected["status"], expected["body"]), path.name
        assert isinstance(e.value, ValueError) and str(e.value).startswith(str(expected["status"]))
    # Inline in a batch, as `kev decide --jsonl` writes them.
    assert model.decide_jsonl(bodies) == lines
    assert model.decide_many(bodies) == [json.loads(line) for line in lines]
    with pytest.raises(kev.ContractError):
        model.decide_many([VALID[0].read_bytes(), bodies[0]], errors="raise")


def test_a_mixed_batch_keeps_order(model, valid_bodies, cli_valid, tmp_path):
    mixed = [valid_bodies[0], b"{", valid_bodies[1], b"[]", valid_bodies[2]]
    assert model.decide_jsonl(mixed) == cli_jsonl([b.decode() for b in mixed], tmp_path)


def test_rows_equal_kev_rows(model):
    for path in VALID[:3]:
        out = subprocess.run(
            [str(kev_bin()), "rows", "--tokenizer", str(KEV / "tokenizer.json"), "--request", str(path)],
            capture_output=True,
            check=True,
        )
        assert model.rows(path.read_bytes()) == json.loads(out.stdout), path.name
    with pytest.raises(kev.ContractError) as e:
        model.rows("{")
    assert e.value.status == 422


def test_info_is_the_models_card(model):
    card = model.info
    assert card["name"] == "kev-latest"
    assert card["x_weights"] == "merged" and card["x_device"] == "cpu"
    assert card["x_precision"] in ("fp32", "bf16")
    assert card["x_pass_tokens"] == 4096 and card["x_max_state_tokens"] > 0
    assert isinstance(card["description"], str) and card["release_date"].count("-") == 2
    fp32 = kev.Model(base=BASE, kev=KEV, precision="fp32", weights="exact", cache_bytes=1 << 20)
    assert (fp32.info["x_precision"], fp32.info["x_weights"]) == ("fp32", "exact")
    assert fp32.info["x_prefix_cache"]["bytes"] == 1 << 20


def test_fp32_exact_equals_the_cli_with_the_same_flags(valid_bodies, tmp_path):
    m = kev.Model(base=BASE, kev=KEV, weights="exact", precision="fp32")
    lines = [b.decode() for b in valid_bodies[:10]]
    assert m.decide_jsonl(valid_bodies[:10]) == cli_jsonl(lines, tmp_path, "--weights", "exact", "--precision", "fp32")


def test_bad_arguments_are_clear_errors(model):
    with pytest.raises(ValueError, match="name a model"):
        kev.Model()
    with pytest.raises(ValueError, match="name a model"):
        kev.Model(base=BASE)
    with pytest.raises(ValueError, match="weight form"):
        kev.Model(base=BASE, kev=KEV, weights="bogus")
    with pytest.raises(ValueError, match="precision"):
        kev.Model(base=BASE, kev=KEV, precision="fp8")
    with pytest.raises(RuntimeError, match="loading"):
        kev.Model(model_dir=ROOT / "no-such-model")
    with pytest.raises(TypeError):
        model.decide(42)  # type: ignore[arg-type]


def test_a_published_release_is_served_from_its_prepared_copy(valid_bodies, tmp_path):
    """`release=` serves the copy `kev prepare` wrote into model_dir (found by its manifest, so no download), as
    `kev serve --release NAME --model-dir DIR` does; a name kev does not publish, or a release with other
    sources, is refused."""
    prepared = tmp_path / "kev-9b-v1.0"
    subprocess.run(
        [str(kev_bin()), "prepare", "--kev", str(KEV), "--base", str(BASE), "--out", str(prepared), "--quiet"],
        check=True,
        capture_output=True,
    )
    m = kev.Model(release="kev-9b", model_dir=prepared)
    assert m.decide_jsonl(valid_bodies[:3]) == kev.Model(model_dir=prepared).decide_jsonl(valid_bodies[:3])
    with pytest.raises(ValueError, match="kev-9b"):
        kev.Model(release="kev-27b", model_dir=prepared)
    with pytest.raises(ValueError, match="does not combine"):
        kev.Model(release="kev-9b", base=BASE, kev=KEV)


def test_decide_many_releases_the_gil(model, valid_bodies):
    """Another Python thread keeps running while a batch is inside the engine."""
    ticks = 0
    stop = threading.Event()

    def tick():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.001)

    cold = kev.Model(base=BASE, kev=KEV, cache_bytes=0)
    t = threading.Thread(target=tick)
    t.start()
    t0 = time.perf_counter()
    cold.decide_many(valid_bodies * 2)
    elapsed = time.perf_counter() - t0
    stop.set()
    t.join()
    if elapsed < 0.2:
        pytest.skip(f"skipped: the batch took {elapsed:.3f} s, too short to tell")
    # Holding the GIL for the whole batch would leave the ticker a handful of ticks at most.
    # (a free ticker manages about one tick a millisecond: ask for 2% of that).
    assert ticks > 0.02 * elapsed / 0.001, (ticks, elapsed)


def _serve(tmp_path, *extra: str):
    """`kev serve` on the fixture release with `extra` flags, ready; the process and its base URL."""
    import os
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEV_")}
    env["KEV_LOG"] = "warn"
    proc = subprocess.Popen(
        [str(kev_bin()), "serve", "--base", str(BASE), "--kev", str(KEV), "--port", str(port), *extra],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "serve.log", "wb"),
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url + "/ready", timeout=5) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("kev serve never became ready: " + (tmp_path / "serve.log").read_text()[-2000:])


def _post(url: str, body: bytes) -> bytes:
    import urllib.request

    req = urllib.request.Request(url + "/v1/systemone", data=body, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.status == 200
        return r.read()


def test_calibration_and_date_facts_give_the_bytes_kev_serve_gives(tmp_path, valid_bodies):
    """The service options are the library's: kev.Model and kev serve with the same options answer the same
    bytes (the server's answer less its x_latency_ms), and list the same card."""
    calibration = tmp_path / "calibration.json"
    calibration.write_text(
        json.dumps(
            {
                "kind": "kev-calibration",
                "by": "type",
                "global": 2.5,
                "temperatures": {"noul": 0.7, "choice": 3.1, "score": 1.3},
            }
        )
    )
    dated = json.dumps(
        {
            "state": {"ordered": "July 22, 2026", "delivered": "2026-08-03", "note": "The parcel came late."},
            "questions": {
                "late": {"type": "noul", "instructions": "Was it late?"},
                "team": {"type": "choice", "criteria": {"Shipping": "delivery", "Billing": None, "Sales": None}},
                "anger": {"type": "score", "criteria": ["calm", "annoyed", "angry"]},
            },
        }
    ).encode()
    bodies = [dated] + valid_bodies[:12]
    # The cache budget is given: by default each process chooses it from the memory it leaves free, and a
    # Python process holds more than kev serve.
    cache = str(256 << 20)
    model = kev.Model(base=BASE, kev=KEV, calibration=calibration, date_facts=True, cache_bytes=int(cache))
    proc, url = _serve(tmp_path, "--calibration", str(calibration), "--date-facts", "--cache-bytes", cache)
    try:
        served = [_post(url, b).decode() for b in bodies]
        import urllib.request

        with urllib.request.urlopen(url + "/v1/models", timeout=10) as r:
            card = json.loads(r.read())["models"][0]
    finally:
        proc.kill()
        proc.wait()
    for text in served:
        assert ',"x_latency_ms":' in text, text
    expected = [text[: text.rindex(',"x_latency_ms":')] + "}" for text in served]
    assert model.decide_jsonl(bodies) == expected
    assert model.info == card
    assert card["x_date_facts"] is True and card["x_calibration"]["by"] == "type"
    # Negative control: without the options the dated request reads another state and other temperatures.
    plain = kev.Model(base=BASE, kev=KEV)
    assert plain.decide_jsonl([dated]) != expected[:1]
    assert plain.info["x_date_facts"] is False and plain.info["x_calibration"] is None


def test_the_precision_error_is_the_librarys():
    with pytest.raises(ValueError, match=r"precision: unknown compute arm `fp8` \(fp32, bf16, int8\)"):
        kev.Model(base=BASE, kev=KEV, precision="fp8")


MINI = ROOT / "fixtures" / "mini"


def test_several_adapters_answer_as_their_own_models():
    adapters = {"kev": MINI / "kev", "support": MINI / "adapters" / "support", "ops": MINI / "adapters" / "ops"}
    many = kev.Model(base=MINI / "base", adapters=adapters, default_adapter="ops", strict_models=True,
                     weights="exact", precision="fp32")
    request = {"state": "Hello, the invoice for order #4380 charges me twice. I want my money back. - Sam",
               "questions": {"refund": {"type": "noul", "instructions": "Is a refund requested?"}}}
    answers = {}
    for name, d in adapters.items():
        alone = kev.Model(base=MINI / "base", kev=d, weights="exact", precision="fp32")
        got = many.decide({"model": name, **request})
        assert got["model"] == name
        assert got["answers"] == alone.decide(request)["answers"], name
        answers[name] = got["answers"]
    assert answers["support"] != answers["ops"]
    assert many.decide(request)["answers"] == answers["ops"], "the default adapter answers no model"
    with pytest.raises(kev.ContractError) as e:
        many.decide({"model": "nope", **request})
    assert e.value.status == 400 and e.value.body["detail"]["error_type"] == "api_usage_error"
    with pytest.raises(ValueError):
        kev.Model(base=MINI / "base", adapters=adapters, default_adapter="missing")
