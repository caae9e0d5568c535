"""A client nobody here wrote, driven as its users drive it against a local OpenAI-compatible server: LangChain's
`ChatOpenAI` (langchain-openai) with `base_url` pointing at `ponder serve` — invoke, stream, batch, stop strings,
token usage and `reasoning_effort`. A real uvicorn server on 127.0.0.1 over the tiny random Qwen2."""
import os

import pytest

from app.engine_worker import EngineWorker
from app.server import LocalServer
from tests.core.test_fused_decode import w4_engine

langchain_openai = pytest.importorskip("langchain_openai")
os.environ.setdefault("LANGSMITH_TRACING", "false")  # nothing leaves the machine


@pytest.fixture(scope="module")
def url():
    worker = EngineWorker(w4_engine(), max_batch=4)
    server = LocalServer(worker, port=0)
    server.start()
    yield server.url
    server.stop()
    worker.shutdown()


def chat(url, **kw):
    return langchain_openai.ChatOpenAI(base_url=url, api_key="unused", model="tiny", max_retries=0, timeout=60, **kw)


def test_langchain_invoke_stream_and_batch(url):
    llm = chat(url, temperature=0, max_tokens=12)
    reply = llm.invoke([("system", "Be brief."), ("human", "What is 2+3?")])
    usage = reply.usage_metadata
    assert reply.content and 1 <= usage["output_tokens"] <= 12 and usage["input_tokens"] > 5
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    streamed = "".join(chunk.content for chunk in llm.stream([("system", "Be brief."), ("human", "What is 2+3?")]))
    assert streamed == reply.content
    answers = llm.batch(["hello", "What is 2+3?", "Name a colour."])  # concurrent requests: the server batches
    assert [a.content for a in answers][1] == chat(url, temperature=0, max_tokens=12).invoke("What is 2+3?").content


def test_langchain_stop_and_reasoning_effort(url):
    llm = chat(url, temperature=0, max_tokens=24, extra_body={"ignore_eos": True})
    text = llm.invoke("hello").content
    cut = llm.invoke("hello", stop=[text[4:7]]).content
    assert cut == text[: text.index(text[4:7])]
    # LangChain sends reasoning_effort to any model; one without a reasoning adapter answers directly
    direct = chat(url, temperature=0, max_tokens=8, reasoning_effort="low").invoke("What is 2+3?")
    assert direct.content == chat(url, temperature=0, max_tokens=8).invoke("What is 2+3?").content
