"""The stand-in server's generation endpoints, as SGLang 0.5.9 and 0.5.23 answer them.  STDLIB ONLY.

Installed beside the stand-in (``/opt/provision-standin/standin_generate.py`` on a sandbox host;
standin.py imports it, and answers as before without it). What it reproduces:

* ``POST /generate``, streaming (``"stream": true``: ``text/event-stream``, chunked, one
  ``data: {json}`` event per decode step, then ``data: [DONE]``) or not. ``text`` is cumulative,
  ``meta_info.completion_tokens`` counts the tokens so far. The **final** event (or the whole
  answer) carries the speculative fields only when the server runs ``--speculative-algorithm``:
  both releases ``spec_verify_ct``, ``spec_accept_length`` (= completion_tokens / spec_verify_ct)
  and ``spec_accept_rate``; 0.5.9 ``spec_accept_token_num``/``spec_draft_token_num``, 0.5.23
  ``spec_num_correct_drafts``/``spec_num_proposed_drafts`` (tokenizer_manager.py's
  ``_calculate_spec_decoding_metrics``). The release is the installed one
  (``PROVISION_STANDIN_LOG_FORMS`` overrides it).
* Timing: the first token after ``PROVISION_STANDIN_TTFT_SECONDS`` (default 0.05), then tokens
  at ``PROVISION_STANDIN_DECODE_TOK_S`` per second (default 96.2 with EAGLE3, else 54.0: the
  field's Kimi-K2.5 figures; ``0.5.9=96.2,0.5.10=40``: per installed release), emitted per verify step of ``PROVISION_STANDIN_ACCEPT_LENGTH``
  tokens (default 3.1 with a drafter, else 1). Each step is scheduled on an absolute clock, so
  the stand-in's own overhead does not slow the rate a client measures.
* ``POST /flush_cache``: 200 ``Cache flushed...`` when idle, 400 while a generation is running
  (as the scheduler refuses it), always 400 with ``PROVISION_STANDIN_BUSY=1`` (outside traffic).
* ``/server_info``'s ``internal_states[0].avg_spec_accept_length``: completion tokens over verify
  steps since the last flush (None without speculative decoding), ``last_gen_throughput``.
* Faults for bad-input tests, ``PROVISION_STANDIN_STREAM_FAULT``: ``cut`` (the connection closes
  half way, no ``[DONE]``), ``non-json`` (an event that is not JSON), ``no-spec-fields`` (an
  older release: speculative decoding on, no spec fields in ``meta_info``).
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid


def _env_float(name: str, default: float, release: str | None = None) -> float:
    """A number from the environment; "0.5.9=96.2,0.5.10=40" gives one per installed release (an
    upgrade's test: the same recorded launch, another speed on the new release)."""
    text = os.environ.get(name, "") or ""
    if "=" in text:
        per = dict(part.split("=", 1) for part in text.split(",") if "=" in part)
        text = per.get(release or "", "")
    try:
        return float(text or default)
    except ValueError:
        return default


def _vt(text: str) -> tuple:
    out = []
    for part in str(text).split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


class Generator:
    """Generation for one stand-in server (shared by its handler threads)."""

    def __init__(self, version: str, spec_alg: str | None, has_draft: bool, num_draft_tokens=None):
        self.release = _vt(os.environ.get("PROVISION_STANDIN_LOG_FORMS") or version or "0.5.9")
        self.spec_on = bool(spec_alg)
        default_rate = 96.2 if spec_alg == "EAGLE3" else 54.0
        self.tok_s = max(_env_float("PROVISION_STANDIN_DECODE_TOK_S", default_rate, version), 0.1)
        self.accept_len = max(_env_float("PROVISION_STANDIN_ACCEPT_LENGTH", 3.10 if has_draft else 1.0), 1.0)
        if not self.spec_on:
            self.accept_len = 1.0
        self.ttft = max(_env_float("PROVISION_STANDIN_TTFT_SECONDS", 0.05), 0.0)
        self.draft_tokens = int(num_draft_tokens or 4)
        self.busy_env = os.environ.get("PROVISION_STANDIN_BUSY", "") == "1"
        self.fault = (os.environ.get("PROVISION_STANDIN_STREAM_FAULT") or "").strip()
        self.lock = threading.Lock()
        self.running = 0
        self.since_flush_tokens = 0
        self.since_flush_verify = 0
        self._active = threading.local()  # per request thread: has it ended (see _end)

    # ----------------------------------------------------------------- figures

    def steps(self, n: int) -> list[int]:
        """Tokens per step after the first token: verify steps of about accept_len tokens."""
        rest = max(n - 1, 0)
        if rest == 0:
            return []
        k = max(1, round(rest / self.accept_len))
        base, extra = divmod(rest, k)
        return [base + (1 if i < extra else 0) for i in range(k)]

    def spec_meta(self, n: int, verify_ct: int) -> dict:
        if not self.spec_on or self.fault == "no-spec-fields":
            return {}
        accepted = max(n - verify_ct, 0)
        proposed = verify_ct * max(self.draft_tokens - 1, 1)
        rate = round(accepted / proposed, 4) if proposed else 0.0
        meta = {"spec_verify_ct": verify_ct, "spec_accept_length": round(n / verify_ct, 4) if verify_ct else 0.0,
                "spec_accept_rate": rate}
        if self.release >= (0, 5, 23):
            meta.update({"spec_num_correct_drafts": accepted, "spec_num_proposed_drafts": proposed})
        else:
            meta.update({"spec_accept_token_num": accepted, "spec_draft_token_num": proposed,
                         "spec_accept_histogram": []})
        return meta

    def server_states(self) -> list[dict]:
        with self.lock:
            avg = (self.since_flush_tokens / self.since_flush_verify) if self.since_flush_verify else None
        return [{"avg_spec_accept_length": round(avg, 4) if (avg is not None and self.spec_on) else None,
                 "last_gen_throughput": self.tok_s, "memory_usage": {}}]

    # ----------------------------------------------------------------- endpoints

    def flush(self, handler) -> None:
        with self.lock:
            busy = self.busy_env or self.running > 0
            if not busy:
                self.since_flush_tokens = self.since_flush_verify = 0
        if busy:
            return handler._send(400, b"Cache not flushed. Please check for pending requests.\n",
                                 ctype="text/plain")
        return handler._send(200, b"Cache flushed.\nPlease check backend logs for more details. (When there are "
                                  b"running or waiting requests, the operation will not be performed.)\n",
                             ctype="text/plain")

    def generate(self, handler, body: dict, log_step=None) -> None:
        sp = body.get("sampling_params") or {}
        try:
            n = max(1, int(sp.get("max_new_tokens") or 128))
        except (TypeError, ValueError):
            n = 128
        text = body.get("text") or ""
        prompt_tokens = max(1, len(str(text).split()) + 2)
        with self.lock:
            self.running += 1
        self._active.ended = False
        try:
            if body.get("stream"):
                self._stream(handler, n, prompt_tokens)
            else:
                self._whole(handler, n, prompt_tokens)
        finally:
            self._end()
        if log_step is not None:
            log_step(prompt_tokens, n)

    def _meta(self, rid: str, prompt_tokens: int, done: int, n: int, verify: int, start: float, final: bool) -> dict:
        meta = {"id": rid, "finish_reason": {"type": "length", "length": n} if final else None,
                "prompt_tokens": prompt_tokens, "weight_version": "default", "completion_tokens": done,
                "cached_tokens": 0, "e2e_latency": round(time.monotonic() - start, 4)}
        if final:
            meta.update(self.spec_meta(n, verify))
        return meta

    @staticmethod
    def _words(k: int) -> str:
        return " ".join(("The quick brown fox jumps over the lazy dog " * (k // 9 + 1)).split()[:k])

    def _count(self, n: int, verify: int) -> None:
        with self.lock:
            self.since_flush_tokens += n
            self.since_flush_verify += verify

    def _end(self) -> None:
        """This thread's request is no longer running (once): before its last bytes are sent, as
        SGLang's scheduler has finished a request before the client reads its end, so a /flush_cache
        right after a stream is not refused for it."""
        if not getattr(self._active, "ended", True):
            self._active.ended = True
            with self.lock:
                self.running -= 1

    def _whole(self, handler, n: int, prompt_tokens: int) -> None:
        start = time.monotonic()
        steps = self.steps(n)
        verify = len(steps) if self.spec_on else 0
        # a non-streaming answer takes as long as the stream would
        time.sleep(min(self.ttft + (n - 1) / self.tok_s, 600))
        self._count(n, max(verify, 0))
        self._end()
        meta = self._meta(uuid.uuid4().hex, prompt_tokens, n, n, max(verify, 1), start, True)
        handler._json(200, {"text": self._words(n), "meta_info": meta})

    def _stream(self, handler, n: int, prompt_tokens: int) -> None:
        start = time.monotonic()
        rid = uuid.uuid4().hex
        handler.send_response(200)
        handler.send_header("content-type", "text/event-stream; charset=utf-8")
        handler.send_header("transfer-encoding", "chunked")
        handler.end_headers()
        w = handler.wfile

        def event(data: bytes) -> None:
            payload = b"data: " + data + b"\n\n"
            w.write(b"%x\r\n%s\r\n" % (len(payload), payload))
            w.flush()

        steps = self.steps(n)
        verify = max(len(steps), 1)
        try:
            time.sleep(self.ttft)
            t_first = time.monotonic()
            done = 1
            event(json.dumps({"text": self._words(1), "meta_info": self._meta(
                rid, prompt_tokens, 1, n, verify, start, n == 1)}).encode())
            for i, k in enumerate(steps):
                done += k
                target = t_first + (done - 1) / self.tok_s
                delay = target - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                if self.fault == "cut" and done > n // 2:
                    handler.close_connection = True
                    w.flush()
                    handler.connection.shutdown(2)
                    self._count(done, i)
                    return handler._access(200)
                if self.fault == "non-json" and i == len(steps) // 2:
                    event(b"<html>502 Bad Gateway</html>")
                final = i == len(steps) - 1
                event(json.dumps({"text": self._words(done), "meta_info": self._meta(
                    rid, prompt_tokens, done, n, verify, start, final)}).encode())
            # counted before the stream ends, as SGLang's scheduler has its figures before the last
            # event: a client that asks /server_info right after the stream sees this request in it
            self._count(n, verify if self.spec_on else 0)
            self._end()
            event(b"[DONE]")
            w.write(b"0\r\n\r\n")
            w.flush()
        except (BrokenPipeError, ConnectionResetError):
            handler.close_connection = True
            return None
        handler._access(200)
        return None


def make(launch) -> Generator:
    """The generator for a stand-in's parsed launch (standin.Launch)."""
    nd = getattr(launch.args, "speculative_num_draft_tokens", None)
    return Generator(launch.version, launch.spec_alg, launch.has_draft, nd)

